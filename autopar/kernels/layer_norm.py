"""Fused LayerNorm over the last dim: ``y = (x - mean) * rsqrt(var + eps) * weight + bias``.

Roofline. Like RMSNorm (see ``rms_norm.py``): a handful of FLOPs per element against two elements
moved, about 1 FLOP/byte in bf16 and two orders of magnitude below a GPU's ridge point, so the
bound is the copy bandwidth, 2 x rows x cols x element-size bytes. One program holds whole rows in
registers: the mean, the variance (two-pass, from the registers, so no E[x^2] - E[x]^2
cancellation) and the affine map cost one read of x and one write of y.

Backward reads x and dy and writes dx, recomputing mean and rstd from the x it loads anyway. The
weight and bias gradients are sums over rows: a persistent grid loops over row blocks, each program
keeps fp32 partial sums in registers and writes one row of a (programs x cols) buffer that torch
sums (the Triton tutorial's layer-norm backward reduces its partials the same way, with locks).

Math (x^ = (x - mean) r, g = dy * w, N = cols)::

    dx = r * (g - mean(g) - x^ * mean(g * x^))     dw = sum over rows of dy * x^     db = sum of dy

Registered as ``torch.library.custom_op("autopar::layer_norm")`` with a fake and its autograd (the
tutorial's ``torch.autograd.Function`` in the form torch.fx and torch.export keep opaque); the
backward is ``autopar::layer_norm_backward``. ``bias`` may be None (``nn.LayerNorm(bias=False)``).
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
def _layer_norm_fwd_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
                           HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offsets, mask = row_block(tl.program_id(0), n_rows, n_cols, BLOCK_M, BLOCK_N)
    cols = tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=1) / n_cols
    xc = tl.where(mask, x - mean[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layer_norm_bwd_kernel(dy_ptr, x_ptr, w_ptr, dx_ptr, dw_partial_ptr, db_partial_ptr,
                           n_rows, n_cols, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    db = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for block in range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0)):
        offsets, mask = row_block(block, n_rows, n_cols, BLOCK_M, BLOCK_N)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=1) / n_cols
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / n_cols + eps)
        x_hat = xc * rstd[:, None]
        g = dy * w[None, :]
        g_mean = tl.sum(g, axis=1) / n_cols
        gx_mean = tl.sum(g * x_hat, axis=1) / n_cols
        dx = rstd[:, None] * (g - g_mean[:, None] - x_hat * gx_mean[:, None])
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += tl.sum(dy * x_hat, axis=0)
        db += tl.sum(dy, axis=0)
    tl.store(dw_partial_ptr + pid * n_cols + cols, dw, mask=col_mask)
    tl.store(db_partial_ptr + pid * n_cols + cols, db, mask=col_mask)


def _check_affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.shape != x.shape[-1:]:
            raise ValueError(f"{name} of shape {tuple(t.shape)} for x of shape {tuple(x.shape)}: "
                             "it must be (x.shape[-1],)")


def layer_norm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       eps: float) -> torch.Tensor:
    """Launch the forward kernel; returns y, contiguous, shaped and typed like x."""
    _check_affine(x, weight, bias)
    check_launchable(x, weight)
    # Without a bias the kernel never reads b_ptr; weight stands in for the pointer.
    params = (weight.contiguous(), weight if bias is None else bias.contiguous())
    return launch_row_forward(_layer_norm_fwd_kernel, x, params, eps, HAS_BIAS=bias is not None)


def layer_norm_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward kernel; returns (dx like x, dweight, dbias, both like weight)."""
    check_launchable(grad, x, weight)
    dx, (dw, db) = launch_row_backward(_layer_norm_bwd_kernel, grad, x, weight, eps, n_sums=2)
    return dx, dw, db


@torch.library.custom_op("autopar::layer_norm", mutates_args=())
def _layer_norm_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   eps: float) -> torch.Tensor:
    return layer_norm_forward(x, weight, bias, eps)


@_layer_norm_op.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
      eps: float) -> torch.Tensor:
    _check_affine(x, weight, bias)
    return x.new_empty(x.shape)


@torch.library.custom_op("autopar::layer_norm_backward", mutates_args=())
def _layer_norm_backward_op(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return layer_norm_backward(grad, x, weight, eps)


@_layer_norm_backward_op.register_fake
def _(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    x, weight, bias, ctx.eps = inputs
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight)


def _backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                                                 None]:
    x, weight = ctx.saved_tensors
    dx, dw, db = _layer_norm_backward_op(grad, x, weight, ctx.eps)
    return dx, dw, db if ctx.has_bias else None, None


_layer_norm_op.register_autograd(_backward, setup_context=_setup_context)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim of ``x`` (any leading dims) as ``F.layer_norm``; fused kernel."""
    return _layer_norm_op(x, weight, bias, eps)


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                         eps: float = 1e-5) -> torch.Tensor:
    """Plain PyTorch: ``F.layer_norm`` in fp32, cast back to x's dtype."""
    b = None if bias is None else bias.float()
    y = torch.nn.functional.layer_norm(x.float(), x.shape[-1:], weight.float(), b, eps)
    return y.to(x.dtype)
