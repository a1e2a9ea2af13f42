"""``apply_fusions(model, fusions)``: swap the Triton kernels of ``autopar.kernels`` into a model.

Runs in place, before the pipeline split and any sharding (``passes/program.py`` says why), on
the repeated blocks and the modules after them (final norm, head). Two kinds of rewrite:

* **Module swaps**, where the pattern is one module call: ``nn.RMSNorm`` and a family's own
  RMSNorm class (transformers' ``LlamaRMSNorm``, which ``Family.rms_norm`` of
  ``autopar/models/hf_llama/`` recognises) become ``FusedRMSNorm`` (``rms_norm``),
  ``nn.LayerNorm`` ``FusedLayerNorm`` (``layer_norm``), ``nn.GELU(approximate="tanh")``
  ``FusedGELU`` (``gelu``), and the head ``LinearCrossEntropyHead`` (``linear_cross_entropy``).
  A swapped module holds the *same* ``Parameter`` objects under the same names, so state-dict
  keys and tied weights are unchanged, and it stays a module: ``SequenceParallel`` is applied to
  a norm by its name as before.
* **torch.fx rewrites**, where the pattern is a few function calls: every module of a block is
  traced with ``torch.fx.symbolic_trace``'s machinery, its own children kept as leaves (so the
  attention and MLP modules, which the tensor-parallel styles hook by name, keep their
  boundaries; tracing the whole block would flatten them away), then ``swiglu``
  (``F.silu(gate) * up``, with an ``nn.SiLU`` or a family's own SiLU module, ``Family.is_silu``,
  turned into ``F.silu`` first) is rewritten by ``torch.fx.subgraph_rewriter.replace_pattern``,
  and ``rope`` (``x * cos + rotate_half(x) * sin``, rotate-half by ``chunk``) is found with fx's
  ``SubgraphMatcher`` and the matches on q and k that share ``cos``/``sin`` become one
  ``rope(q, k, cos, sin)`` call (a pairing ``replace_pattern`` cannot express). A module whose
  graph changed is replaced, in its parent, by its ``GraphModule``, which keeps the parameter
  names (checked).

What fx cannot trace keeps its eager code: a transformers ``LlamaAttention`` (it unpacks the
``position_embeddings`` tuple and dispatches attention on tensor shapes), so ``rope`` finds
nothing in a transformers Llama and is reported with a count of 0 there; its MLP traces
(``swiglu``) and its norms are module swaps.

Where the kernels get DTensors. Attention and the MLP run on local shards (plain tensors) under
tensor parallelism, so ``rope``, ``swiglu`` and ``gelu`` see plain tensors. A norm under
sequence parallelism gets a DTensor sharded on the sequence dim and a replicated weight:
``register_dtensor_rules`` gives DTensor the sharding rules of the norm ops (row-wise, so any
sharding of a leading dim carries through; the weight gradients of the backward ops are partial
sums, ``Partial()``, that DTensor reduces). ``linear_cross_entropy`` replaces head and loss: the
stage ends at the final hidden state and ``ParallelProgram.loss`` calls
``LinearCrossEntropyHead.loss``. With a vocabulary-split head (tp > 1) that would be a
vocabulary-parallel loss the kernel does not compute, so ``check_fusions`` refuses it there.
"""

from __future__ import annotations

import functools
import operator

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.fx.passes.utils.matcher_utils import SubgraphMatcher

from autopar import kernels
from autopar.core.errors import AutoparError
from autopar.core.specs import ENGINE_FUSIONS
from autopar.core.specs import check_fusions as check_specs_fusions
from autopar.models.family import Family
from autopar.models.parts import stage_info
from autopar.passes.model_parts import ModelParts, model_family

FUSIONS: tuple[str, ...] = kernels.KERNELS
"""The fusions this pass applies: one per kernel, named as the kernel. The engine's fusions of
collectives and GEMMs (``core.specs.ENGINE_FUSIONS``: ``async_tp``, ``passes/async_tp.py``)
are accepted beside them and applied by their own pass."""


