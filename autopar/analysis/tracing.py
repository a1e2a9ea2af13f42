"""``trace``: an ``nn.Module``'s training forward (loss included) as a ``GraphIR``.

Steps, each a function below:

1. ``feed.feed_of``: how to call the forward (``autopar/models/feed.py``, shared with verify and the
   engine): token ids and targets, int64 zeros of (batch, seq_len) -- an encoder-decoder's
   decoder input the token ids shifted right -- or an image model's images of its config's size
   and class labels, on the model's device (meta for big models); ``use_cache=False`` for a
   transformers model.
2. ``_trace_fx``: ``torch.fx`` symbolic tracing (other defaulted arguments fixed through
   ``concrete_args``), a ``torch.nn`` module kept as one node only where the op registry knows
   its class and traced into otherwise (``fx_tracer.RegistryLeaves``), then shapes by running
   the graph on meta tensors (``FakeTensorMode`` when the weights are real; each distinct call
   once, ``propagate.py``). ``_trace_export``: if fx
   fails, ``torch.export.export(strict=False)``, whose nodes carry ``meta["val"]``; higher-order
   ops (``wrap_with_set_grad_enabled`` around transformers' rotary embedding) are inlined with
   ``run_decompositions({})``. transformers MoE models set to the data-dependent "eager" experts
   path are switched to "grouped_mm" (static shapes, exports) for the trace, and a hand-written
   mixture of experts (a router beside a list of expert modules, ``models/generic/experts.py``)
   runs on the mean rows of a dropless layer in place of its own data-dependent loop. If both
   fail, ``AutoparError`` names the module and line.
3. ``_build_nodes``: one ``NodeInfo`` per computing node, with the canonical op
   (``autopar.analysis.ops.naming``), shapes, FLOPs and bytes (the op registry, ``autopar.analysis.ops``),
   parameters and module path. An op no family owns gets the FLOPs torch counts for it, or is
   refused when it reads parameters and torch counts none (``autopar.analysis.ops.opaque`` argues the
   rule: traced into, priced, or refused, never free). Parameters and buffers are not nodes: a
   parameter read through ``get_attr``, a lifted placeholder, or a view of either (``w.t()``)
   is attributed to the node that consumes it.
4. ``tracing_blocks``: the repeated block group and each node's instance.

Cost: linear in the number of nodes, one meta forward, ``FlopCounterMode`` only over the ops no
family owns (llama3-405b at seq 8192: see ``bench/results/trace_time.md``).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.fx
from torch import nn
from torch.fx.node import _get_qualified_name
from torch.utils import _pytree as pytree

from autopar.analysis.admissibility import layers_of
from autopar.core.errors import AutoparError
from autopar.core.specs import TrainSpec
from autopar.models.feed import (
    Feed,
    FeedKind,
    check_seq_len,
    feed_of,
    fixed_seq_len,
    no_token_input_error,
)
from autopar.analysis.graph import GraphIR, NodeInfo, TensorMeta
from autopar.analysis.propagate import propagate
from autopar.analysis.fx_tracer import RegistryLeaves
from autopar.models.blocks import find_block_group
from autopar.models.family import trace_experts
from autopar.analysis.tracing_blocks import assign_blocks
from autopar.analysis.tracing_errors import (
    ModuleStack,
    not_a_module_error,
    opaque_op_error,
    data_dependent_shape_error,
    quiet_torch_logs,
    untraceable_error,
)
from autopar.analysis.ops import (CANONICAL_OPS, OP_NAMES, VIEW, WIDEN, forward_bytes, forward_flop,
                                 is_known)
from autopar.analysis.ops.opaque import counted_flop
from autopar.analysis.ops.naming import canonical_op, is_skipped, unmapped_ops

__all__ = ["CANONICAL_OPS", "DEFAULT_SEQ_LEN", "OP_NAMES", "trace", "unmapped_ops"]

DEFAULT_SEQ_LEN = 128
"""Sequence length when neither the TrainSpec nor the model's config gives one."""

