"""A decoder's forward read with ``torch.export`` where ``torch.fx`` cannot trace it.

transformers 5 writes its forwards as ``forward(..., **kwargs)``, which ``torch.fx`` refuses
("co_varnames is too small"), and builds its masks with code fx cannot follow; ``torch.export``
(non-strict) traces them. ``describe.py`` reads a model's parts off a graph of its forward in
which each module of the block container is one ``call_module`` node -- what fx gives with the
blocks as leaves. ``export_chain`` makes that graph from an exported program:

1. The model is copied onto the meta device (``meta_copy``: no memory, nothing computed) and
   exported for ``forward(tokens)`` with every module of the container's call signature
   preserved (``preserve_module_call_signature``: ``ExportedProgram.module_call_graph`` then
   records the inputs each module was called with, as a pytree of the graph's nodes, and its
   outputs), the batch and the sequence dimensions dynamic.
2. ``collapse`` rewrites the flat ATen graph: the nodes inside a container module are dropped
   and one ``call_module`` with the recorded ``(args, kwargs)`` stands for them (its outputs
   read by ``getitem`` where it returns a tuple); every other node is kept, with each
   parameter or buffer read as a ``get_attr`` of the model by name -- for a tied weight the
   name under the module that reads it (the embedding reads ``model.embed_tokens.weight``, the
   head ``lm_head.weight``: ``_alias``) -- and each ``device='meta'`` the trace baked in
   (``arange(..., device=...)``) read off the tokens, so the graph runs wherever the stage
   runs. A ``.to()`` that changes nothing inside a module returns its input, which a later
   module is passed under the ``to``'s name (Llama 4's rotary table): it is read as the
   input. The output is
   the forward's ``logits``: a soft-capped or scaled head (Gemma 2, Cohere, Granite) is what
   the model computes, since the graph after the blocks is the model's own code.

**What an exported graph holds for.** It is specialized: the dtypes of its
casts and constants (a mask's ``finfo(dtype).min``, ``cos.to(x.dtype)``) are those of the
trace, and sizes may be guarded (``Specialization``: the batch and sequence lengths its
graphs are valid for, read from the program's range constraints). ``describe.py`` runs the
graphs only where the stage's dtype and sizes are the trace's, and exports the meta copy again
for others (a bf16 plan's compute dtype, a micro-batch outside the range) -- one export per
rank and key.

Where the export fails, ``NotAChain`` gives both tools' reasons.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn
from torch.fx import GraphModule, Node
from torch.utils._python_dispatch import _disable_current_modes

from autopar.models.generic.module_graph import failure, training

META = torch.device("meta")

_TRACE_BATCH, _TRACE_SEQ = 2, 16
"""The sizes the first export traces at (dynamic dimensions: the graph is valid beyond them,
where the program's range constraints say)."""


class ExportFailed(Exception):
    """``torch.export`` cannot read the forward as a chain of its container's modules."""


@dataclass(frozen=True)
class Specialization:
    """What an exported graph is valid for."""

    dtype: torch.dtype
    """The floating dtype of the parameters it was traced with (its casts and constants)."""
    batch: tuple[int, float]
    """The batch sizes it holds for (lowest, highest; ``inf`` unbounded)."""
    seq: tuple[int, float]
    """The sequence lengths it holds for."""

    def holds(self, dtype: torch.dtype, batch: int, seq: int) -> bool:
        return (dtype == self.dtype and self.batch[0] <= batch <= self.batch[1]
                and self.seq[0] <= seq <= self.seq[1])


@dataclass(frozen=True)
class Exported:
    """A forward read by ``torch.export``, as a graph with the container's modules as calls."""

    graph_module: GraphModule
    """The collapsed graph over ``template`` (its ``get_attr`` names are the model's)."""
    template: nn.Module
    """The meta copy it was exported from (exported again for other dtypes and sizes)."""
    specialization: Specialization


def meta_copy(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """A copy of ``model`` on the meta device, its floating parameters in ``dtype`` where given
    (no tensor data is copied)."""
    memo: dict[int, object] = {}
    for p in model.parameters(recurse=True):
        if id(p) not in memo:
            t = torch.empty_like(p, device=META,
                                 dtype=dtype if dtype is not None and p.is_floating_point()
                                 else p.dtype)
            memo[id(p)] = nn.Parameter(t, requires_grad=p.requires_grad)
    for b in model.buffers(recurse=True):
        memo.setdefault(id(b), torch.empty_like(b, device=META))
    return copy.deepcopy(model, memo)


def floating_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of ``model``'s first floating parameter (float32 where it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def export_chain(template: nn.Module, leaves: tuple[str, ...], token: str,
                 fixed: dict[str, object], max_seq: int | None,
                 sizes: tuple[int, int] | None = None) -> Exported:
    """``template``'s forward (a meta model: ``meta_copy``) exported for ``forward(token=...,
    **fixed)`` and collapsed (the module docstring); ``sizes``: (batch, seq) to trace at with
    both fixed, else both dynamic. ``ExportFailed`` with the reason where it cannot be."""
    from torch.export import Dim  # imported where a forward is exported (0.2 s of start-up)

    batch, seq = sizes or (_TRACE_BATCH, min(_TRACE_SEQ, max_seq or _TRACE_SEQ))
    tokens = torch.zeros(batch, seq, dtype=torch.long, device=META)
    kwargs = {token: tokens, **_named(template, fixed)}
    # every batch and sequence length the positions allow, where the code guards none (torch
    # checks the graph holds over the range it is given, else refuses it); else the sizes
    # the trace leaves dynamic (Dim.AUTO), else none
    tries = [None] if sizes else [(Dim("batch", min=1), Dim("seq", min=1, max=max_seq)),
                                  (Dim.AUTO, Dim.AUTO)]
    for dims in tries:
        shapes = None if dims is None else {
            name: (dict(enumerate(dims)) if name == token else None) for name in kwargs}
        try:
            # outside any mode of the caller (a dry run's fake tensors): the template is meta
            with training(template), _disable_current_modes(), torch.enable_grad():
                program = torch.export.export(template, (), kwargs, strict=False,
                                              dynamic_shapes=shapes,
                                              preserve_module_call_signature=leaves)
            break
        except Exception as err:  # noqa: BLE001 - any export failure is the reason given
            if dims is tries[-1]:
                raise ExportFailed(f"torch.export cannot trace it either ({failure(err)})"
                                   ) from None
    gm = collapse(program, template, leaves, token)
    return Exported(gm, template, _specialization(program, token, floating_dtype(template)))


def _named(template: nn.Module, fixed: dict[str, object]) -> dict[str, object]:
    """``fixed`` as arguments the forward names: one its ``**kwargs`` takes (transformers 5's
    ``use_cache``) is set on the template's config instead, whose value transformers reads where
    the call gives none -- torch.export keys dynamic shapes by the forward's own parameters and
    cannot match one inside ``**kwargs``. (The template is the meta copy: the model's own config
    is not touched.)"""
    import inspect

    params = inspect.signature(template.forward).parameters
    config = getattr(template, "config", None)
    out = {}
    for name, value in fixed.items():
        if name not in params and config is not None and hasattr(config, name):
            setattr(config, name, value)
        else:
            out[name] = value
    return out


def _specialization(program: torch.export.ExportedProgram, token: str,
                    dtype: torch.dtype) -> Specialization:
    from torch.utils._sympy.numbers import int_oo  # sympy: imported only once exported

    holder = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == token)
    ranges = []
    for size in holder.meta["val"].shape:
        if isinstance(size, int):
            ranges.append((size, float(size)))
            continue
        bound = program.range_constraints.get(size.node.expr)
        if bound is None:
            ranges.append((int(size), float(int(size))))
            continue
        upper = bound.upper
        unbounded = upper == int_oo or upper.is_infinite
        ranges.append((int(bound.lower), float("inf") if unbounded else int(upper)))
    return Specialization(dtype, ranges[0], ranges[1])


