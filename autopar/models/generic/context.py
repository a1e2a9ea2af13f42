"""Context parallelism for a generic decoder (a user's ``FILE.py:FACTORY``): what makes it
sound, and the interception that runs it.

Under cp > 1 a rank holds two chunks of every sequence (``passes/context_parallel.py``). A
block's computation is then the one process's when (a) its only op mixing tokens is causal
``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` with no mask, which the rank runs
against the K and V gathered over the cp group (the block's ``context_parallel`` hook,
``GatheredKVAttention``), and (b) the positions the embedding and the blocks' extra arguments
read are ``torch.arange`` over the sequence length, which the rank replaces by the global
positions of its chunks. ``context_problem`` checks both on the traced graphs, conservatively:

* one block is traced with ``torch.fx`` through its own modules (``torch.nn`` layers are
  leaves), called with the extra arguments the forward passes; it must call SDPA, every call
  causal with no mask, and contain nothing else that could mix or index tokens: no softmax
  (a hand-written attention; a router's softmax is refused too), ``tril``/``triu``/``cumsum``/
  ``masked_fill``/``arange``, no ``nn.MultiheadAttention``/``nn.Softmax``/convolution/RNN, and
  no buffer (a registered causal mask, a cached position table); a hand-written mixture of
  experts (``experts.py``) is not entered: its routing is per token;
* the embedding's and the extra arguments' graphs may build positions only as
  ``torch.arange(n)`` / ``torch.arange(0, n)`` with ``n`` the tokens' sequence length
  (``tokens.size(1)``, ``tokens.shape[1]``), and read no buffer but whole, as RoPE's
  ``inv_freq`` is multiplied with the positions (``_combined_whole``): a buffer sliced or
  indexed -- a cached cos/sin table cut to ``[:t]`` -- is a table a cp rank would cut at its
  local positions. ``with_positions`` rewrites
  each such ``arange`` into ``sequence_positions(positions, ...)``: the same ``arange``
  without cp, the chunks' global positions under it (a ``positions`` input the stage fills
  from ``StageModule.positions``).

A model failing either is refused by the admissibility check before any process starts
(``Family.context_problem`` -> ``ModelFacts.context_refused``), with the reason.

At run time a stage calls each block under ``ContextAttentionMode`` (a ``TorchFunctionMode``,
``describe.call_block``) where the block holds a hook: its SDPA calls go to the hook, every
other call runs as it is. Activation checkpointing recomputes inside the same call, so under
the same mode.
"""

from __future__ import annotations

import operator
from contextlib import nullcontext

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Node
from torch.overrides import TorchFunctionMode

from autopar.core.errors import AutoparError
from autopar.models.generic.module_graph import failure, trace_module
from autopar.models.generic.experts import listed_moe

_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                "enable_gqa")
"""``F.scaled_dot_product_attention``'s arguments, in order."""
_SDPA_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
                  "enable_gqa": False}

_MIXING_FUNCTIONS = {torch.softmax: "softmax", F.softmax: "softmax",
                     torch.log_softmax: "log_softmax", F.log_softmax: "log_softmax",
                     torch.tril: "tril", torch.triu: "triu", torch.cumsum: "cumsum",
                     torch.masked_fill: "masked_fill", torch.arange: "arange",
                     torch.baddbmm: "baddbmm"}
"""Functions that, in a block, build or apply an attention of its own, a mask or positions."""
_MIXING_METHODS = frozenset({"softmax", "log_softmax", "tril", "triu", "tril_", "triu_",
                             "cumsum", "masked_fill", "masked_fill_", "baddbmm"})
