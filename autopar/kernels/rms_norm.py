"""Fused RMSNorm: ``y = x * rsqrt(mean(x**2, -1) + eps) * weight``, as ``nn.RMSNorm``.

Roofline. Per element the forward does 4 FLOPs (square, sum, two products) and moves two elements,
one read of x and one write of y: 1 FLOP/byte in bf16, against an H100's ridge point of about 295
FLOP/byte (989 dense bf16 TFLOP/s over 3.35 TB/s, the SXM datasheet). The op is memory bound, so
its bound is the copy bandwidth: 2 x rows x cols x element-size bytes per call. The kernel reaches
it by holding a whole row in registers between the reduction and the scale (``_launch.row_tile``);
eager PyTorch without a fused kernel reads x again after the reduction and writes the fp32 square.

Backward reads x and dy and writes dx (3 elements per element). It recomputes the row's rstd from x,
which it loads anyway, instead of saving it in the forward. The weight gradient is a sum over all
rows: each program of a persistent grid loops over row blocks, keeps its partial sum in fp32
registers and writes one row of a (programs x cols) buffer that torch sums; that buffer is
O(SMs x cols), nothing next to the rows x cols tensors.

Math (r = rstd, x^ = x r, g = dy * w, N = cols)::

    dx = r * (g - x^ * sum(g * x^) / N)        dw = sum over rows of dy * x^

The op is registered as ``torch.library.custom_op("autopar::rms_norm")`` with a fake and its
autograd (``register_autograd``: the tutorial's ``torch.autograd.Function`` in the form torch.fx
and torch.export keep as one opaque node, where they trace into an ``autograd.Function``); the
backward is its own op, ``autopar::rms_norm_backward``.
All math is fp32 in registers; loads and stores are in the tensors' dtypes; y has x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autopar.kernels._launch import (
    check_launchable,
    launch_row_backward,
    launch_row_forward,
    row_block,
)


@triton.jit
def _rms_norm_fwd_kernel(x_ptr, w_ptr, y_ptr, n_rows, n_cols, eps,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offsets, mask = row_block(tl.program_id(0), n_rows, n_cols, BLOCK_M, BLOCK_N)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, n_rows, n_cols, eps,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for block in range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        offsets, mask = row_block(block, n_rows, n_cols, BLOCK_M, BLOCK_N)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
        x_hat = x * rstd[:, None]
        g = dy * w[None, :]
        dx = rstd[:, None] * (g - x_hat * (tl.sum(g * x_hat, axis=1) / n_cols)[:, None])
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * x_hat, axis=0)
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=col_mask)


def _check_weight(x: torch.Tensor, weight: torch.Tensor) -> None:
    if weight.shape != x.shape[-1:]:
        raise ValueError(f"weight of shape {tuple(weight.shape)} for x of shape {tuple(x.shape)}: "
                         "it must be (x.shape[-1],)")


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Launch the forward kernel; returns y, contiguous, shaped and typed like x."""
    _check_weight(x, weight)
    check_launchable(x, weight)
    return launch_row_forward(_rms_norm_fwd_kernel, x, (weight.contiguous(),), eps)


def rms_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the backward kernel; returns (dx like x, dweight like weight)."""
    check_launchable(grad, x, weight)
    dx, (dw,) = launch_row_backward(_rms_norm_bwd_kernel, grad, x, weight, eps, n_sums=1)
    return dx, dw


@torch.library.custom_op("autopar::rms_norm", mutates_args=())
def _rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return rms_norm_forward(x, weight, eps)


@_rms_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_weight(x, weight)
    return x.new_empty(x.shape)


@torch.library.custom_op("autopar::rms_norm_backward", mutates_args=())
def _rms_norm_backward_op(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return rms_norm_backward(grad, x, weight, eps)


@_rms_norm_backward_op.register_fake
def _(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
      eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, ctx.eps = inputs
    ctx.save_for_backward(x, weight)


def _backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    x, weight = ctx.saved_tensors
    dx, dw = _rms_norm_backward_op(grad, x, weight, ctx.eps)
    return dx, dw, None


_rms_norm_op.register_autograd(_backward, setup_context=_setup_context)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim of ``x`` (any leading dims), scaled by ``weight``; fused kernel."""
    return _rms_norm_op(x, weight, eps)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Plain PyTorch: the same math in fp32, cast back to x's dtype (``nn.RMSNorm`` in fp32)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)