# ---- the flat graph -> one call per container module ---------------------------------------
def collapse(program: torch.export.ExportedProgram, template: nn.Module,
             leaves: tuple[str, ...], token: str) -> GraphModule:
    """The graph of ``program`` with each module of ``leaves`` one ``call_module`` node (see
    the module docstring); ``ExportFailed`` where the code outside them reads a value computed
    inside one, or a tensor constant the trace made."""
    signatures = {e.fqn: e.signature for e in program.module_call_graph}
    missing = [leaf for leaf in leaves if signatures.get(leaf) is None]
    if missing:
        raise ExportFailed(f"its forward does not call {', '.join(missing)}")
    names = {n for n, _ in template.named_modules()}
    params = _lifted(program)
    aliases = _aliases(template)
    graph = torch.fx.Graph()
    tokens = graph.placeholder("tokens")
    device = graph.call_function(getattr, (tokens, "device"))
    env: dict[str, object] = {}
    pending: dict[str, tuple[Node, int | None]] = {}
    attrs: dict[str, Node] = {}
    owner: dict[str, str] = {}  # node -> the container module whose code it is
    for node in program.graph.nodes:
        leaf = _leaf_of(node, leaves)
        if leaf is not None:
            owner[node.name] = leaf
    called: set[str] = set()
    nodes = {n.name: n for n in program.graph.nodes}

    def value(name: str, user_path: str) -> object:
        if name in env:
            return env[name]
        if name in pending:
            call, item = pending.pop(name)
            env[name] = call if item is None else graph.call_function(operator.getitem,
                                                                       (call, item))
            return env[name]
        if name in params:
            kind, target = params[name]
            if kind == "constant":
                raise ExportFailed(f"the code around its blocks reads {target}, a tensor "
                                   "constant the trace made")
            chosen = _alias(aliases.get(target, (target,)), user_path)
            if chosen not in attrs:
                attrs[chosen] = graph.get_attr(chosen)
            return attrs[chosen]
        if name in owner and _unchanged(nodes[name]) is not None:
            # ``x.to(x.dtype)`` inside a module returns x itself, which the trace then names
            # by the ``to`` node when a later module is passed it (Llama 4's rotary table)
            return value(_unchanged(nodes[name]).name, user_path)
        if name in owner:
            raise ExportFailed(f"the code around its blocks reads {name}, a value computed "
                               f"inside {owner[name]} that it does not return")
        raise ExportFailed(f"the forward reads {name}, which the graph does not define")

    def call(leaf: str) -> None:
        sig = signatures[leaf]
        vals = [value(a.name, leaf) if hasattr(a, "name") and a.name and
                not _is_constant(a) else getattr(a, "value", None) for a in sig.inputs]
        args, kwargs = pytree.tree_unflatten(vals, sig.in_spec)
        node = graph.call_module(leaf, tuple(args), dict(kwargs))
        single = sig.out_spec.is_leaf()
        for i, out in enumerate(sig.outputs):
            if getattr(out, "name", None) and not _is_constant(out):
                pending[out.name] = (node, None if single else i)
        called.add(leaf)

    for node in program.graph.nodes:
        if node.op == "placeholder":
            if node.name == token:
                env[node.name] = tokens
            elif node.name not in params:
                env[node.name] = None  # another forward argument, fixed (use_cache=False)
            continue
        leaf = owner.get(node.name)
        if leaf is not None:
            if leaf not in called:
                call(leaf)
            continue
        if node.op == "output":
            graph.output(value(_logits(program, node), ""))
            break
        path = _module_path(node, names)
        args = torch.fx.node.map_aggregate(
            node.args, lambda a: _arg(a, path, value, device))
        kwargs = torch.fx.node.map_aggregate(
            node.kwargs, lambda a: _arg(a, path, value, device))
        copied = graph.create_node(node.op, node.target, tuple(args), dict(kwargs), node.name)
        copied.meta = dict(node.meta)
        env[node.name] = copied
    not_called = [leaf for leaf in leaves if leaf not in called]
    if not_called:
        raise ExportFailed(f"its forward does not run {', '.join(not_called)}")
    return GraphModule(template, graph)


