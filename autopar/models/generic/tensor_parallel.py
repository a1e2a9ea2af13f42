"""Tensor parallelism for a generic decoder (a user's ``FILE.py:FACTORY``): which of its
blocks' linears split, and its code rewritten to run on a rank's shard.

A user's attention reads its heads with the model's own sizes: ``c_attn(x).split(c, dim=2)``
with ``c`` the hidden width, ``view(b, t, n_head, c // n_head)``, ``reshape(b, t, c)``. Under a
column split a rank holds ``1 / tp`` of those features, so the same code would cut its shard
at the wrong places. autopar reads the code instead of asking for ``-1``:

1. **The regions.** Every module of block 0 that holds ``nn.Linear`` children (attention,
   MLP) is a region. The model's forward runs once on fake tensors (``FakeTensorMode``: no
   memory, no compute) to capture each region's call, and the region is traced with
   ``torch.fx`` for that call (``module_graph.trace_module``) with the values of every node
   recorded: the sizes the code computes and the shapes of its tensors.
2. **The propagation** (``feature_split.propagate``): from the column-split linears' outputs,
   forward in the graph, each tensor's split dimension and the count of units the ranks share
   there (the features of a linear, the heads after a ``view``). Each op has its rule:
   element-wise ops and norms over other dimensions keep it; ``transpose``/``permute`` move it;
   a ``view`` or ``reshape`` maps it through the shapes (the split dimension must lead its
   group, and tp must divide the dimension it lands on: the heads); ``split``/``chunk`` along it
   right at a linear's output make that linear *fused* (``c_attn``: q, k and v in one weight),
   whose weight each rank holds as its part of every section (``_StridedShard``, ``sections``);
   ``scaled_dot_product_attention`` and batched ``matmul`` run per head; a linear reading it
   along its input features is a row split and ends it. Anything else reading a split tensor --
   a norm over the split dimension, an index into it, its size read back, the region's output --
   stops the propagation with the reason.
3. **Discovery** (``discover``): every linear is first taken as a column split; those whose
   propagation fails are dropped, until what is left runs. What it finds gives the facts the
   admissibility check reads (the heads, ``ModelFacts.num_heads``); a plan's own splits are
   checked by the same propagation (``ModelLayout.problem``, from ``check_plan``).
4. **The rewrite** (``rewrite``): for the plan's column splits, every size argument that lands
   on a split dimension -- ``view``/``reshape`` sizes, ``split`` sizes -- is divided by tp in
   a copy of the graph (a literal at trace time, a ``floordiv`` node where the code computes
   it; a ``-1`` stays), and the region's forward becomes that graph's code, so hooks on the
   module (the plan's ``PrepareBlockInput``, FSDP, checkpointing) still run around it.
"""

from __future__ import annotations

import gc
import operator
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.fx import GraphModule, Node

from autopar.core.errors import AutoparError
from autopar.core.layout import Style
from autopar.models.blocks import block_span
from autopar.models.generic.feature_split import (
    VALUE,
    Region,
    RegionLayout,
    Unmappable,
    propagate,
)
from autopar.models.generic.module_graph import call_values, failure, trace_module


# ---- 1. the regions of block 0, traced with their values --------------------------------------
class _Stop(Exception):
    pass


class _Record(torch.fx.Interpreter):
    def run_node(self, n: Node) -> Any:
        out = super().run_node(n)
        n.meta[VALUE] = out
        return out


