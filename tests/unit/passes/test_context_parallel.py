"""The load-balanced split of a sequence over cp ranks and the query chunks' causal attention
(passes/context_parallel.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autopar.core.errors import AutoparError
from autopar.passes.context_parallel import (chunk_positions, lower_right_attention,
                                            sequence_shard)


@pytest.mark.parametrize("cp", [2, 4])
def test_each_rank_holds_chunk_i_and_its_mirror_and_together_every_position_once(cp):
    seq = 8 * cp
    c = seq // (2 * cp)
    held = [chunk_positions(seq, cp, r) for r in range(cp)]
    for r, positions in enumerate(held):
        expected = [*range(r * c, (r + 1) * c), *range((2 * cp - 1 - r) * c, (2 * cp - r) * c)]
        assert positions.tolist() == expected
    assert sorted(torch.cat(held).tolist()) == list(range(seq))


def test_sequence_shard_cuts_the_positions_chunk_positions_names():
    tokens = torch.arange(3 * 16).reshape(3, 16)
    for rank in range(4):
        shard = sequence_shard(tokens, 4, rank)
        assert torch.equal(shard, tokens[:, chunk_positions(16, 4, rank)])
    assert sequence_shard(tokens, 1, 0) is tokens


def test_a_sequence_that_does_not_cut_into_2cp_chunks_is_refused():
    with pytest.raises(AutoparError, match="2\\*cp = 4"):
        sequence_shard(torch.zeros(2, 10), 2, 0)


@pytest.mark.parametrize("window", [None, 3, 9])
@pytest.mark.parametrize("keys", [6, 10])
def test_lower_right_attention_is_the_queries_causal_rows_of_the_whole_attention(keys, window):
    """The last 4 query positions of a span of ``keys`` against its keys: the rows of the
    whole span's causal (and windowed) attention, values and gradients, GQA included."""
    torch.manual_seed(0)
    q = torch.randn(2, 4, keys, 8, dtype=torch.float64)
    k = torch.randn(2, 2, keys, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, keys, 8, dtype=torch.float64, requires_grad=True)
    behind = torch.arange(keys)[:, None] - torch.arange(keys)[None, :]
    mask = (behind >= 0) & (behind < (window or keys))
    whole = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)[:, :, -4:]
    tail = q[:, :, -4:].clone().requires_grad_()
    part = lower_right_attention(tail, k, v, enable_gqa=True, window=window)
    torch.testing.assert_close(part, whole, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad(part.square().sum(), (k, v))
    expected = torch.autograd.grad(whole.square().sum(), (k, v))
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_the_dry_run_keeps_no_mask_for_lower_right_attention():
    """Under the dry run's swap (``dryrun/gpu_kernels.py``) a causal chunk keeps what the fused
    kernel keeps, and a ``CausalBias`` (which fake tensors cannot make) is never built."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autopar.dryrun.gpu_kernels import gpu_saved_tensors
    from autopar.passes import context_parallel

    with FakeTensorMode(), gpu_saved_tensors():
        q = torch.randn(1, 4, 64, 16, requires_grad=True)
        k = torch.randn(1, 4, 256, 16, requires_grad=True)
        v = torch.randn(1, 4, 256, 16, requires_grad=True)
        out = context_parallel.lower_right_attention(q, k, v)
        saved = out.grad_fn.saved_tensors
    assert out.shape == (1, 4, 64, 16)
    assert type(out.grad_fn).__name__ == "_FusedAttentionBackward"
    assert [tuple(t.shape) for t in saved] == [(1, 4, 64, 16), (1, 4, 256, 16),
                                              (1, 4, 256, 16), (1, 4, 64, 16), (1, 4, 64)]
