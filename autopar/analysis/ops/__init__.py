"""The op registry: what autopar knows of each op, in one place.

Every op family is one module here, declaring its canonical op names and the raw spellings the
tracer maps to them, its forward FLOPs and bytes, what autograd saves for its backward, its
strategy rule over the tensor-parallel ranks, and its fusion patterns (``registry.OpFamily``):

==================  ======================================================================
``gemm``            linear layers, products of activations, expert weights
``conv``            convolutions (1-, 2- and 3-d, transposed too)
``attention``       fused attention (``sdpa``)
``norm``            layer, RMS and group norm
``activation``      GELU, SiLU, ReLU and the other pointwise functions; GLU
``elementwise``     arithmetic, products, comparisons and selects, casts and copies
``dropout``         dropout
``view``            views (no data moved) and padding
``reduction``       softmax, reductions, joins, masks, top-k
``index``           gathers, scatters, routing, the embedding
``constant``        tensors made from nothing
``loss``            cross-entropy
==================  ======================================================================

Everything that needs op knowledge asks the registry: the tracer (``naming.canonical_op``,
``forward_flop``, ``forward_bytes``), the cost tables (``autopar.analysis.workload``: ``save``,
``kind_of``, ``kept_by_matmuls``, ``fusion.find_fusions``), the strategy solve
(``strategies_for``), the module styles (``is_weight_op``), the kernel pass (``PATTERNS``). It
is the one place that answers whether an op is known (``is_known``) and which ops have no rule
(``ops_without_rules``); ``opaque`` prices an op no family owns (torch's FLOP count, else its
bytes, else a refusal for one that reads parameters). The registry imports nothing of the
search, the passes or the cost model.
"""

from __future__ import annotations

from autopar.analysis.ops import (
    activation,
    attention,
    constant,
    conv,
    dropout,
    elementwise,
    gemm,
    index,
    loss,
    norm,
    reduction,
    view,
)
from autopar.analysis.ops.fusion import find_fusions, fused_bytes
from autopar.analysis.ops.gemm import attention_core, is_expert_gemm, is_weight_gemm, outer_regions
from autopar.analysis.ops.registry import (
    CANONICAL_OPS,
    FAMILIES,
    OP_NAMES,
    PATTERNS,
    VIEW,
    WIDEN,
    FusionPattern,
    OpFamily,
    Saver,
    family_of,
    forward_bytes,
    forward_flop,
    has_rule,
    is_known,
    is_weight_op,
    kept_by_matmuls,
    kind_of,
    ops_without_rules,
    register,
    returns_input,
    save,
    storage_of,
    strategies_for,
    unregister,
)

FAMILY_MODULES = (gemm, conv, attention, norm, activation, elementwise, dropout, view, reduction,
                  index, constant, loss)
"""The modules declaring the families (importing each registers its families)."""

__all__ = [
    "CANONICAL_OPS", "FAMILIES", "OP_NAMES", "PATTERNS", "VIEW", "WIDEN", "FusionPattern",
    "OpFamily",
    "Saver", "family_of", "find_fusions", "forward_bytes", "forward_flop",
    "attention_core", "fused_bytes", "has_rule", "is_expert_gemm", "is_known", "is_weight_gemm",
    "is_weight_op", "kept_by_matmuls", "kind_of", "ops_without_rules", "outer_regions", "register",
    "returns_input", "save", "storage_of", "strategies_for",
    "unregister",
]
