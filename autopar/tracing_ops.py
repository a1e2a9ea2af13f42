"""Canonical op names and per-node forward FLOP/byte formulas for ``autopar.trace``.

torch.fx (``call_module`` of ``torch.nn`` leaves, ``call_function``, ``call_method``) and
torch.export (ATen overloads) name the same computation differently. ``OP_NAMES`` is the one
table that maps a *raw name* to the canonical ``op`` of ``autopar.graph.NodeInfo``:

* ``call_module``: the module's class name (``Linear``, ``LayerNorm``, ``GELU``...);
* ``call_function``: the function's ``__name__`` (``matmul``, ``add`` for ``operator.add``...);
* ``call_method``: the method name (``view``, ``softmax``...);
* ATen (export): the overload packet's name (``addmm``, ``_softmax``, ``native_layer_norm``...).

A raw name missing from the table is kept as the op name (``unmapped_ops`` lists those of a
graph, so the strategy registry can report ops without rules).

FLOP conventions (forward only, a multiply-add counts 2):

* ``linear``/``matmul``/``bmm``/``baddbmm``/``grouped_mm``: ``2 * M * N * K`` with batch dims, i.e.
  ``2 * out.numel * K``. Bias adds are not counted (the Megatron-LM convention, Narayanan et al.
  2021, eq. 3, counts only the GEMMs).
* ``sdpa``: ``2*b*h*sq*sk*d_qk + 2*b*h*sq*sk*d_v`` (= ``4*b*h*sq*sk*d``), the *full* score matrix
  even for causal attention, as Megatron-LM counts it (the causal mask halves the useful work,
  but the MFU convention charges the full product; kernels skip about half of it).
  ``FlopCounterMode`` counts zero for the CPU flash op, so attention is always counted here.
* ``einsum``: ``2 * prod(size of every index letter)`` for two operands.
* ``embedding``, ``view``, ``index``, ``cat`` and other data movement: 0.
* Elementwise, norms, softmax, losses: ``FLOP_PER_ELEMENT[op]`` per output element (per input
  element for reductions and losses). These are rough counts (softmax: max, subtract, exp, sum,
  divide = 5) - they matter for the roofline's memory side, not the FLOP side.

Bytes: every tensor operand read (parameters and buffers included) plus every output written,
unfused; ``view`` ops move nothing (0). For ``embedding``/``index`` only the gathered rows are
read from the table (the output's size), not the whole table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from autopar.graph import GraphIR, TensorMeta

_VIEW = "view"

OP_NAMES: dict[str, str] = {
    # --- torch.nn leaf modules (fx call_module), by class name
    "Linear": "linear",
    "LayerNorm": "layer_norm",
    "RMSNorm": "rms_norm",
    "Embedding": "embedding",
    "Dropout": "dropout",
    "GELU": "gelu",
    "SiLU": "silu",
    "ReLU": "relu",
    "Tanh": "tanh",
    "Sigmoid": "sigmoid",
    "Softmax": "softmax",
    "LogSoftmax": "log_softmax",
    "CrossEntropyLoss": "cross_entropy",
    "Identity": _VIEW,
    "Flatten": _VIEW,
    "Unflatten": _VIEW,
    # --- matrix products
    "linear": "linear",
    "addmm": "linear",
    "matmul": "matmul",
    "mm": "matmul",
    "bmm": "bmm",
    "baddbmm": "baddbmm",
    "einsum": "einsum",
    "grouped_mm": "grouped_mm",
    "_grouped_mm": "grouped_mm",
    "grouped_mm_fallback": "grouped_mm",  # transformers' custom op for MoE experts on CPU
    # --- attention
    "scaled_dot_product_attention": "sdpa",
    "_scaled_dot_product_flash_attention_for_cpu": "sdpa",
    "_scaled_dot_product_flash_attention": "sdpa",
    "_scaled_dot_product_efficient_attention": "sdpa",
    "_scaled_dot_product_cudnn_attention": "sdpa",
    "_scaled_dot_product_attention_math": "sdpa",
    # --- normalisation, activations, softmax, dropout, embedding, loss
    "layer_norm": "layer_norm",
    "native_layer_norm": "layer_norm",
    "rms_norm": "rms_norm",
    "_fused_rms_norm": "rms_norm",
    "softmax": "softmax",
    "_softmax": "softmax",
    "_safe_softmax": "softmax",
    "log_softmax": "log_softmax",
    "_log_softmax": "log_softmax",
    "dropout": "dropout",
    "native_dropout": "dropout",
    "feature_dropout": "dropout",
    "embedding": "embedding",
    "gelu": "gelu",
    "silu": "silu",
    "relu": "relu",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "exp": "exp",
    "cross_entropy": "cross_entropy",
    "cross_entropy_loss": "cross_entropy",
    # --- elementwise arithmetic (operator.* and torch.* and Tensor methods share names)
    "add": "add",
    "iadd": "add",
    "add_": "add",
    "mul": "mul",
    "imul": "mul",
    "mul_": "mul",
    "sub": "sub",
    "isub": "sub",
    "rsub": "sub",
    "truediv": "div",
    "div": "div",
    "div_": "div",
    "neg": "neg",
    "pow": "pow",
    "rsqrt": "rsqrt",
    "mean": "mean",
    "sum": "sum",
    "masked_fill": "masked_fill",
    "masked_fill_": "masked_fill",
    "where": "where",
    "topk": "topk",
    "cat": "cat",
    "concat": "cat",
    "concatenate": "cat",
    "stack": "cat",
    # --- gathers and scatters
    "index": "index",
    "index_select": "index",
    "gather": "index",
    "scatter": "scatter",
    "scatter_add": "scatter",
    "index_add": "scatter",
    "index_put": "scatter",
    "index_put_": "scatter",
    "index_copy": "scatter",
    # --- dtype casts ("view" when the dtype does not change, see ``canonical_op``)
    "to": "cast",
    "_to_copy": "cast",
    "type_as": "cast",
    "float": "cast",
    "half": "cast",
    "bfloat16": "cast",
    "type": "cast",
    # --- copies ("view" when the input is already contiguous, see ``canonical_op``)
    "contiguous": "contiguous",
    "clone": "contiguous",
}
"""Raw op name -> canonical op name (see the module docstring for what a raw name is)."""

for _raw in (
    "view", "reshape", "_unsafe_view", "transpose", "permute", "expand", "expand_as",
    "unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes", "chunk", "unbind",
    "t", "alias", "getitem", "getattr", "size", "dim", "flatten", "unflatten", "narrow",
    "as_strided", "view_as", "detach", "movedim", "swapaxes", "numel", "lift_fresh_copy",
):
    OP_NAMES[_raw] = _VIEW

CANONICAL_OPS: frozenset[str] = frozenset(OP_NAMES.values())
"""Every canonical op name the table emits."""

_SKIPPED = frozenset({"_assert_tensor_metadata", "_assert_scalar", "_assert_async",
                      "sym_constrain_range_for_size", "sym_constrain_range"})
"""Raw names of run-time assertions: no computation, not listed as nodes."""

FLOP_PER_ELEMENT: dict[str, float] = {
    "add": 1, "mul": 1, "sub": 1, "div": 1, "neg": 1, "pow": 1, "rsqrt": 1, "relu": 1,
    "exp": 1, "tanh": 1, "sigmoid": 1, "where": 1, "masked_fill": 1, "dropout": 1,
    "silu": 4,  # x * sigmoid(x): exp, add, divide, multiply
    "gelu": 5,  # tanh approximation: ~5 (cube, fma, tanh, add, multiply)
    "softmax": 5,  # max, subtract, exp, sum, divide
    "log_softmax": 5,
    "layer_norm": 5,  # mean, subtract, variance, normalise, affine
    "rms_norm": 4,  # square, mean, normalise, scale
}
"""Forward FLOPs per output element of cheap ops (rough counts, see the module docstring)."""

FLOP_PER_INPUT_ELEMENT: dict[str, float] = {
    "mean": 1, "sum": 1,
    "cross_entropy": 5,  # log-softmax over the logits (5) + gather + mean
}
"""Forward FLOPs per element of the first input, for reductions and losses."""


def is_skipped(raw: str) -> bool:
    """True for run-time assertion ops that are not listed as nodes."""
    return raw in _SKIPPED


def canonical_op(
    raw: str,
    operands: Sequence[object],
    outputs: Sequence[TensorMeta],
    *,
    tensor_index: bool = False,
    first_contiguous: bool = False,
) -> str:
    """The canonical op of a node whose raw name is ``raw`` (see ``OP_NAMES``).

    ``operands`` are the node's tensor operands (``TensorMeta``), ``tensor_index`` says that a
    ``getitem`` indexes with a tensor (a gather, not a view), and ``first_contiguous`` that the
    first operand is already contiguous (``contiguous`` is then a no-op view).
    """
    if not outputs:
        return _VIEW  # size arithmetic and attribute reads (x.shape, s // heads): no data moved
    op = OP_NAMES.get(raw, raw)
    if raw == "getitem" and tensor_index:
        return "index"
    if op == "cast":
        src = operands[0] if operands else None
        if isinstance(src, TensorMeta) and outputs and outputs[0].dtype == src.dtype:
            return _VIEW
    if op == "contiguous" and raw == "contiguous" and first_contiguous:
        return _VIEW
    return op


def _k_dim(op: str, raw: str, ins: Sequence[TensorMeta]) -> int:
    """Contraction length K of a matrix product, from its operands."""
    # addmm(bias, a, b) and baddbmm(bias, a, b) put the left factor second.
    left = ins[1] if raw in ("addmm", "baddbmm") and len(ins) > 1 else ins[0]
    return left.shape[-1] if left.shape else 1


def _einsum_flop(equation: str, ins: Sequence[TensorMeta]) -> float:
    """``2 * prod(index sizes)`` for a two-operand einsum; the input size for one operand."""
    terms = equation.replace(" ", "").split("->")[0].split(",")
    if len(terms) < 2:
        return float(ins[0].numel) if ins else 0.0
    sizes: dict[str, int] = {}
    for term, meta in zip(terms, ins):
        letters = [c for c in term if c.isalpha()]
        # "..." covers the leading dims that the letters do not name.
        extra = len(meta.shape) - len(letters)
        for i, d in enumerate(meta.shape[:extra]):
            sizes[f"...{i}"] = d
        for c, d in zip(letters, meta.shape[extra:]):
            sizes[c] = max(sizes.get(c, 1), d)
    return 2.0 * math.prod(sizes.values())


def forward_flop(
    op: str, raw: str, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta],
    scalars: Sequence[object] = (),
) -> float:
    """Forward FLOPs of one node (see the module docstring for the conventions)."""
    if not outs:
        return 0.0
    out = outs[0]
    if op in ("linear", "matmul", "bmm", "baddbmm", "grouped_mm") and ins:
        return 2.0 * out.numel * _k_dim(op, raw, ins)
    if op == "sdpa" and len(ins) >= 3:
        q, k, v = ins[0], ins[1], ins[2]
        rows = q.numel // q.shape[-1]  # b * heads * sq
        sk = k.shape[-2]
        return 2.0 * rows * sk * q.shape[-1] + 2.0 * rows * sk * v.shape[-1]
    if op == "einsum":
        equation = next((s for s in scalars if isinstance(s, str)), "")
        return _einsum_flop(equation, ins) if equation else 0.0
    if op in FLOP_PER_ELEMENT:
        return FLOP_PER_ELEMENT[op] * out.numel
    if op in FLOP_PER_INPUT_ELEMENT and ins:
        return FLOP_PER_INPUT_ELEMENT[op] * ins[0].numel
    return 0.0


def forward_bytes(op: str, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta]) -> float:
    """Bytes read and written by one node, unfused (0 for views)."""
    if op == _VIEW:
        return 0.0
    written = sum(t.nbytes for t in outs)
    if op in ("embedding", "index") and len(ins) >= 2:
        # Only the gathered rows of the table are read: as many bytes as the output holds,
        # plus the indices (the smaller operand).
        indices = min(ins, key=lambda t: t.nbytes)
        return float(2 * written + indices.nbytes)
    return float(sum(t.nbytes for t in ins) + written)


def unmapped_ops(graph: GraphIR | Iterable[str]) -> list[str]:
    """Op names in ``graph`` (or an iterable of op names) that ``OP_NAMES`` does not produce."""
    ops = (n.op for n in graph.nodes) if isinstance(graph, GraphIR) else graph
    return sorted({op for op in ops if op not in CANONICAL_OPS})
