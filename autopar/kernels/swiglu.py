"""Fused SwiGLU activation: ``silu(gate) * up``, the middle of Llama's MLP (``models/llama/``).

Roofline. Per element the forward does about 5 FLOPs (an exp, a division, two products) and moves
three elements (read gate and up, write the product): under 1 FLOP/byte in bf16, so the bound is
the copy bandwidth, 3 x elements x element-size bytes. Eager PyTorch writes silu(gate) and reads it
back, 5 elements moved; the kernel keeps it in registers.

Backward reads gate, up and dy and writes dgate and dup (5 elements), recomputing the sigmoid
rather than saving it (s = sigmoid(gate))::

    dup = dy * gate * s          dgate = dy * up * s * (1 + gate * (1 - s))

Registered as ``torch.library.custom_op("autopar::swiglu")`` with a fake and its autograd (the
tutorial's ``torch.autograd.Function`` in the form torch.fx and torch.export keep opaque); the
backward is ``autopar::swiglu_backward``. Math in fp32; loads and stores in the inputs' dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from autopar.kernels._launch import element_block, launch_elementwise


@triton.jit
def _swiglu_fwd_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets, mask = element_block(n, BLOCK)
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(dy_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, n, BLOCK: tl.constexpr):
    offsets, mask = element_block(n, BLOCK)
    dy = tl.load(dy_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(gate)
    dup = dy * gate * s
    dgate = dy * up * s * (1.0 + gate * (1.0 - s))
    tl.store(dgate_ptr + offsets, dgate.to(dgate_ptr.dtype.element_ty), mask=mask)
    tl.store(dup_ptr + offsets, dup.to(dup_ptr.dtype.element_ty), mask=mask)


def _check_pair(gate: torch.Tensor, up: torch.Tensor) -> None:
    if gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} "
                         f"{up.dtype} must have one shape and dtype")


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Launch the forward kernel; returns ``silu(gate) * up``, contiguous, like gate."""
    _check_pair(gate, up)
    (out,) = launch_elementwise(_swiglu_fwd_kernel, (gate, up), like=gate, n_outputs=1)
    return out


def swiglu_backward(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the backward kernel; returns (dgate, dup), contiguous, like gate."""
    dgate, dup = launch_elementwise(_swiglu_bwd_kernel, (grad, gate, up), like=gate, n_outputs=2)
    return dgate, dup


@torch.library.custom_op("autopar::swiglu", mutates_args=())
def _swiglu_op(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return swiglu_forward(gate, up)


@_swiglu_op.register_fake
def _(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    _check_pair(gate, up)
    return gate.new_empty(gate.shape)


@torch.library.custom_op("autopar::swiglu_backward", mutates_args=())
def _swiglu_backward_op(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    return swiglu_backward(grad, gate, up)


@_swiglu_backward_op.register_fake
def _(grad: torch.Tensor, gate: torch.Tensor, up: torch.Tensor
      ) -> tuple[torch.Tensor, torch.Tensor]:
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return _swiglu_backward_op(grad, *ctx.saved_tensors)


_swiglu_op.register_autograd(_backward, setup_context=_setup_context)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` elementwise (same shape and dtype); fused kernel."""
    return _swiglu_op(gate, up)


def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch: the same math in fp32, cast back to the inputs' dtype."""
    return (torch.nn.functional.silu(gate.float()) * up.float()).to(gate.dtype)