def check_fusions(fusions: tuple[str, ...] | list[str], tp: int = 1) -> None:
    """``AutoparError`` for a name the vocabulary refuses (``core.specs.check_fusions``), or a
    priced fusion no kernel here runs (Megatron's ``PRICED_FUSIONS``, an op family's own)."""
    check_specs_fusions(fusions, tp, where="plan.config.fusions")
    for name in fusions:
        if name not in FUSIONS and name not in ENGINE_FUSIONS:
            raise AutoparError(
                f"fusion {name!r} is priced by the cost model but has no kernel to run",
                where="plan.config.fusions",
                fix=f"use names among {', '.join(FUSIONS + ENGINE_FUSIONS)} to run the plan")


def apply_fusions(model: nn.Module, fusions: tuple[str, ...] | list[str], tp: int = 1
                  ) -> list[tuple[str, int]]:
    """Rewrite ``model``'s blocks, final norm and head with the kernels of ``fusions`` (in
    place); returns (fusion, matches) in the order given. ``tp`` is the plan's tensor-parallel
    degree (``check_fusions``)."""
    check_fusions(fusions, tp)
    fusions = [name for name in fusions if name not in ENGINE_FUSIONS]
    if not fusions:
        return []
    register_dtensor_rules()
    family = model_family(model)
    parts = family.parts_of(model)
    counts = dict.fromkeys(fusions, 0)
    for root in (parts.blocks, *parts.last):
        for name in ("rms_norm", "layer_norm", "gelu"):
            if name in counts:
                counts[name] += _swap_modules(model, root, _MODULE_SWAPS[name], family)
        if "swiglu" in counts or "rope" in counts:
            for name, n in _rewrite_graphs(model, root, fusions, family).items():
                counts[name] += n
    if "linear_cross_entropy" in counts:
        counts["linear_cross_entropy"] = _swap_head(model, parts)
    return list(counts.items())


# --- module swaps ---------------------------------------------------------------------------

class FusedRMSNorm(nn.Module):
    """RMSNorm over the last dim by ``kernels.rms_norm``; holds the swapped norm's weight."""

    def __init__(self, weight: nn.Parameter, eps: float | None) -> None:
        super().__init__()
        self.weight = weight
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps  # nn.RMSNorm's default
        return kernels.rms_norm(x, self.weight, eps)


class FusedLayerNorm(nn.Module):
    """LayerNorm over the last dim by ``kernels.layer_norm``; holds weight and bias (or None)."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, eps: float) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.layer_norm(x, self.weight, self.bias, self.eps)


class FusedGELU(nn.Module):
    """The tanh-approximated GELU by ``kernels.gelu``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.gelu(x)


class LinearCrossEntropyHead(nn.Module):
    """The LM head fused with the loss: ``forward`` returns the hidden state it is given (the
    stage's output), ``loss`` computes ``cross_entropy(hidden @ weight.T, targets)`` by
    ``kernels.linear_cross_entropy`` without the logits. Holds the head's weight (tied or not)."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy, fp32, as ``F.cross_entropy`` of the logits."""
        weight = self.weight
        if hidden.dtype != weight.dtype:  # e.g. a bf16 hidden state from an fp32 model's stage
            weight = weight.to(hidden.dtype)
        return kernels.linear_cross_entropy(hidden, weight, targets)


def keep_fused_head_gathered(stage: nn.Module, head: str) -> None:
    """After ``fully_shard``: a stage root holding a ``LinearCrossEntropyHead`` keeps its own
    parameters gathered from its forward to its backward, because the fused loss reads the
    head's weight after the forward. ZeRO-3 (``reshard_after_forward=True``) would reshard them
    in between; FSDP2's default for a root is this anyway (they are gathered again at once for
    the backward). Blocks, each their own FSDP unit, are not affected."""
    info = stage_info(stage)  # a pipeline stage says; a model run whole holds it
    holds_head = info is None or info.last
    if holds_head and isinstance(stage, FSDPModule) and isinstance(stage.get_submodule(head),
                                                                   LinearCrossEntropyHead):
        stage.set_reshard_after_forward(False, recurse=False)


def _rms_norm(m: nn.Module, family: Family) -> nn.Module | None:
    if isinstance(m, nn.RMSNorm) and m.weight is not None and len(m.normalized_shape) == 1:
        return FusedRMSNorm(m.weight, m.eps)
    own = family.rms_norm(m)  # the family's own RMSNorm class (transformers' LlamaRMSNorm)
    return None if own is None else FusedRMSNorm(*own)