_MODULE_ATTRS = ("p", "eps", "approximate", "normalized_shape", "padding_idx")
"""Attributes of ``call_module`` leaves reported in ``scalar_args`` as (name, value)."""
_NAMED_KWARGS = ("is_causal",)
"""Keyword flags also reported in ``scalar_args`` as (name, value) after the positional
scalars: a fused attention's causal mask (``ops.attention.is_causal``)."""


@dataclass
class _Traced:
    """A traced graph with ``meta["val"]`` on every node, and what its placeholders are."""

    root: nn.Module
    """The module the graph's ``get_attr`` and ``call_module`` nodes name."""
    graph: torch.fx.Graph
    method: str
    params: dict[str, str] = field(default_factory=dict)
    """Placeholder name -> parameter FQN (export's lifted parameters)."""
    consts: set[str] = field(default_factory=set)
    """Placeholder names of lifted buffers and constants (export)."""


def trace(
    model: nn.Module, train: TrainSpec | None = None, *, batch: int = 1, seq_len: int | None = None
) -> GraphIR:
    """Trace ``model``'s training forward, loss included, at micro-batch ``batch``.

    ``seq_len`` defaults to ``train.seq_len``, else the model's ``config.seq_len`` or
    ``config.max_position_embeddings``, else ``DEFAULT_SEQ_LEN``. Raises ``AutoparError`` for a
    non-module, a forward without a token input, or a model neither torch.fx nor torch.export
    can trace (naming the module and line at fault).
    """
    if not isinstance(model, nn.Module):
        raise not_a_module_error(model)
    feed = feed_of(model)
    seq = resolve_seq_len(model, train, seq_len)
    inputs, targets = feed.example(batch, seq, _model_device(model))
    was_training = model.training
    model.train()  # the training forward: dropout active
    try:
        with trace_experts(model) as experts:
            try:
                traced = _trace_fx(model, feed, inputs, targets)
            except Exception as fx_error:  # noqa: BLE001 - any fx failure falls back to export
                traced = _trace_export(model, feed, inputs, targets, fx_error)
    finally:
        model.train(was_training)
    nodes = _build_nodes(model, traced)
    group = find_block_group(model)
    if group is not None:
        group = assign_blocks(nodes, group)
    moe = moe_modules_of(model, experts)
    params = {
        name: TensorMeta(tuple(p.shape), p.dtype) for name, p in model.named_parameters()
    }
    return GraphIR(
        nodes=nodes, params=params, blocks=group, batch=batch, seq_len=seq,
        method=traced.method, fx=(traced.root, traced.graph), model_name=type(model).__name__,
        layers=layers_of(model), expert_params=experts, moe_modules=moe,
        moe_groups=moe_groups_of(model, moe), outer_layers=outer_layers_of(model),
    )


def outer_layers_of(model: nn.Module) -> frozenset[str]:
    """``GraphIR.outer_layers``: the layers of a built-in decoder's block lists
    (``DecoderLM.stacks``) but the last, the repeated blocks (``models/llama/model.py``)."""
    from autopar.models.llama.model import DecoderLM

    if not isinstance(model, DecoderLM):
        return frozenset()
    path = {id(m): name for name, m in model.named_modules()}
    lists = model.stacks()
    return frozenset(f"{path[id(stack)]}.{key}" for stack in lists[:-1] if id(stack) in path
                     for key, _ in stack.named_children())


def moe_groups_of(model: nn.Module, moe: frozenset[str]) -> dict[str, tuple[int, int]]:
    """(groups, groups kept) of each MoE module routing within groups: one whose
    ``router_group_topk`` is set (``models.routing.limit_groups``)."""
    out = {}
    for path in moe:
        module = model.get_submodule(path) if path else model
        keep = getattr(module, "router_group_topk", None)
        if isinstance(keep, int):
            out[path] = (int(getattr(module, "router_groups", 1)), keep)
    return out


