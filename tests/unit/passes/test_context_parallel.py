"""The load-balanced split of a sequence over cp ranks (passes/context_parallel.py)."""

from __future__ import annotations

import pytest
import torch

from autopar.core.errors import AutoparError
from autopar.passes.context_parallel import chunk_positions, sequence_shard


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
