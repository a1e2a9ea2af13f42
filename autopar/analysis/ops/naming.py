"""From a raw op name to the canonical op of ``autopar.analysis.graph.NodeInfo``, for ``autopar.trace``.

torch.fx (``call_module`` of ``torch.nn`` leaves, ``call_function``, ``call_method``) and
torch.export (ATen overloads) name the same computation differently. The registry's
``OP_NAMES`` (every family's ops and aliases) maps a *raw name* to the canonical op:

* ``call_module``: the module's class name (``Linear``, ``LayerNorm``, ``GELU``...);
* ``call_function``: the function's ``__name__`` (``matmul``, ``add`` for ``operator.add``...);
* ``call_method``: the method name (``view``, ``softmax``...);
* ATen (export): the overload packet's name (``addmm``, ``_softmax``, ``native_layer_norm``...).

A raw name missing from the table is kept as the op name; ``unmapped_ops`` lists those the
registry does not know, which run replicated and are reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from autopar.analysis.graph import GraphIR, TensorMeta
from autopar.analysis.ops.registry import CANONICAL_OPS, OP_NAMES, VIEW, WIDEN

_SKIPPED = frozenset({"_assert_tensor_metadata", "_assert_scalar", "_assert_async",
                      "sym_constrain_range_for_size", "sym_constrain_range"})
"""Raw names of run-time assertions: no computation, not listed as nodes."""


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
    names_fp32: bool = False,
) -> str:
    """The canonical op of a node whose raw name is ``raw`` (see ``OP_NAMES``).

    ``operands`` are the node's tensor operands (``TensorMeta``), ``tensor_index`` says that a
    ``getitem`` indexes with a tensor (a gather, not a view), and ``first_contiguous`` that the
    first operand is already contiguous (``contiguous`` is then a no-op view). A cast to the
    dtype the tensor has is a view too, but for one that names fp32 (``names_fp32``:
    ``x.float()``, ``x.to(torch.float32)``) of an fp32 tensor: ``WIDEN``, which a model traced
    in fp32 and run in bf16 or fp16 runs as a copy into a 4-byte tensor (a router's or a
    norm's fp32 input), and in fp32 as the view it is.
    """
    if not outputs:
        return VIEW  # size arithmetic and attribute reads (x.shape, s // heads): no data moved
    op = OP_NAMES.get(raw, raw)
    if raw == "getitem" and tensor_index:
        return "index"
    if op == "cast":
        src = operands[0] if operands else None
        if isinstance(src, TensorMeta) and outputs and outputs[0].dtype == src.dtype:
            return WIDEN if names_fp32 and src.dtype is torch.float32 else VIEW
    if op == "contiguous" and raw == "contiguous" and first_contiguous:
        return VIEW
    return op


def unmapped_ops(graph: GraphIR | Iterable[str]) -> list[str]:
    """Op names in ``graph`` (or an iterable of op names) that the registry does not know."""
    ops = (n.op for n in graph.nodes) if isinstance(graph, GraphIR) else graph
    return sorted({op for op in ops if op not in CANONICAL_OPS})