def moe_modules_of(model: nn.Module, listed: frozenset[str]) -> frozenset[str]:
    """The module paths of ``model``'s mixture-of-experts layers: the module holding a layer's
    experts and its router -- the parent of the module of stacked (3-d) expert weights, or of
    a list of expert modules (``listed``: ``GraphIR.expert_params``), as the ops registry
    reads expert GEMMs (``ops.gemm.is_expert_gemm``)."""
    paths = set()
    for name, param in model.named_parameters():
        if param.dim() == 3:
            owner = name.rpartition(".")[0]
            if owner:
                paths.add(owner.rpartition(".")[0])
    for name in listed:
        parts = name.split(".")
        index = max((i for i, part in enumerate(parts[:-1]) if part.isdigit()), default=None)
        if index is not None and index >= 1:
            paths.add(".".join(parts[:index - 1]))
    return frozenset(paths)


# ---------------------------------------------------------------------------------- inputs


def resolve_seq_len(model: nn.Module, train: TrainSpec | None = None, seq_len: int | None = None
                    ) -> int:
    """The sequence length to trace at: the argument, the train spec's, the model config's;
    for a model without a config, ``DEFAULT_SEQ_LEN`` or its learned position table's rows
    when fewer (``position_table``: a ``FILE.py`` nanoGPT's ``wpe`` of 32 positions). An image
    model fixes its own (``feed.Feed.seq_len``: its patches and class token); another given
    length is an ``AutoparError``."""
    fixed = fixed_seq_len(model)
    given = seq_len if seq_len is not None else train.seq_len if train is not None else None
    if fixed is not None:
        if given is not None:
            check_seq_len(model, int(given))
        return fixed
    if given is not None:
        return int(given)
    config = getattr(model, "config", None)
    for name in ("seq_len", "max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    table = position_table(model)
    return min(DEFAULT_SEQ_LEN, table[1]) if table else DEFAULT_SEQ_LEN


_POSITION_NAME = re.compile(r"wpe|(^|_)pos", re.IGNORECASE)


def position_table(model: nn.Module) -> tuple[str, int] | None:
    """(name, rows) of the model's learned position table: its one ``nn.Embedding`` named for
    positions (``wpe``, ``pos_emb``, ``position_embeddings``, ``embed_positions``); None when
    there is none, or more than one."""
    tables = [(name, m.num_embeddings) for name, m in model.named_modules()
              if isinstance(m, nn.Embedding) and _POSITION_NAME.search(name.rsplit(".", 1)[-1])]
    return tables[0] if len(tables) == 1 else None


def _model_device(model: nn.Module) -> torch.device:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return torch.device("cpu")


# ---------------------------------------------------------------------------------- tracing


def _trace_fx(
    model: nn.Module, feed: Feed, inputs: torch.Tensor, targets: torch.Tensor
) -> _Traced:
    """Symbolic tracing plus meta/fake shape propagation; raises on any failure."""
    tracer = RegistryLeaves()
    graph = tracer.trace(model, concrete_args=dict(feed.fixed) or None)
    # no GraphModule: making one generates the graph's Python code, which nothing here runs
    # (``GraphIR.gm`` makes it where asked for)
    if feed.fixed:
        _drop_concrete_arg_checks(graph, set(feed.fed))
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    by_name = {k: v for k, v in feed.kwargs(inputs, targets).items() if k in feed.fed}
    args = [by_name.get(n.target) for n in placeholders if n.target in by_name]
    if len(args) != len(by_name):
        raise RuntimeError("symbolic_trace lost an input or target placeholder")
    propagate(tracer.root, graph, args)
    return _Traced(root=tracer.root, graph=graph, method="fx")


def _drop_concrete_arg_checks(graph: torch.fx.Graph, fed: set[str | None]) -> None:
    """Erase the checks symbolic_trace adds for ``concrete_args`` (``mask is None``, ``s == 1``).

    They assert that a fixed argument keeps its value; they compute nothing of the model.
    ``fed`` are the argument names that receive tensors; every other placeholder is fixed.
    """
    fixed_ph = {n for n in graph.nodes if n.op == "placeholder" and n.target not in fed}
    for node in reversed(list(graph.nodes)):
        if node.op not in ("call_function", "call_method") or node.users:
            continue
        name = getattr(node.target, "__name__", str(node.target))
        reads_fixed = node.all_input_nodes and all(a in fixed_ph for a in node.all_input_nodes)
        if name in ("_assert", "_assert_is_none") or reads_fixed:
            graph.erase_node(node)


@contextlib.contextmanager
def _static_experts(model: nn.Module) -> Iterator[None]:
    """Switch transformers MoE experts from the data-dependent "eager" loop to "grouped_mm"."""
    can_set = getattr(model, "_can_set_experts_implementation", None)
    getter = getattr(model, "get_experts_implementation", None)
    if not (callable(can_set) and callable(getter) and can_set()):
        yield
        return
    original = getter()
    if "eager" not in set(original.values()):
        yield
        return
    model.set_experts_implementation(
        {k: "grouped_mm" if v == "eager" else v for k, v in original.items()})
    try:
        yield
    finally:
        model.set_experts_implementation(original)


def _trace_export(
    model: nn.Module, feed: Feed, inputs: torch.Tensor, targets: torch.Tensor,
    fx_error: BaseException,
) -> _Traced:
    """``torch.export.export(strict=False)``; raises ``AutoparError`` if it fails too."""
    from torch.export.graph_signature import InputKind

    stack = ModuleStack(model)
    try:
        with _static_experts(model), quiet_torch_logs(), stack:
            ep = torch.export.export(model, (), feed.kwargs(inputs, targets), strict=False)
    except Exception as export_error:  # noqa: BLE001 - reported with its location
        if feed.kind is FeedKind.TOKENS and not any(isinstance(m, nn.Embedding)
                                                     for m in model.modules()):
            # the likeliest cause: token ids fed to a model that reads something else
            raise no_token_input_error(
                model, "it has no nn.Embedding to read token ids with, and tracing it with "
                f"token ids failed ({type(export_error).__name__}: "
                f"{str(export_error).splitlines()[0] if str(export_error) else ''})"
            ) from export_error
        raise untraceable_error(model, fx_error, export_error, stack.innermost) from export_error
    if any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in ep.graph.nodes):
        with warnings.catch_warnings():  # a LeafSpec FutureWarning from torch's own deepcopy
            warnings.simplefilter("ignore", FutureWarning)
            ep = ep.run_decompositions({})  # inline set_grad/autocast regions; keeps linear, sdpa
    traced = _Traced(root=ep.graph_module, graph=ep.graph_module.graph, method="export")
    for spec in ep.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if name is None:
            continue
        if spec.kind == InputKind.PARAMETER and spec.target is not None:
            traced.params[name] = spec.target
        elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            traced.consts.add(name)
    return traced


