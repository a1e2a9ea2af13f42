"""Which roofline an op runs on: the word the op registry (``autopar.analysis.ops``) gives each op and the
cost model (``costmodel.compute``) prices it by."""

from __future__ import annotations

from enum import StrEnum


class OpKind(StrEnum):
    """Which roofline an op runs on."""

    MATMUL = "matmul"
    """Tensor-core GEMM: linear, matmul, bmm."""
    ATTENTION = "attention"
    """Fused attention kernel (flash / SDPA)."""
    MEMORY = "memory"
    """Memory-bound: elementwise, norms, softmax, dropout, loss, copies."""
    FREE = "free"
    """Views and metadata: no kernel."""
