"""Ops no family owns: what torch counts of them, and which ones autopar refuses.

The tracer traces into every ``torch.nn`` module the registry does not know
(``autopar/analysis/tracing.py``), down to the ATen ops where torch.fx cannot follow, so what is left
unknown is one function, Tensor method or ATen op. It is priced by the one rule *an op autopar
cannot see into is traced into, or refused, never free*:

* **torch counts its FLOPs** (``counted_flop``: ``torch.utils.flop_counter.FlopCounterMode``
  over the op run on meta tensors; torch's formulas cover ``mm``, ``addmm``, ``bmm``,
  ``baddbmm``, the convolutions and the attention kernels, and a composite op is counted
  through its decomposition): those FLOPs, on the matmul roofline (``registry.kind_of``),
  backward twice the forward as for a GEMM (every op torch counts is a GEMM, a convolution or
  attention, whose backward is two products of the forward's size).
* **torch counts none and it reads no parameter**: its bytes (operands read, outputs written)
  at HBM bandwidth, as for the registry's memory-bound ops. The argument: torch's counter omits
  exactly the ops whose arithmetic is a few operations per element they touch (elementwise math,
  reductions, copies, gathers), and at a few FLOPs per byte such an op sits far below the
  roofline's ridge point (an H100 SXM's 989 TFLOP/s dense bf16 over 3.35 TB/s is ~295 FLOP/B),
  so its time is its bytes' time. What it keeps for the backward is its inputs
  (``registry.save``'s conservative guess).
* **torch counts none and it reads parameters**: refused (``tracing_errors.opaque_op_error``).
  A parameterised op nobody counts is a layer computed out of sight (a custom kernel, a
  ``torch.library`` op, a weighted op torch has no formula for); pricing it as bytes could
  miss a GEMM's worth of time and the plan would be wrong without saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch.utils import _pytree as pytree

__all__ = ["counted_flop"]


def _on_meta(value: object) -> object:
    """A meta tensor of ``value``'s shape, strides and dtype (a tensor), else ``value``."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(tuple(int(d) for d in value.shape),
                                   tuple(int(s) for s in value.stride()), dtype=value.dtype,
                                   device="meta")
    return value


def counted_flop(fn: Callable[..., object], args: Sequence[object],
                 kwargs: Mapping[str, object]) -> float:
    """The forward FLOPs torch's ``FlopCounterMode`` counts for ``fn(*args, **kwargs)``, run on
    meta copies of the tensors (no data is read or allocated; a factory op runs under a fake
    mode). 0.0 when torch counts none, or when the op cannot run without data (``.item()``, a
    data-dependent size): torch then knows no FLOPs for it either."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    # here, not at import: torch's flop counter imports triton (about 0.1 s of every command's
    # start), and only a model with an op the registry does not know asks for it
    from torch.utils.flop_counter import FlopCounterMode

    meta_args, meta_kwargs = pytree.tree_map(_on_meta, (tuple(args), dict(kwargs)))
    counter = FlopCounterMode(display=False)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), counter, torch.no_grad():
            fn(*meta_args, **meta_kwargs)
    except Exception:  # noqa: BLE001 - an op that needs data has no count torch can give
        return 0.0
    return float(counter.get_total_flops())
