"""``models/grouped_gemm.py``: a dropless layer's experts in grouped GEMMs compute what the loop
of one GEMM per expert computes, forward and backward, with padded and empty groups."""

from __future__ import annotations

import pytest
import torch

from autopar.models import grouped_gemm
from autopar.models.grouped_gemm import GROUP_ALIGN_ROWS, grouped_mm_runs, padded_groups
from autopar.models.moe.model import Experts

pytestmark = pytest.mark.skipif(not hasattr(torch, "_grouped_mm"),
                                reason="this torch has no torch._grouped_mm")


def _grads(experts: Experts, x: torch.Tensor, counts: list[int], g: torch.Tensor):
    x = x.detach().clone().requires_grad_()
    experts.zero_grad()
    y = experts(x, counts=counts)
    y.backward(g)
    return [y.detach(), x.grad] + [p.grad for p in experts.parameters()]


@pytest.mark.parametrize("bias,limit,dtype,tol", [
    (False, None, torch.float32, 1e-5), (True, 7.0, torch.float32, 1e-5),
    (False, None, torch.bfloat16, 0.0)])
def test_grouped_experts_match_the_loop(monkeypatch, bias, limit, dtype, tol):
    """fp32 within 1e-5 (measured 6e-7: the GEMMs' summation order); bf16 equal (measured 0)."""
    torch.manual_seed(0)
    experts = Experts(6, 32, 24, bias=bias, limit=limit).to(dtype)
    for p in experts.parameters():
        torch.nn.init.normal_(p, std=0.1)
    counts = [5, 0, 8, 17, 1, 9]  # unaligned, aligned and empty groups
    x = torch.randn(sum(counts), 32, dtype=dtype)
    g = torch.randn(sum(counts), 32, dtype=dtype)
    assert grouped_mm_runs(x, experts.w_gate, experts.w_up, experts.w_down)
    grouped = _grads(experts, x, counts, g)
    monkeypatch.setattr("autopar.models.moe.model.grouped_mm_runs", lambda *a: False)
    loop = _grads(experts, x, counts, g)
    for a, b in zip(grouped, loop):
        assert float((a.float() - b.float()).abs().max()) <= tol


def test_padded_groups_place_each_row_in_its_aligned_group():
    counts = [5, 0, 8, 17]
    x = torch.arange(sum(counts), dtype=torch.float32).unsqueeze(1)
    rows, offs, where, group = padded_groups(x, counts)
    assert offs.tolist() == [8, 16, 24, 48]  # 5 -> 8, 0 -> 8 (at least one block), 8, 17 -> 24
    assert all(int(o) % GROUP_ALIGN_ROWS == 0 for o in offs)
    assert torch.equal(rows[where], x) and rows.size(0) == 48
    assert float(rows.sum()) == float(x.sum())  # the padding is zeros
    assert group.tolist() == [0] * 8 + [1] * 8 + [2] * 8 + [3] * 24
    aligned = torch.ones(16, 1)
    same, _, none, _ = padded_groups(aligned, [8, 8])
    assert none is None and same is aligned


def test_the_grouped_kernel_is_chosen_only_where_it_runs():
    x = torch.randn(8, 16)
    w = torch.randn(2, 16, 8)
    assert grouped_mm_runs(x, w)  # the CPU's fallback
    assert not grouped_mm_runs(x.half(), w.half())  # neither fp32 nor bf16
    assert not grouped_mm_runs(x, w.double())  # mixed dtypes
    assert grouped_gemm._probe(torch.device("cpu"), torch.float32)
