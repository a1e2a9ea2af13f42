"""The declared search space: valid candidates only, constraints honoured, pruning counted."""

from __future__ import annotations

import dataclasses

import pytest

from autopar.core.errors import AutoparError
from autopar.core.specs import Schedule, TrainSpec
from autopar.analysis.admissibility import ModelFacts
from autopar.search.space import SpaceStats, outer_candidates

GPT = ModelFacts(num_blocks=24, num_heads=24)


def test_every_candidate_is_valid_and_covers_the_gpus() -> None:
    train = TrainSpec(global_batch=512, seq_len=2048)
    stats = SpaceStats()
    configs = list(outer_candidates(32, GPT, train, stats=stats))
    assert configs and stats.enumerated == len(configs)
    for c in configs:
        assert c.world_size == 32
        assert GPT.num_heads % c.tp == 0
        assert train.global_batch % (c.dp * c.micro_batch) == 0
        assert c.schedule is not Schedule.GPIPE
        assert c.sequence_parallel == (c.tp > 1)
        assert c.zero >= 1 or c.dp * c.cp == 1
        if c.schedule is Schedule.INTERLEAVED:
            assert (GPT.num_blocks // c.pp) % c.virtual_stages == 0
    assert {"gpipe", "zero0", "no-sp"} <= set(stats.pruned)
    assert {(c.tp, c.pp) for c in configs} >= {(1, 1), (8, 1), (4, 2), (2, 4)}


def test_constraints_fix_decisions() -> None:
    train = TrainSpec(global_batch=512, seq_len=2048)
    configs = list(outer_candidates(32, GPT, train, {"tp": 4, "pp": 2, "schedule": "interleaved",
                                                     "checkpoint": "full", "zero": 0}))
    assert configs
    assert all((c.tp, c.pp, c.dp * c.cp, c.zero) == (4, 2, 4, 0) for c in configs)
    assert all(c.schedule is Schedule.INTERLEAVED and c.checkpoint == "full" for c in configs)


def test_moe_expert_parallel_divides_experts_and_the_ranks_it_folds_over() -> None:
    moe = ModelFacts(num_blocks=4, num_heads=8, num_kv_heads=2, num_experts=8)
    train = TrainSpec(global_batch=64, seq_len=1024)
    configs = list(outer_candidates(16, moe, train))
    eps = {c.ep for c in configs}
    assert {1, 2, 4, 8} <= eps
    # under sequence parallelism the experts' mesh folds over the tp ranks too (core.mesh)
    assert all(8 % c.ep == 0 and c.expert_ranks % c.ep == 0 for c in configs)
    assert any(c.ep > c.dp * c.cp for c in configs)  # ep spanning tp ranks is searched
    assert all(2 % c.tp == 0 for c in configs)  # kv heads bound tp
    # etp (the whole tp under the fold) only where ep x etp goes past the 8 experts: below,
    # ep x etp whole experts hold as much per rank without etp's gather and scatter
    split = [c for c in configs if c.etp > 1]
    assert split and all(c.etp == c.tp and c.sequence_parallel for c in split)
    assert all(c.ep * c.etp > 8 for c in split)
    assert {(c.ep, c.etp) for c in split} >= {(8, 2)}
    named = list(outer_candidates(16, moe, train, {"etp": 2, "ep": 2}))
    assert named and all(c.etp == 2 and c.ep == 2 for c in named)
    whole = dataclasses.replace(moe, etp_refused="its family does not say")
    assert all(c.etp == 1 for c in outer_candidates(16, whole, train))


def test_unknown_constraint_is_an_error() -> None:
    with pytest.raises(AutoparError, match="unknown constraint 'tensor'"):
        list(outer_candidates(8, GPT, TrainSpec(global_batch=8), {"tensor": 2}))