def _layer_norm(m: nn.Module, family: Family) -> nn.Module | None:
    if isinstance(m, nn.LayerNorm) and m.weight is not None and len(m.normalized_shape) == 1:
        return FusedLayerNorm(m.weight, m.bias, m.eps)
    return None


def _gelu(m: nn.Module, family: Family) -> nn.Module | None:
    return FusedGELU() if isinstance(m, nn.GELU) and m.approximate == "tanh" else None


_MODULE_SWAPS = {"rms_norm": _rms_norm, "layer_norm": _layer_norm, "gelu": _gelu}
"""Fusion -> ((module, its model's family) -> its fused replacement, or None where it does not
apply)."""


def _under(model: nn.Module, root: str) -> list[tuple[str, nn.Module]]:
    """(path in ``model``, module) of ``root`` and every module under it; none where ``root``
    is a parameter or buffer of the model root (``ModelParts.last`` names one that a final
    norm written inline reads)."""
    if root in model._parameters or root in model._buffers:
        return []
    return [(f"{root}.{name}" if name else root, m)
            for name, m in model.get_submodule(root).named_modules()]


def _swap_modules(model: nn.Module, root: str, fused_of, family: Family) -> int:
    """Replace each module at or under ``root`` that ``fused_of`` fuses; the count."""
    count = 0
    for path, m in _under(model, root):
        fused = fused_of(m, family)
        if fused is not None:
            _set_submodule(model, path, fused)
            count += 1
    return count


def _swap_head(model: nn.Module, parts: ModelParts) -> int:
    head = model.get_submodule(parts.head)
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise AutoparError(
            f"the head {parts.head} is a {type(head).__name__}"
            f"{' with a bias' if isinstance(head, nn.Linear) else ''}; linear_cross_entropy "
            "fuses a bias-free nn.Linear head with the loss",
            where="plan.config.fusions", fix="drop 'linear_cross_entropy' for this model")
    _set_submodule(model, parts.head, LinearCrossEntropyHead(head.weight))
    return 1


