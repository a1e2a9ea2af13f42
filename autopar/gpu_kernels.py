"""What the dry run swaps in where the CPU build runs an op differently from the GPU's kernel.

The dry run (``autopar.dry_run``) executes a rank's program on fake tensors of the CPU build.
Where PyTorch runs an op on the GPU as one kernel but decomposes it on the CPU, autograd keeps
different tensors, and the dry run would account memory the GPU program never holds. Each
function here computes what the op computes and keeps for the backward exactly what the GPU
kernel's autograd formula keeps (``tools/autograd/derivatives.yaml`` of torch 2.13):

* ``rms_norm``: on CUDA ``F.rms_norm`` is ``_fused_rms_norm``, which keeps the input, the
  per-row fp32 ``rstd`` and the weight; the CPU's decomposition keeps fp32 copies of the input
  and of the normalised input (two tensors of 4 bytes an element), which on a Llama block at
  8192 tokens is a third more than the GPU's activations.

``gpu_saved_tensors()`` installs them for the dry run; the real program never uses them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F


class _RMSNorm(torch.autograd.Function):
    """``F.rms_norm`` keeping (input, rstd, weight) as CUDA's ``_fused_rms_norm`` does."""

    @staticmethod
    def forward(ctx, x, weight, dims, eps):  # type: ignore[no-untyped-def, override]
        xf = x.float()
        rstd = torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps)
        y = (xf * rstd).to(x.dtype)
        if weight is not None:
            y = y * weight
        ctx.save_for_backward(x, rstd, weight)
        ctx.dims = dims
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        x, rstd, weight = ctx.saved_tensors
        xhat = x.float() * rstd
        g = grad.float()
        grad_weight = None
        if weight is not None:
            rows = tuple(range(x.dim() - weight.dim()))
            grad_weight = (g * xhat).sum(rows).to(weight.dtype)
            g = g * weight.float()
        grad_x = rstd * (g - xhat * (g * xhat).mean(ctx.dims, keepdim=True))
        return grad_x.to(x.dtype), grad_weight, None, None


def rms_norm(x: torch.Tensor, normalized_shape: Sequence[int],
             weight: torch.Tensor | None = None, eps: float | None = None) -> torch.Tensor:
    """``F.rms_norm`` with the saved tensors of the CUDA kernel."""
    dims = tuple(range(-len(normalized_shape), 0))
    if eps is None:
        eps = torch.finfo(x.dtype if x.is_floating_point() else torch.float32).eps
    return _RMSNorm.apply(x, weight, dims, eps)


@contextmanager
def gpu_saved_tensors() -> Iterator[None]:
    """``F.rms_norm`` as the GPU keeps it, while the block runs (see the module docstring)."""
    original = F.rms_norm
    F.rms_norm = rms_norm  # type: ignore[assignment]
    try:
        yield
    finally:
        F.rms_norm = original  # type: ignore[assignment]