# ---------------------------------------------------------------------------------- nodes

_BRACKET = re.compile(r"\[['\"]?([^\]'\"]+)['\"]?\]")
_GETATTR = re.compile(r"getattr\(([^(),]*), ['\"]([^'\"]+)['\"]\)")


def normalise_module_path(raw: str) -> str:
    """``L['self'].layers[3].attn`` / ``getattr(L['self'].layers, '3')`` -> ``layers.3.attn``."""
    s = raw.replace("L['self']", "").replace('L["self"]', "")
    while "getattr(" in s:
        new = _GETATTR.sub(r"\1.\2", s)
        if new == s:
            break
        s = new
    s = _BRACKET.sub(r".\1", s)
    return ".".join(part for part in s.split(".") if part)


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = next(reversed(stack.values()))[0]
    return normalise_module_path(str(path))


def _tensor_metas(value: object) -> tuple[TensorMeta, ...]:
    return tuple(
        TensorMeta(tuple(int(d) for d in v.shape), v.dtype)
        for v in pytree.tree_leaves(value)
        if isinstance(v, torch.Tensor)
    )


def _raw_name(node: torch.fx.Node, root: nn.Module) -> tuple[str, str]:
    """(raw op name for ``OP_NAMES``, printable target) of a call node."""
    target = node.target
    if node.op == "call_module":
        return type(root.get_submodule(str(target))).__name__, str(target)
    if node.op == "call_method":
        return str(target), str(target)
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__, str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return target.name(), target.name()
    name = getattr(target, "__name__", str(target))
    try:
        return name, _get_qualified_name(target)  # type: ignore[arg-type]
    except (RuntimeError, AttributeError, TypeError):
        return name, str(target)