_ALIASING = frozenset({torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout,
                       torch.ops.aten.to.device, torch.ops.aten.alias.default})


def _unchanged(node: Node) -> Node | None:
    """The input of ``node`` where ``node`` returns it unchanged (a ``to`` of its own dtype
    and device, an ``alias``), else ``None``."""
    if node.target not in _ALIASING or not node.args or not isinstance(node.args[0], Node):
        return None
    out, src = node.meta.get("val"), node.args[0].meta.get("val")
    same = (isinstance(out, torch.Tensor) and isinstance(src, torch.Tensor)
            and out.dtype == src.dtype and out.device == src.device and out.shape == src.shape)
    return node.args[0] if same else None


def _arg(a: object, path: str, value, device: Node) -> object:
    if isinstance(a, Node):
        return value(a.name, path)
    if isinstance(a, torch.device) and a.type == "meta":
        return device
    return a


def _is_constant(arg: object) -> bool:
    return type(arg).__name__ == "ConstantArgument"


def _lifted(program: torch.export.ExportedProgram) -> dict[str, tuple[str, str]]:
    """Placeholder name -> (``param`` | ``buffer`` | ``constant``, the model's name of it)."""
    from torch.export.graph_signature import InputKind

    kinds = {InputKind.PARAMETER: "param", InputKind.BUFFER: "buffer",
             InputKind.CONSTANT_TENSOR: "constant", InputKind.CUSTOM_OBJ: "constant"}
    out = {}
    for spec in program.graph_signature.input_specs:
        kind = kinds.get(spec.kind)
        if kind is not None and spec.target is not None:
            out[spec.arg.name] = (kind, spec.target)
    return out


