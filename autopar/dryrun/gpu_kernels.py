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

* ``scaled_dot_product_attention`` with value heads narrower than the query and key heads
  (DeepSeek's multi-head latent attention: 192 and 128): the CPU build has no fused kernel for
  unequal head sizes and runs the math path, which keeps the (s x s) probabilities of every
  head -- 8.6 GiB a layer for DeepSeek-V3 at 4096 tokens --, where the GPU's fused kernels
  (memory-efficient, cuDNN) keep q, k, v, the output and the fp32 log-sum-exp per query row;
  its backward makes the three gradients and an fp32 row statistic, no score matrix.

* ``lower_right_attention`` (context parallelism's query chunks against the gathered keys up
  to their end, ``passes/context_parallel.py``): the GPU's fused causal kernel keeps what it
  keeps for any attention, and no mask; the CPU build materialises the (queries x keys) mask
  (``CausalBias`` outside a fused kernel), and a ``CausalBias`` cannot be made under the fake
  tensor mode at all.

``gpu_saved_tensors()`` installs them for the dry run; the real program never uses them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from autopar.passes import context_parallel


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
_SDPA = F.scaled_dot_product_attention
_LOWER_RIGHT = context_parallel.lower_right_attention


class _FusedAttention(torch.autograd.Function):
    """Attention as a fused GPU kernel keeps it: (q, k, v, output, fp32 log-sum-exp)."""

    @staticmethod
    def forward(ctx, q, k, v):  # type: ignore[no-untyped-def, override]
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` for the dry run: with unequal head sizes and no
    explicit mask or dropout, as the GPU's fused kernel keeps it (see the module docstring);
    every other call goes to torch's own."""
    if (query.size(-1) != value.size(-1) and attn_mask is None and dropout_p == 0.0
            and key.size(-3) == query.size(-3)):
        return _FusedAttention.apply(query, key, value)
    return _SDPA(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                 is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def lower_right_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                          dropout_p: float = 0.0, scale: float | None = None,
                          enable_gqa: bool = False, window: int | None = None) -> torch.Tensor:
    """``passes.context_parallel.lower_right_attention`` for the dry run: without a window as
    the fused causal kernel keeps it; a window's explicit band as the program runs it."""
    if window is None:
        return _FusedAttention.apply(q, k, v)
    return _LOWER_RIGHT(q, k, v, dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa,
                        window=window)


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
    """``F.rms_norm``, ``F.grouped_mm``, attention of unequal head sizes and context
    parallelism's lower-right causal attention as the GPU keeps them, while the program runs (see the module docstring)."""
    swapped = [("rms_norm", rms_norm),
               ("scaled_dot_product_attention", scaled_dot_product_attention)]
    if _GROUPED_MM is not None:
        swapped.append(("grouped_mm", grouped_mm))
    swaps = [(F, name, fn) for name, fn in swapped]
    swaps.append((context_parallel, "lower_right_attention", lower_right_attention))
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
    for owner, name, fn in swaps:
        setattr(owner, name, fn)
    try:
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)
