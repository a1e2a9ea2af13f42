"""Fused rotary position embedding, rotate-half form: ``x * cos + rotate_half(x) * sin``.

As ``apply_rope`` in ``models/llama/``: q and k are (batch, heads, seq, head_dim), possibly with
different head counts (grouped-query attention) and in any layout whose last dim is contiguous
(the models pass ``view(b, s, h, d).transpose(1, 2)``, read in place here, no copy); cos and sin
are (seq, head_dim) tables, fp32 in the models. With x = [x1, x2] split in halves of head_dim and
the tables split the same way::

    y1 = x1 cos1 - x2 sin1        y2 = x2 cos2 + x1 sin2

Roofline. 3 FLOPs per element against two elements moved (read x, write y), so the bound is the
copy bandwidth, 2 x (q + k elements) x element-size bytes. One program takes one (batch, seq)
position of one tensor, all its heads at once, so the position's cos and sin rows are read once per
program for every head (from L2 across the batch), and both halves of each head are in registers.

Backward is the transposed rotation, the same kernel with ``BACKWARD`` set (reads dy, writes dx)::

    dx1 = dy1 cos1 + dy2 sin2     dx2 = dy2 cos2 - dy1 sin1

cos and sin are treated as constants (no gradient), as the models hold them in buffers. Registered
as ``torch.library.custom_op("autopar::rope")`` with a fake and its autograd (the tutorial's
``torch.autograd.Function`` in the form torch.fx and torch.export keep opaque); the backward is
``autopar::rope_backward``. Math in fp32; q and k are loaded and stored in their own dtypes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autopar.kernels._launch import check_launchable, num_warps_for


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, seq_len, n_heads, half,
                 x_stride_b, x_stride_h, x_stride_s, y_stride_b, y_stride_h, y_stride_s,
                 BACKWARD: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    position = tl.program_id(0).to(tl.int64)
    b = position // seq_len
    s = position % seq_len
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    dim_mask = dims < half
    mask = (heads[:, None] < n_heads) & dim_mask[None, :]
    table = cos_ptr + s * 2 * half + dims
    cos1 = tl.load(table, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    cos2 = tl.load(table + half, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    table = sin_ptr + s * 2 * half + dims
    sin1 = tl.load(table, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    sin2 = tl.load(table + half, mask=dim_mask, other=0.0).to(tl.float32)[None, :]
    x_at = x_ptr + b * x_stride_b + s * x_stride_s + heads[:, None] * x_stride_h + dims[None, :]
    x1 = tl.load(x_at, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_at + half, mask=mask, other=0.0).to(tl.float32)
    if BACKWARD:
        y1 = x1 * cos1 + x2 * sin2
        y2 = x2 * cos2 - x1 * sin1
    else:
        y1 = x1 * cos1 - x2 * sin1
        y2 = x2 * cos2 + x1 * sin2
    y_at = y_ptr + b * y_stride_b + s * y_stride_s + heads[:, None] * y_stride_h + dims[None, :]
    tl.store(y_at, y1.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_at + half, y2.to(y_ptr.dtype.element_ty), mask=mask)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must be "
                         "(batch, heads, seq, head_dim)")
    b, _, s, d = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (b, s, d):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on batch, seq "
                         "and head_dim")
    if d % 2:
        raise ValueError(f"head_dim {d} must be even for the rotate-half RoPE")
    for name, table in (("cos", cos), ("sin", sin)):
        if table.shape != (s, d):
            raise ValueError(f"{name} of shape {tuple(table.shape)} must be (seq, head_dim) = "
                             f"{(s, d)}")


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool) -> torch.Tensor:
    """Launch one rotation of x (batch, heads, seq, head_dim); y is laid out like x."""
    x = _last_dim_contiguous(x)
    y = torch.empty_like(x)
    b, h, s, d = x.shape
    if x.numel():
        block_h, block_d = triton.next_power_of_2(h), triton.next_power_of_2(d // 2)
        _rope_kernel[(b * s,)](
            x, cos, sin, y, s, h, d // 2, x.stride(0), x.stride(1), x.stride(2),
            y.stride(0), y.stride(1), y.stride(2), BACKWARD=backward, BLOCK_H=block_h,
            BLOCK_D=block_d, num_warps=num_warps_for(2 * block_h * block_d))
    return y


def rope_apply(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               backward: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q and k (``backward``: by the transposed rotation, for their gradients)."""
    _check_shapes(q, k, cos, sin)
    check_launchable(q, k, cos, sin)
    cos, sin = cos.contiguous(), sin.contiguous()
    return _rotate(q, cos, sin, backward), _rotate(k, cos, sin, backward)


@torch.library.custom_op("autopar::rope", mutates_args=())
def _rope_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_apply(q, k, cos, sin)


@torch.library.custom_op("autopar::rope_backward", mutates_args=())
def _rope_backward_op(dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_apply(dq, dk, cos, sin, backward=True)


@_rope_op.register_fake
@_rope_backward_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
      ) -> tuple[torch.Tensor, torch.Tensor]:
    _check_shapes(q, k, cos, sin)
    return torch.empty_like(_last_dim_contiguous(q)), torch.empty_like(_last_dim_contiguous(k))


def _setup_context(ctx, inputs: tuple, output: tuple) -> None:
    ctx.save_for_backward(*inputs[2:])


def _backward(ctx, dq: torch.Tensor, dk: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                 None, None]:
    cos, sin = ctx.saved_tensors
    dq, dk = _rope_backward_op(dq, dk, cos, sin)
    return dq, dk, None, None


_rope_op.register_autograd(_backward, setup_context=_setup_context)


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated by the (seq, head_dim) tables, as ``apply_rope`` on each; fused kernel."""
    return _rope_op(q, k, cos, sin)


def rope_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch: ``x * cos + rotate_half(x) * sin`` in fp32, cast back to each dtype."""

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return (xf * cos.float() + torch.cat((-x2, x1), dim=-1) * sin.float()).to(x.dtype)

    return rotate(q), rotate(k)