def _aliases(model: nn.Module) -> dict[str, tuple[str, ...]]:
    """Every name of each parameter and buffer -> all the names of that tensor (a tied
    embedding and head: two names)."""
    by_id: dict[int, list[str]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False),
                    *model.named_buffers(remove_duplicate=False)]:
        by_id.setdefault(id(t), []).append(name)
    return {name: tuple(names) for names in by_id.values() for name in names}


def _alias(names: tuple[str, ...], user_path: str) -> str:
    """The name a stage reads a tensor by: the model's own (first) name where its module holds
    the module reading it at ``user_path`` (BERT's head bias, ``cls.predictions.bias``, read
    in ``cls.predictions.decoder``), else the name under the reading module (a head tied to
    the embedding reads ``lm_head.weight``); its first name where no module holds the
    reader."""
    def holds(name: str) -> bool:
        owner = name.rpartition(".")[0]
        return not owner or user_path == owner or user_path.startswith(owner + ".")

    inside = [n for n in names if holds(n)]
    if not inside or names[0] in inside:
        return names[0]
    return max(inside, key=lambda n: n.count("."))


def _stack(node: Node) -> list[str]:
    return [str(path) for path, _ in (node.meta.get("nn_module_stack") or {}).values()]


def _leaf_of(node: Node, leaves: tuple[str, ...]) -> str | None:
    """The container module whose code ``node`` is part of; ``None`` for code outside them."""
    if node.op in ("placeholder", "output"):
        return None
    for path in _stack(node):
        for leaf in leaves:
            if path == leaf or path.startswith(leaf + "."):
                return leaf
    return None


def _module_path(node: Node, names: set[str]) -> str:
    """The innermost module of the model whose code ``node`` is ("" for the root)."""
    found = [p for p in _stack(node) if p in names]
    return found[-1] if found else ""


def _logits(program: torch.export.ExportedProgram, output: Node) -> str:
    """The name of the node the forward returns as its logits: the ``logits`` field of a
    transformers output, else its first tensor."""
    spec = program.call_spec.out_spec
    leaves = output.args[0]
    index = 0
    if spec is not None and not spec.is_leaf() and isinstance(spec.context, list) and \
            "logits" in spec.context:
        children = spec.children()
        index = sum(c.num_leaves for c in children[:spec.context.index("logits")])
    value = leaves[index] if isinstance(leaves, (tuple, list)) else leaves
    if not isinstance(value, Node):
        raise ExportFailed("its forward(tokens) returns no logits tensor")
    return value.name
