"""Fused Triton kernels, one op per module, each with a plain-PyTorch ``<op>_reference``.

``rms_norm(x, weight, eps)``, ``layer_norm(x, weight, bias, eps)``, ``swiglu(gate, up)``,
``gelu(x)`` (tanh form), ``rope(q, k, cos, sin)`` and ``linear_cross_entropy(hidden, weight,
target, ignore_index=-100)``; every op is also ``torch.ops.autopar.<op>``, a custom op with a fake
and autograd, so torch.fx and torch.export keep it as one node.

Importing this package imports Triton, which decides then, once per process, whether kernels run
compiled for the GPU or in its CPU interpreter (``TRITON_INTERPRET=1``); nothing is launched or
queried at import. ``available()`` says whether the kernels can launch here.
"""

from autopar.kernels._launch import available
from autopar.kernels.gelu import gelu, gelu_reference
from autopar.core.specs import KERNEL_FUSIONS
from autopar.kernels.layer_norm import layer_norm, layer_norm_reference
from autopar.kernels.linear_cross_entropy import (
    linear_cross_entropy,
    linear_cross_entropy_reference,
)
from autopar.kernels.rms_norm import rms_norm, rms_norm_reference
from autopar.kernels.rope import rope, rope_reference
from autopar.kernels.swiglu import swiglu, swiglu_reference

KERNELS: tuple[str, ...] = KERNEL_FUSIONS
"""The public ops: each the name of its module, of its function and of ``torch.ops.autopar.*``;
the fusions of the same names (``autopar.core.specs.KERNEL_FUSIONS``, the one list)."""

__all__ = [
    "KERNELS",
    "available",
    "gelu",
    "gelu_reference",
    "layer_norm",
    "layer_norm_reference",
    "linear_cross_entropy",
    "linear_cross_entropy_reference",
    "rms_norm",
    "rms_norm_reference",
    "rope",
    "rope_reference",
    "swiglu",
    "swiglu_reference",
]
