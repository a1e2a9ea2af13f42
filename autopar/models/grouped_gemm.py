"""Every local expert of a dropless layer in one grouped GEMM (``torch._grouped_mm``), as
Megatron-Core's ``--moe-grouped-gemm`` and torchtitan's ``GroupedExperts`` run them, in place
of one GEMM per expert.

The rows come sorted by expert, ``counts[i]`` of them for expert ``i``. Each group is padded
with zero rows to a multiple of ``GROUP_ALIGN_ROWS`` and to at least that many, as torchtitan
pads them for this kernel (``TOKEN_GROUP_ALIGN_SIZE_M``, 8 rows in bf16, an empty group clamped
to 8); the GEMMs run on the padded rows with the groups' ends as ``offs``, and the real rows are
picked back out. A padded row is zero in and
is never picked, so it adds nothing to any gradient.

Where the grouped kernel runs (``grouped_mm_runs``): the CPU (ATen's fallback, fp32 or bf16),
and CUDA in bf16 with widths that are multiples of 8 where a one-time probe of the
kernel -- forward and backward, the layouts the experts use, an empty group -- matches a loop
of GEMMs; elsewhere (an older torch, fp32 on CUDA, a card without the kernel) the experts
loop, as before. On one H200 (``bench/results/gpu-moe-step-h200.md``, 2026-11-28) a 4-layer
Qwen3-30B-A3B slice's dropless step, its 128 experts in that loop, ran 8.6-10.4x slower than
priced; the grouped form has not yet run on a GPU.
"""

from __future__ import annotations

import warnings
from itertools import accumulate

import torch

GROUP_ALIGN_ROWS = 8
"""Rows per group padded to a multiple of this, and to at least this (see the module
docstring)."""

_PROBED: dict[tuple[str, int | None, torch.dtype], bool] = {}


def grouped_mm_runs(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` computes these rows ``x`` (rows, h) against the stacked
    ``weights`` (E, in, out) here (see the module docstring)."""
    if not hasattr(torch, "_grouped_mm") or x.dtype not in (torch.float32, torch.bfloat16):
        return False
    if any(w.dtype != x.dtype or w.device != x.device for w in weights):
        return False
    if x.device.type == "cpu":
        return True
    if x.device.type != "cuda" or x.dtype != torch.bfloat16:
        return False
    if any(d % 8 for w in weights for d in w.shape[1:]):
        return False
    key = (x.device.type, x.device.index, x.dtype)
    if key not in _PROBED:
        _PROBED[key] = _probe(x.device, x.dtype)
    return _PROBED[key]


def _probe(device: torch.device, dtype: torch.dtype) -> bool:
    """One tiny grouped GEMM, forward and backward, against a loop of GEMMs on ``device``."""
    g = torch.Generator(device="cpu").manual_seed(0)
    counts = [16, 0, 8, 24]
    x = torch.randn(sum(counts), 32, generator=g).to(device, dtype).requires_grad_()
    w = torch.randn(len(counts), 32, 16, generator=g).to(device, dtype).requires_grad_()
    try:
        rows, offs, where, _ = padded_groups(x, counts)
        out = torch._grouped_mm(rows, w, offs=offs)
        out = out if where is None else out.index_select(0, where)
        out.square().sum().backward()
        got = (out.detach().float(), x.grad.float(), w.grad.float())
        x.grad = w.grad = None
        ref = torch.cat([p @ w[i] for i, p in enumerate(torch.split(x, counts))])
        ref.square().sum().backward()
        want = (ref.detach().float(), x.grad.float(), w.grad.float())
        ok = all(torch.allclose(a, b, rtol=2e-2, atol=2e-2) for a, b in zip(got, want))
    except RuntimeError as err:
        warnings.warn(f"torch._grouped_mm does not run on {device} in {dtype} ({err}); the "
                      "experts run as a loop of GEMMs", stacklevel=3)
        return False
    if not ok:
        warnings.warn(f"torch._grouped_mm on {device} in {dtype} does not match a loop of "
                      "GEMMs on a probe; the experts run as a loop of GEMMs", stacklevel=3)
    return ok


def padded_groups(x: torch.Tensor, counts: list[int]
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(the padded rows, ``offs`` (E,) int32: each group's end in them, where each row of ``x``
    is in them or ``None`` when no row moved, each padded row's expert (rows,) int64)."""
    padded = [max(GROUP_ALIGN_ROWS, -(-c // GROUP_ALIGN_ROWS) * GROUP_ALIGN_ROWS)
              for c in counts]
    ends = list(accumulate(padded))
    device = x.device
    offs = torch.tensor(ends, dtype=torch.int32, device=device)
    experts = torch.arange(len(counts), device=device)
    group = torch.repeat_interleave(experts, torch.tensor(padded, device=device),
                                    output_size=ends[-1] if ends else 0)
    if padded == counts:
        return x, offs, None, group
    shift = [end - p - start for end, p, start in zip(ends, padded, accumulate([0] + counts))]
    where = torch.arange(x.size(0), device=device) + torch.repeat_interleave(
        torch.tensor(shift, device=device), torch.tensor(counts, device=device),
        output_size=x.size(0))
    rows = x.new_zeros(ends[-1], x.size(-1)).index_copy(0, where, x)
    return rows, offs, where, group