def regions(model: nn.Module, blocks: str, seq_len: int) -> dict[str, Region] | str:
    """The regions of ``model``'s first block (``blocks``: the block list's path), or why they
    cannot be read: the model's forward is run on fake tokens of ``seq_len`` to capture them."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    block = model.get_submodule(blocks)[block_span(model, blocks).lead]  # the first block
    holders = {name: m for name, m in block.named_modules()
               if name and any(isinstance(c, nn.Linear) for c in m.children())}
    holders = {n: m for n, m in holders.items()
               if not any(n.startswith(o + ".") for o in holders if o != n)}
    if not holders:
        return "its blocks hold no module of nn.Linear layers (an attention, an MLP) to split"
    calls: dict[str, tuple[tuple, dict]] = {}
    hooks = [m.register_forward_pre_hook(
        lambda mod, args, kwargs, name=name: calls.setdefault(name, (args, kwargs)),
        with_kwargs=True) for name, m in holders.items()]

    def stop(*_: object) -> None:
        raise _Stop

    hooks.append(block.register_forward_hook(stop))
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    found: dict[str, Region] = {}
    try:
        with mode:
            try:
                model(torch.zeros(2, seq_len, dtype=torch.long, device=device))
            except _Stop:
                pass
            for name, module in holders.items():
                if name not in calls:
                    return f"its block does not call {name}"
                args, kwargs = calls[name]
                if not args:
                    return f"its block calls {name} with its input by keyword"
                graph = trace_module(module, args[1:], kwargs)
                gm = GraphModule(module, graph)
                _Record(gm).run(*call_values(module, args, kwargs))
                linears = tuple(str(n.target) for n in graph.nodes if n.op == "call_module"
                                and isinstance(module.get_submodule(str(n.target)), nn.Linear))
                found[name] = Region(name, gm, linears)
    except Exception as err:  # noqa: BLE001 - any failure of the fake run is the reason given
        return (f"its attention and MLP could not be traced on fake tensors to find how they "
                f"read their features ({failure(err)})")
    finally:
        for h in hooks:
            h.remove()
        # the fake mode holds weak references to the model's parameters, which would stop
        # to_empty/_apply from swapping them later: let it go now
        calls.clear()
        del mode
    for region in found.values():
        _to_meta(region.graph)
    gc.collect()
    return found


def _to_meta(gm: GraphModule) -> None:
    """The recorded fake tensors as meta tensors of the same shapes (no reference kept to the
    fake mode)."""
    def meta(v: object) -> object:
        if isinstance(v, torch.Tensor):
            return torch.empty(tuple(v.shape), dtype=v.dtype, device="meta")
        return v

    for node in gm.graph.nodes:
        if VALUE in node.meta:
            node.meta[VALUE] = torch.fx.node.map_aggregate(node.meta[VALUE], meta)


_META_READS = frozenset({"shape", "size", "dtype", "device", "ndim", "dim"})


def input_problem(region: Region, columns: frozenset[str]) -> str | None:
    """Why the engine cannot hand ``region`` its input as it runs a split region: one
    replicated DTensor (``passes/tensor_parallel.PrepareBlockInput``) that the column-split
    linears read together. Anything else reading it -- a norm, a residual add: a region that is
    the whole block (its q/k/v projections directly in it) -- would meet a DTensor its plain
    weights cannot be mixed with; reading its shape is fine. ``None`` where only those read it."""
    inputs = [n for n in region.graph.graph.nodes if n.op == "placeholder"]
    if not inputs:
        return None
    for user in inputs[0].users:
        if user.op == "call_module" and str(user.target) in columns:
            continue
        if user.op == "call_function" and user.target is getattr and \
                user.args[1] in _META_READS:
            continue
        if user.op == "call_method" and user.target in _META_READS:
            continue
        what = (str(user.target) if user.op in ("call_module", "call_method")
                else getattr(user.target, "__name__", str(user.target)))
        return (f"{region.path or 'the block'} reads its input by {what} besides its column-"
                "split linears (a norm or a residual add of the whole block: its q/k/v "
                "projections are the block's own), which the engine does not run on the "
                "replicated input it gives a split region; put the attention and the MLP in "
                "modules of their own")
    return None


def discover(region: Region) -> RegionLayout | str:
    """The largest set of ``region``'s linears splittable by columns (see the module
    docstring), or why none is."""
    columns = frozenset(region.linears)
    last = None
    while columns:
        try:
            layout = propagate(region, columns, discovering=True)
        except Unmappable as err:
            last = last or err.what  # the first reason: what stopped the first split
            dropped = err.origins & columns
            columns = columns - (dropped or columns)
            continue
        if layout.columns:
            return input_problem(region, frozenset(layout.columns)) or layout
        break
    return last or f"{region.path} splits no linear by columns and another by rows"


# ---- 4. the rewrite ---------------------------------------------------------------------------
def rewrite(region: Region, layout: RegionLayout, tp: int) -> Callable:
    """The forward of ``region`` on a rank's shards under ``tp`` (cached per layout and tp):
    the traced code with every size in ``layout.sites`` divided by ``tp``."""
    key = (tuple(sorted(layout.columns)), tp)
    known = region.rewritten.get(key)
    if known is not None:
        return known
    graph = torch.fx.Graph()
    env: dict[Node, Node] = {}
    graph.output(graph.graph_copy(region.graph.graph, env))
    by_name = {n.name: n for n in graph.nodes}
    for site in layout.sites:
        node = by_name[site.node]
        value = node.args[site.arg] if isinstance(site.arg, int) else node.kwargs[site.arg]
        sizes = list(value) if site.item is not None else None
        size = sizes[site.item] if sizes is not None else value
        if isinstance(size, int):
            local = size // tp
        else:
            with graph.inserting_before(node):
                local = graph.call_function(operator.floordiv, (size, tp))
        if sizes is not None:
            sizes[site.item] = local
            local = type(value)(sizes)
        args = list(node.args)
        args[site.arg] = local  # type: ignore[index]
        node.args = tuple(args)
    gm = GraphModule(region.graph, graph)
    forward = type(gm).forward
    region.rewritten[key] = forward
    return forward


def install(module: nn.Module, forward: Callable) -> None:
    """Make ``forward`` (a rewritten graph's code) ``module``'s forward: its module call, and
    so every hook on it, stays."""
    module.forward = types.MethodType(forward, module)


# ---- the model's layout: what the admissibility check and the pass ask ----------------------
_SEQ_LEN = 8
"""Tokens of the fake run that captures the regions' calls (any length the model takes)."""


@dataclass
class ModelLayout:
    """A generic decoder's blocks under tensor parallelism: each region of block 0 (every block
    is the same) with its discovered layout."""

    blocks: str
    regions: dict[str, Region]
    found: dict[str, RegionLayout | str]

    @property
    def heads(self) -> tuple[int, int] | None:
        return next((lay.heads for lay in self.found.values()
                     if isinstance(lay, RegionLayout) and lay.heads is not None), None)

    def layout(self, region: Region, styles: Mapping[str, str], tp: int
               ) -> RegionLayout | str | None:
        """``region``'s layout under the plan's ``styles`` (module path in the block ->
        style), ``None`` where it splits nothing, or why it cannot run."""
        style = {n: styles.get(f"{region.path}.{n}") for n in region.linears}
        cols = frozenset(n for n, s in style.items() if s == Style.COLUMN)
        rows = frozenset(n for n, s in style.items() if s == Style.ROW)
        if not cols and not rows:
            return None
        try:
            lay = propagate(region, cols)
        except Unmappable as err:
            return err.what
        if set(lay.rows) != rows:
            return (f"{region.path}: the plan splits {', '.join(sorted(rows)) or 'nothing'} by "
                    f"rows, where its column splits reach {', '.join(lay.rows) or 'no linear'}")
        why = lay.problem(tp) or input_problem(region, cols)
        return f"{region.path}: {why}" if why else lay

    def problem(self, styles: Mapping[str, str], tp: int) -> str | None:
        """Why the plan's ``styles`` (module path in the block -> style) cannot run at ``tp``;
        ``None`` where they can. A linear split outside every region (the block's own q/k/v
        projections, called by the block's forward itself) is one: the rewrite reads regions
        only."""
        inside = [f"{r.path}." for r in self.regions.values()]
        for path, style in styles.items():
            if style in (Style.COLUMN, Style.ROW) and not any(path.startswith(p)
                                                              for p in inside):
                return (f"{path} is split by {style}s, but it is the block's own layer, in no "
                        "module of the block's (an attention, an MLP) whose code autopar reads "
                        "and rewrites for a rank's shard; put the attention and the MLP in "
                        "modules of their own")
        for region in self.regions.values():
            lay = self.layout(region, styles, tp)
            if isinstance(lay, str):
                return lay
        return None

    def apply(self, block: nn.Module, styles: Mapping[str, str], tp: int) -> dict[str, int]:
        """Rewrite ``block``'s regions to run on a rank's shards (``install``); returns the
        sections of each column split (path in the block -> 1, or 3 for a fused q, k, v)."""
        sections: dict[str, int] = {}
        for region in self.regions.values():
            lay = self.layout(region, styles, tp)
            if lay is None:
                continue
            if isinstance(lay, str):
                raise AutoparError(f"the plan's tensor-parallel splits cannot run: {lay}",
                                   where="plan.module_strategies", fix="re-plan this model")
            install(block.get_submodule(region.path), rewrite(region, lay, tp))
            sections.update({f"{region.path}.{c}": s for c, s in lay.columns.items()})
        return sections


def model_layout(model: nn.Module, blocks: str) -> ModelLayout | str:
    """``model``'s layout (regions traced on a fake run, each discovered), or why its blocks
    cannot be split by tensor parallelism at all."""
    found = regions(model, blocks, _SEQ_LEN)
    if isinstance(found, str):
        return found
    layouts = {name: discover(region) for name, region in found.items()}
    if not any(isinstance(lay, RegionLayout) for lay in layouts.values()):
        return "; ".join(str(lay) for lay in layouts.values())
    return ModelLayout(blocks, found, layouts)


__all__ = ["ModelLayout", "discover", "install", "model_layout", "regions", "rewrite"]
