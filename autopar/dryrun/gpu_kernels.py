"""What the dry run swaps in where the CPU build runs an op differently from the GPU's kernel.

The dry run (``autopar.dryrun.run``) executes a rank's program on fake tensors of the CPU build.
Where PyTorch runs an op on the GPU as one kernel but decomposes it on the CPU, autograd keeps
different tensors, and the dry run would account memory the GPU program never holds. Each
function here computes what the op computes and keeps for the backward exactly what the GPU
kernel's autograd formula keeps (``tools/autograd/derivatives.yaml`` of torch 2.13):

* ``rms_norm``: on CUDA ``F.rms_norm`` is ``_fused_rms_norm``, which keeps the input, the
  per-row fp32 ``rstd`` and the weight; the CPU's decomposition keeps fp32 copies of the input
  and of the normalised input (two tensors of 4 bytes an element), which on a Llama block at
  8192 tokens is a third more than the GPU's activations.

* ``grouped_mm``: transformers' stacked experts run ``F.grouped_mm`` (tokens (S, K) by each
  expert's weight of (E, K, N), grouped by ``offs``). Its fake kernel in torch 2.13 takes bf16
  operands only, as the CUDA kernel does, so an fp32 plan's dry run failed on it; the dry run
  computes its output shape (S, N) itself and keeps the two operands for the backward, which is
  what the kernel's autograd formula keeps (the backward is two more grouped products of the
  same sizes).

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


class _GroupedMM(torch.autograd.Function):
    """Tokens (S, K) by grouped weights (E, K, N): output (S, N), keeping both operands."""

    @staticmethod
    def forward(ctx, a, b, offs, dtype):  # type: ignore[no-untyped-def, override]
        ctx.save_for_backward(a, b, offs)
        return a.new_empty((a.shape[0], b.shape[-1]), dtype=dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        a, b, _ = ctx.saved_tensors
        return torch.empty_like(a), torch.empty_like(b), None, None


_GROUPED_MM = F.grouped_mm if hasattr(F, "grouped_mm") else None


def grouped_mm(mat_a: torch.Tensor, mat_b: torch.Tensor, *, offs: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype | None = None
               ) -> torch.Tensor:
    """``F.grouped_mm`` for the dry run's fake tensors of any dtype (see the module
    docstring); the forms other than tokens by grouped weights go to torch's own."""
    if mat_a.dim() == 2 and mat_b.dim() == 3 and offs is not None and bias is None:
        return _GroupedMM.apply(mat_a, mat_b, offs, out_dtype or mat_a.dtype)
    assert _GROUPED_MM is not None  # installed only where torch has it
    return _GROUPED_MM(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)


@contextmanager
def gpu_saved_tensors() -> Iterator[None]:
    """``F.rms_norm`` and ``F.grouped_mm`` as the GPU keeps them, while the program runs (see
    the module docstring)."""
    swapped = [("rms_norm", rms_norm)]
    if _GROUPED_MM is not None:
        swapped.append(("grouped_mm", grouped_mm))
    originals = [(name, getattr(F, name)) for name, _ in swapped]
    for name, fn in swapped:
        setattr(F, name, fn)
    try:
        yield
    finally:
        for name, fn in originals:
            setattr(F, name, fn)
