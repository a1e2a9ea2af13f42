"""Fused GELU, tanh form as GPT uses it (``nn.GELU(approximate="tanh")``, ``models/gpt/``).

``gelu(x) = 0.5 x (1 + tanh(z))`` with ``z = sqrt(2/pi) (x + 0.044715 x^3)``. Since
``0.5 (1 + tanh(z)) = sigmoid(2 z)``, the kernel computes ``x * sigmoid(2 z)``: the same function
without a tanh, which Triton's CPU interpreter lacks outside libdevice, and without the
cancellation of ``1 + tanh(z)`` for large negative z.

Roofline. About 10 FLOPs per element against two elements moved (read x, write y): 2.5 FLOP/byte
in bf16, far below a GPU's ridge point, so the bound is the copy bandwidth, 2 x elements x
element-size bytes. Backward reads x and dy and writes dx (3 elements), recomputing s =
sigmoid(2 z) from x::

    dx = dy * (s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2))

Registered as ``torch.library.custom_op("autopar::gelu")`` with a fake and its autograd (the
tutorial's ``torch.autograd.Function`` in the form torch.fx and torch.export keep opaque); the
backward is ``autopar::gelu_backward``. Math in fp32; loads and stores in x's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autopar.kernels._launch import element_block, launch_elementwise


@triton.jit
def _gelu_fwd_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets, mask = element_block(n, BLOCK)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # 0.7978845608028654 = sqrt(2/pi); literals, as a module constant reaches the kernel as a
    # constexpr, which Triton 3.9's interpreter does not mix with tensors.
    s = tl.sigmoid(2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x))
    tl.store(y_ptr + offsets, (x * s).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gelu_bwd_kernel(dy_ptr, x_ptr, dx_ptr, n, BLOCK: tl.constexpr):
    offsets, mask = element_block(n, BLOCK)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x))
    dz = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
    dx = dy * (s + 2.0 * x * s * (1.0 - s) * dz)
    tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def gelu_forward(x: torch.Tensor) -> torch.Tensor:
    """Launch the forward kernel; returns gelu(x), contiguous, like x."""
    (y,) = launch_elementwise(_gelu_fwd_kernel, (x,), like=x, n_outputs=1)
    return y


def gelu_backward(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Launch the backward kernel; returns dx, contiguous, like x."""
    (dx,) = launch_elementwise(_gelu_bwd_kernel, (grad, x), like=x, n_outputs=1)
    return dx


@torch.library.custom_op("autopar::gelu", mutates_args=())
def _gelu_op(x: torch.Tensor) -> torch.Tensor:
    return gelu_forward(x)


@_gelu_op.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op("autopar::gelu_backward", mutates_args=())
def _gelu_backward_op(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return gelu_backward(grad, x)


@_gelu_backward_op.register_fake
def _(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: torch.Tensor) -> torch.Tensor:
    (x,) = ctx.saved_tensors
    return _gelu_backward_op(grad, x)


_gelu_op.register_autograd(_backward, setup_context=_setup_context)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation, elementwise; fused kernel."""
    return _gelu_op(x)


def gelu_reference(x: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch: ``F.gelu(approximate="tanh")`` in fp32, cast back to x's dtype."""
    return torch.nn.functional.gelu(x.float(), approximate="tanh").to(x.dtype)