def _scalar(value: object) -> object:
    """A plain Python value for a SymInt/SymFloat/SymBool; the value itself otherwise."""
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymBool):
        return bool(value)
    return value


def _build_nodes(model: nn.Module, traced: _Traced) -> list[NodeInfo]:
    """One ``NodeInfo`` per computing node (see the module docstring, step 3)."""
    root = traced.root
    canon = {id(p): name for name, p in model.named_parameters()}
    param_nbytes = {name: p.numel() * p.element_size() for name, p in model.named_parameters()}
    # Non-activation values: node name -> parameter names they carry (() for buffers/consts).
    const: dict[str, tuple[str, ...]] = {}
    inputs_ph: set[str] = set()
    nodes: list[NodeInfo] = []
    for node in traced.graph.nodes:
        if node.op == "placeholder":
            if node.name in traced.params:
                fqn = traced.params[node.name]
                const[node.name] = (canon.get(id(model.get_parameter(fqn)), fqn),)
            elif node.name in traced.consts:
                const[node.name] = ()
            else:
                inputs_ph.add(node.name)
            continue
        if node.op == "get_attr":
            obj = _fetch_attr(root, str(node.target))
            if isinstance(obj, nn.Parameter):
                const[node.name] = (canon.get(id(obj), str(node.target)),)
                node.meta.setdefault("val", obj)
            else:
                const[node.name] = ()
                if isinstance(obj, torch.Tensor):
                    node.meta.setdefault("val", obj)
            continue
        if node.op == "output":
            continue
        try:
            info = _node_info(node, root, canon, param_nbytes, const, inputs_ph)
        except Exception as err:
            # sympy's module, imported where a trace runs, not when a cached graph is read
            from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

            if isinstance(err, GuardOnDataDependentSymNode):
                raise _data_dependent(node) from None
            raise
        if info is not None:
            nodes.append(info)
    return nodes


def _user_line(node: torch.fx.Node) -> str:
    """The source line that made ``node`` (export records it), or ""."""
    stack = str(node.meta.get("stack_trace") or "").strip().splitlines()
    return stack[-1].strip() if stack else ""


def _data_dependent(node: torch.fx.Node) -> AutoparError:
    """``data_dependent_shape_error`` for the first op whose output size needs the data."""
    _, target = _raw_name(node, node.graph.owning_module)
    return data_dependent_shape_error(_module_path(node), target, _user_line(node))


def _opaque_flop(node: torch.fx.Node, root: nn.Module, op: str,
                 params: tuple[str, ...]) -> float:
    """Forward FLOPs of an op the registry does not know: torch's count of it
    (``autopar.analysis.ops.opaque``, which argues the rule); an ``AutoparError`` when torch counts
    none and the op reads parameters."""
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                         lambda a: a.meta.get("val"))
    fn: Callable[..., object]
    if node.op == "call_module":
        module = root.get_submodule(str(node.target))
        state = dict(module.named_parameters()) | dict(module.named_buffers())
        args = (state, *args)
        fn = lambda state, *a, **k: torch.func.functional_call(module, state, a, k)  # noqa: E731
    elif node.op == "call_method":
        fn = lambda obj, *a, **k: getattr(obj, str(node.target))(*a, **k)  # noqa: E731
    else:
        fn = node.target  # type: ignore[assignment]
    flop = counted_flop(fn, args, kwargs)
    if flop == 0.0 and params:
        raise opaque_op_error(op, _raw_name(node, root)[1], _module_path(node), _user_line(node),
                              params)
    return flop


