"""A kernel against its plain-PyTorch reference, forward and backward, with written tolerances.

Shared by ``tests/kernels`` (CPU, Triton's interpreter) and ``tests/gpu`` (compiled kernels), as is
``bench_module``, the benchmark script loaded as a module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

import torch
from bench_scripts import BENCH, load

BENCH_SCRIPT = BENCH / "fused_kernels.py"

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}
"""Relative tolerance by the dtype of the inputs (the fused loss returns fp32 for bf16 inputs
too), and the absolute one as a fraction of the expected tensor's largest magnitude (an element
near zero of a gradient differs on the scale of its tensor, not of itself).
fp32: kernel and reference differ only in the order of fp32 sums, up to ~5e-6 relative on the
test shapes. bf16: both compute in fp32 and round to bf16 once (at most 2^-8 relative), so they
differ by about one rounding; 1.6e-2 (torch.testing's default bf16 rtol) is about two units in the
last place, which also covers the fused loss's weight gradient, rounded to bf16 once per chunk."""


def assert_close_scaled(actual: torch.Tensor, expected: torch.Tensor, tol: float,
                        what: str) -> None:
    """``actual`` matches ``expected`` to ``tol`` relative, and ``tol`` of its largest magnitude."""
    assert actual.dtype == expected.dtype, f"{what}: {actual.dtype} != {expected.dtype}"
    scale = expected.detach().float().abs().max().item() if expected.numel() else 0.0
    torch.testing.assert_close(actual.detach(), expected.detach(), rtol=tol, atol=tol * scale,
                               equal_nan=True, msg=lambda m: f"{what}: {m}")


def _run(fn: Callable, inputs: Sequence, seed: int) -> tuple[list[torch.Tensor], list]:
    args = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor)
            else a for a in inputs]
    out = fn(*args)
    outs = list(out) if isinstance(out, tuple) else [out]
    generator = torch.Generator().manual_seed(seed)
    upstream = [torch.randn(o.shape, generator=generator).to(o) for o in outs]
    torch.autograd.backward(outs, upstream)
    grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    return outs, grads


def assert_matches_reference(op: Callable, reference: Callable, inputs: Sequence,
                             seed: int = 0) -> None:
    """Outputs of ``op(*inputs)`` and ``reference(*inputs)``, and the gradients of every input
    that requires grad under one random upstream gradient, agree within ``TOLERANCE``."""
    tol = TOLERANCE[next(a.dtype for a in inputs if isinstance(a, torch.Tensor))]
    outs, grads = _run(op, inputs, seed)
    ref_outs, ref_grads = _run(reference, inputs, seed)
    assert len(grads) == len(ref_grads) and all(g is not None for g in grads), "missing gradient"
    for i, (actual, expected) in enumerate(zip(outs, ref_outs, strict=True)):
        assert actual.shape == expected.shape, f"output {i}: {actual.shape} != {expected.shape}"
        assert_close_scaled(actual, expected, tol, f"output {i}")
    for i, (actual, expected) in enumerate(zip(grads, ref_grads, strict=True)):
        assert_close_scaled(actual, expected, tol, f"gradient of input {i}")


def bench_module() -> ModuleType:
    """``bench/fused_kernels.py`` as the module ``bench_kernels``."""
    return load("fused_kernels", "bench_kernels")