_MIXING_MODULES = (nn.MultiheadAttention, nn.Softmax, nn.LogSoftmax, nn.Conv1d, nn.RNNBase,
                   nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


def sdpa_arguments(args: tuple, kwargs: dict) -> dict:
    """``F.scaled_dot_product_attention``'s arguments by name, defaults filled."""
    named = dict(zip(_SDPA_PARAMS, args))
    named.update(kwargs)
    return {**_SDPA_DEFAULTS, **named}


# ---- the run: a block's SDPA calls to its hook ------------------------------------------------
class ContextAttentionMode(TorchFunctionMode):
    """Runs every ``F.scaled_dot_product_attention`` call by ``hook`` (the block's
    ``GatheredKVAttention``); every other call as it is. Inside the handler the mode is off,
    so the hook's own SDPA runs plainly."""

    def __init__(self, hook: nn.Module) -> None:
        super().__init__()
        self.hook = hook

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        a = sdpa_arguments(args, kwargs)
        if a["attn_mask"] is not None or a["is_causal"] is not True:
            raise AutoparError("a block called scaled_dot_product_attention with a mask or "
                               "without is_causal=True under context parallelism",
                               where="models/generic/context.py",
                               fix="use cp=1 for this model")
        return self.hook(a["query"], a["key"], a["value"], dropout_p=a["dropout_p"],
                         scale=a["scale"], enable_gqa=a["enable_gqa"])


def context_attention(block: nn.Module):
    """The context a stage calls ``block`` in: ``ContextAttentionMode`` over its
    ``context_parallel`` hook where it holds one (cp > 1), else nothing."""
    hook = getattr(block, "context_parallel", None)
    return nullcontext() if hook is None else ContextAttentionMode(hook)


# ---- positions: arange over the sequence -> the chunks' global positions ----------------------
def sequence_positions(positions: torch.Tensor | None, *args, **kwargs) -> torch.Tensor:
    """``torch.arange(*args, **kwargs)`` (an arange over the sequence length the description
    found), or, under context parallelism, ``positions`` -- the global positions of the rank's
    tokens -- in its dtype."""
    values = torch.arange(*args, **kwargs)
    if positions is None:
        return values
    if values.shape != positions.shape:
        raise AutoparError(f"positions of {values.numel()} tokens, the rank holds "
                           f"{positions.numel()}", where="models/generic/context.py",
                           fix="use cp=1 for this model")
    return positions.to(dtype=values.dtype, device=values.device)


def with_positions(gm: GraphModule, what: str) -> str | None:
    """Give ``gm`` (the embedding's or the extra arguments' graph, placeholders ``tokens``
    and maybe ``x``) a last input ``positions`` and route each ``arange`` over the tokens'
    sequence length through ``sequence_positions``; returns why the graph cannot run
    context-parallel (another ``arange``, a buffer read), or ``None``."""
    graph = gm.graph
    holders = [n for n in graph.nodes if n.op == "placeholder"]
    with graph.inserting_after(holders[-1]):
        positions = graph.placeholder("positions", default_value=None)
    sources = {n: ({1, -1} if n.target == "tokens" else {1}) for n in holders}
    problem = None
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.arange:
            if not _over_sequence(node, sources):
                problem = problem or (f"{what} compute {_describe_node(node)}, not an arange "
                                      "over the tokens' sequence length")
                continue
            node.target = sequence_positions
            node.args = (positions, *node.args)
        elif node.op == "get_attr" and _is_buffer(gm, str(node.target)) \
                and not _combined_whole(node):
            problem = problem or (f"{what} read the buffer {node.target} (a position table or "
                                  "mask a cp rank would index by its local positions)")
    gm.recompile()
    return problem


_WHOLE_FUNCTIONS = frozenset({torch.outer, torch.ger, torch.mul, torch.matmul, torch.einsum,
                              operator.mul, operator.matmul, operator.truediv, torch.div})
"""Functions that take a buffer whole, position by nothing: RoPE's ``outer(positions,
inv_freq)`` or ``positions[:, None] * inv_freq``."""
_WHOLE_METHODS = frozenset({"to", "float", "double", "half", "bfloat16", "type_as"})
_META_READS = frozenset({"device", "dtype", "shape", "ndim"})


def _combined_whole(buffer: Node) -> bool:
    """Whether every use of ``buffer`` (a ``get_attr`` of a buffer) takes it whole -- its
    metadata read, cast, or multiplied with other tensors (RoPE's ``inv_freq`` times the
    positions, which the arange rewrite makes the chunks' global ones) -- and none indexes or
    slices it by position (a cached cos/sin table cut to ``[:t]``, a registered mask)."""
    for user in buffer.users:
        if user.op == "call_function" and user.target is getattr:
            if user.args[1] not in _META_READS:
                return False
        elif user.op == "call_method" and user.target in _WHOLE_METHODS:
            if not _combined_whole(user):
                return False
        elif not ((user.op == "call_function" and user.target in _WHOLE_FUNCTIONS)
                  or (user.op == "call_method" and user.target in ("mul", "matmul", "div"))):
            return False
    return True


def _over_sequence(node: Node, sources: dict[Node, set[int]]) -> bool:
    args = list(node.args)
    if "end" in node.kwargs:
        args = [*args, node.kwargs["end"]] if args else [0, node.kwargs["end"]]
    if "start" in node.kwargs or "step" in node.kwargs:
        return False
    if len(args) == 1:
        end = args[0]
    elif len(args) in (2, 3) and args[0] == 0 and (len(args) == 2 or args[2] == 1):
        end = args[1]
    else:
        return False
    return isinstance(end, Node) and _is_length(end, sources)


def _is_length(node: Node, sources: dict[Node, set[int]]) -> bool:
    """Whether ``node`` is ``src.size(d)``, ``src.size()[d]`` or ``src.shape[d]`` of a source
    and one of its sequence dimensions ``d``."""
    if node.op == "call_method" and node.target == "size":
        src = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        return src in sources and dim in sources[src]
    if node.op == "call_function" and node.target is operator.getitem:
        inner, dim = node.args
        if not isinstance(inner, Node):
            return False
        if inner.op == "call_method" and inner.target == "size" and len(inner.args) == 1:
            src = inner.args[0]
        elif inner.op == "call_function" and inner.target is getattr and \
                inner.args[1] == "shape":
            src = inner.args[0]
        else:
            return False
        return src in sources and dim in sources[src]
    return False


def _is_buffer(gm: nn.Module, target: str) -> bool:
    owner, _, name = target.rpartition(".")
    try:
        module = gm.get_submodule(owner)
    except AttributeError:
        return False
    return name in module._buffers


def _describe_node(node: Node) -> str:
    name = getattr(node.target, "__name__", str(node.target))
    return f"{name}({', '.join(map(str, node.args))})"


# ---- the block: causal SDPA, nothing else mixing tokens --------------------------------------
def block_problem(block: nn.Module, name: str, args: tuple, kwargs: dict) -> str | None:
    """Why ``block`` (called ``block(x, *args, **kwargs)``, the extra arguments as the forward's
    graph passes them: nodes or constants) cannot run context-parallel; ``None`` where it can
    (see the module docstring)."""
    routed = frozenset(id(layer.module) for layer in listed_moe(block))  # per-token routing
    try:
        graph = trace_module(block, args, kwargs, leaves=routed)
    except Exception as err:  # noqa: BLE001 - any fx failure is the reason given
        return (f"torch.fx cannot trace its block {name} to find its attention "
                f"({failure(err, 160)})")
    attention = 0
    for node in graph.nodes:
        what = _mixing(block, node)
        if what is not None:
            return f"its block {name} {what}"
        if node.op == "call_function" and node.target is F.scaled_dot_product_attention:
            a = sdpa_arguments(node.args, node.kwargs)
            if a["attn_mask"] is not None or a["is_causal"] is not True:
                return (f"its block {name} calls scaled_dot_product_attention with a mask or "
                        "without is_causal=True (a mask of the local sequence)")
            attention += 1
    if not attention:
        return (f"its block {name} calls no causal scaled_dot_product_attention (the only "
                "attention context parallelism runs over the gathered K and V)")
    return None


def _mixing(block: nn.Module, node: Node) -> str | None:
    if node.op == "call_function" and node.target in _MIXING_FUNCTIONS:
        return (f"calls {_MIXING_FUNCTIONS[node.target]} (an attention, mask or positions of "
                "its own, which context parallelism would run on the rank's chunks alone)")
    if node.op == "call_method" and node.target in _MIXING_METHODS:
        return (f"calls .{node.target}() (an attention, mask or positions of its own, which "
                "context parallelism would run on the rank's chunks alone)")
    if node.op == "call_module" and isinstance(block.get_submodule(str(node.target)),
                                               _MIXING_MODULES):
        return (f"runs {node.target}, a {type(block.get_submodule(str(node.target))).__name__} "
                "mixing tokens that context parallelism would run on the rank's chunks alone")
    if node.op == "get_attr" and _is_buffer(block, str(node.target)):
        return (f"reads its buffer {node.target} (a causal mask or position table a cp rank "
                "would index by its local positions)")
    return None