def _fetch_attr(root: nn.Module, target: str) -> object:
    obj: object = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _node_info(
    node: torch.fx.Node, root: nn.Module, canon: dict[int, str],
    param_nbytes: dict[str, int], const: dict[str, tuple[str, ...]], inputs_ph: set[str],
) -> NodeInfo | None:
    """The ``NodeInfo`` of one call node, or None (an assertion, or a view of a parameter)."""
    raw, target = _raw_name(node, root)
    if is_skipped(raw):
        return None
    flat_args: list[object] = []
    torch.fx.node.map_aggregate((node.args, node.kwargs), flat_args.append)
    named: list[tuple[str, object]] = [(k, node.kwargs[k]) for k in _NAMED_KWARGS
                                       if isinstance(node.kwargs.get(k), bool)]
    operands: list[TensorMeta] = []
    params: list[str] = []
    inputs: list[str] = []
    scalars: list[object] = []
    tensor_index = False
    first_contiguous = False
    n_tensor_args = 0
    n_const_args = 0
    for pos, leaf in enumerate(flat_args):
        if not isinstance(leaf, torch.fx.Node):
            if leaf is not None:
                scalars.append(leaf)
            continue
        val = leaf.meta.get("val")
        if not isinstance(val, torch.Tensor):
            if isinstance(val, (tuple, list)):
                # A multi-output producer (split, unbind, topk): getitem reads its activations.
                if (any(isinstance(v, torch.Tensor) for v in val) and leaf.name not in const
                        and leaf.name not in inputs_ph and leaf.name not in inputs):
                    inputs.append(leaf.name)
            elif val is not None:
                scalars.append(_scalar(val))
            continue
        n_tensor_args += 1
        if n_tensor_args == 1:
            first_contiguous = val.is_contiguous()
        if pos > 0:
            tensor_index = True
        operands.append(TensorMeta(tuple(int(d) for d in val.shape), val.dtype))
        if leaf.name in const:
            n_const_args += 1
            params.extend(p for p in const[leaf.name] if p not in params)
        elif leaf.name not in inputs_ph and leaf.name not in inputs:
            inputs.append(leaf.name)
    if node.op == "call_module":
        module = root.get_submodule(str(node.target))
        for p in module.parameters():
            name = canon.get(id(p), f"{node.target}.?")
            if name not in params:
                params.append(name)
        for t in (*module.parameters(), *module.buffers()):
            operands.append(TensorMeta(tuple(t.shape), t.dtype))
        scalars.extend((a, getattr(module, a)) for a in _MODULE_ATTRS if hasattr(module, a))
    scalars.extend(named)
    outputs = _tensor_metas(node.meta.get("val"))
    # a cast the code writes to fp32 (x.float(), x.to(torch.float32)), not to a dtype it reads
    # from a tensor (x.to(q.dtype), fp32 only because the trace is); torch.export writes the
    # dtype it read as a constant, so its casts cannot be told apart and stay views
    names_fp32 = not isinstance(node.target, torch._ops.OpOverload) and (
        raw == "float" or any(leaf is torch.float32 for leaf in flat_args))
    op = canonical_op(raw, operands, outputs, tensor_index=tensor_index and raw == "getitem",
                      first_contiguous=first_contiguous, names_fp32=names_fp32)
    if (not is_known(op) and isinstance(node.target, torch._ops.OpOverload)
            and node.target.is_view):
        op = VIEW  # ATen's schema says its output aliases its input (numpy_T, mT): no data moved
    weights_only = bool(n_tensor_args) and n_const_args == n_tensor_args and not inputs
    if op == WIDEN and weights_only:
        op = VIEW  # a weight's fp32 copy: a weight of its consumer, as the weight itself
    if op == VIEW and weights_only:
        const[node.name] = tuple(params)  # a view of weights: folded into its consumer
        return None
    param_bytes = sum(param_nbytes.get(name, 0) for name in params)
    flop = forward_flop(op, raw, operands, outputs, scalars)
    if outputs and not is_known(op):
        flop = _opaque_flop(node, root, op, tuple(params))
    return NodeInfo(
        name=node.name, op=op, target=target, inputs=tuple(inputs), outputs=outputs,
        fwd_flop=flop,
        fwd_bytes=forward_bytes(op, operands, outputs),
        params=tuple(params), param_bytes=param_bytes, module_path=_module_path(node),
        scalar_args=tuple(scalars),
    )