def _set_submodule(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


# --- torch.fx rewrites ----------------------------------------------------------------------

class _ChildrenAsLeaves(fx.Tracer):
    """Traces one module's own forward; every submodule call stays one ``call_module`` node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


def _rewrite_graphs(model: nn.Module, root: str, fusions: tuple[str, ...] | list[str],
                    family: Family) -> dict[str, int]:
    """Trace each module at or under ``root`` that has children, rewrite the function
    patterns, and put back each one whose graph changed; counts per fusion."""
    counts: dict[str, int] = {}
    for path, module in _under(model, root):
        if not list(module.children()) or isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            continue
        try:
            graph = _ChildrenAsLeaves().trace(module)
        except Exception:  # noqa: BLE001 - fx's failures are of many types; eager code stays
            continue
        found = {}
        if "swiglu" in fusions:
            found["swiglu"] = _rewrite_swiglu(graph, module, family)
        if "rope" in fusions:
            found["rope"] = _rewrite_rope(graph)
        if not any(found.values()):
            continue
        fused = fx.GraphModule(module, graph, class_name=f"Fused{type(module).__name__}")
        # after the GraphModule owns the graph: fx's purity check of a call_module needs it
        fused.graph.eliminate_dead_code()
        fused.recompile()
        if _param_names(fused) != _param_names(module):
            continue  # the graph does not use every parameter: keep the module as it is
        _set_submodule(model, path, fused)
        for k, v in found.items():
            counts[k] = counts.get(k, 0) + v
    return counts


def _param_names(m: nn.Module) -> list[str]:
    return sorted(n for n, _ in m.named_parameters(remove_duplicate=False))


def _is_silu_module(m: nn.Module, family: Family) -> bool:
    # nn.SiLU, or the family's own (transformers' SiLUActivation, ACT2FN["silu"])
    return isinstance(m, nn.SiLU) or family.is_silu(m)


def _swiglu_pattern(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def _swiglu_replacement(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.ops.autopar.swiglu(gate, up)


def _rewrite_swiglu(graph: fx.Graph, module: nn.Module, family: Family) -> int:
    """``silu(gate) * up`` -> ``swiglu(gate, up)``; an activation module call is made an
    ``F.silu`` call first so that one pattern covers both spellings."""
    for node in graph.nodes:
        if node.op == "call_module" and _is_silu_module(module.get_submodule(node.target),
                                                        family):
            with graph.inserting_after(node):
                # as fx records F.silu(x) itself: its torch-function path passes inplace=False
                call = graph.call_function(F.silu, node.args, {"inplace": False})
            node.replace_all_uses_with(call)
            graph.erase_node(node)
    gm = fx.GraphModule(module, graph)
    matches = fx.subgraph_rewriter.replace_pattern(gm, _swiglu_pattern, _swiglu_replacement)
    return len(matches)


def _rope_pattern(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


@functools.cache
def _rope_matcher() -> SubgraphMatcher:
    pattern = fx.symbolic_trace(_rope_pattern).graph
    return SubgraphMatcher(pattern, match_output=False, match_placeholder=False,
                           remove_overlapping_matches=True, ignore_literals=False)


def _rewrite_rope(graph: fx.Graph) -> int:
    """Each pair of ``x * cos + rotate_half(x) * sin`` matches sharing (cos, sin), in graph
    order (q then k), -> one ``rope(q, k, cos, sin)``; a match left alone rotates with an
    empty second tensor. Returns the kernel calls made."""
    by_tables: dict[tuple[fx.Node, fx.Node], list[tuple[fx.Node, fx.Node]]] = {}
    for m in _rope_matcher().match(graph):
        x, cos, sin = m.placeholder_nodes
        by_tables.setdefault((cos, sin), []).append((x, m.returning_nodes[0]))
    calls = 0
    for (cos, sin), found in by_tables.items():
        for i in range(0, len(found), 2):
            pair = found[i:i + 2]
            last = max((out for _, out in pair), key=_position(graph))
            with graph.inserting_after(last):
                q = pair[0][0]
                k = pair[1][0] if len(pair) == 2 else graph.call_method("narrow", (q, 1, 0, 0))
                call = graph.call_function(torch.ops.autopar.rope.default, (q, k, cos, sin))
            with graph.inserting_after(call):
                outs = [graph.call_function(operator.getitem, (call, j)) for j in range(2)]
            for (_, old), new in zip(pair, outs):
                old.replace_all_uses_with(new)
            calls += 1
    return calls


def _position(graph: fx.Graph):
    order = {n: i for i, n in enumerate(graph.nodes)}
    return order.__getitem__


# --- DTensor sharding rules -----------------------------------------------------------------

@functools.cache
def register_dtensor_rules() -> None:
    """DTensor sharding rules of the row-wise norm kernels (forward and backward), for norms
    that get sequence shards under ``SequenceParallel``: x and the gradient sharded on any
    leading dim (or replicated), the weight and bias replicated; the output sharded as x; the
    backward's weight and bias gradients partial sums over the shards."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.experimental import register_sharding

    ops = torch.ops.autopar

    def rows(ndim: int) -> list:
        return [Replicate(), *(Shard(d) for d in range(ndim - 1))]

    @register_sharding(ops.rms_norm.default)
    def _rms_norm(x, weight, eps):
        return [([p], [p, Replicate(), None]) for p in rows(x.ndim)]

    @register_sharding(ops.rms_norm_backward.default)
    def _rms_norm_backward(grad, x, weight, eps):
        return [([p, _sum_of(p)], [p, p, Replicate(), None]) for p in rows(x.ndim)]

    @register_sharding(ops.layer_norm.default)
    def _layer_norm(x, weight, bias, eps):
        b = None if bias is None else Replicate()
        return [([p], [p, Replicate(), b, None]) for p in rows(x.ndim)]

    @register_sharding(ops.layer_norm_backward.default)
    def _layer_norm_backward(grad, x, weight, eps):
        return [([p, _sum_of(p), _sum_of(p)], [p, p, Replicate(), None]) for p in rows(x.ndim)]

    def _sum_of(p):
        return Partial() if isinstance(p, Shard) else Replicate()
