"""The engine's pipeline stages are the plan's (``passes/stage.py:stage_layout``), the cut the
cost model prices and the exports write (``core/stages.py:stage_chunks``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.core.model_spec import ModelSpec
from autopar.core.stages import chunk_sizes
from autopar.costmodel.cluster import process_cluster
from autopar.passes.stage import stage_layout

SPEC = ModelSpec("tiny-llama", {"num_layers": 10})


def _plan(**fields) -> autopar.Plan:
    config = ParallelConfig(micro_batch=1, **fields)
    return autopar.plan_for(SPEC.build("meta"), process_cluster(config.world_size),
                            TrainSpec(global_batch=8, seq_len=16), config, name=SPEC.label)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_one_chunk_a_rank_runs_the_plans_own_uneven_stages(schedule):
    # llama3-405b's plan on 16 stages was [7, 8 x 14, 7] while the engine cut the interleaved
    # schedule's even chunks [8 x 14, 7, 7] whatever the plan said: rank 0's dry run held a
    # block more than priced (-13.4 %), rank 14 one fewer (+12.7 %)
    plan = replace(_plan(pp=4, schedule=schedule), stage_blocks=(2, 3, 3, 2))
    assert [len(r) for r in stage_layout(plan, 10)] == [2, 3, 3, 2]
    assert chunk_sizes(10, 4) == [3, 3, 2, 2]  # what the engine ran before


def test_more_chunks_a_rank_are_the_even_chunks_and_a_plan_that_is_not_them_is_refused():
    plan = _plan(pp=2, schedule="interleaved", virtual_stages=2)
    assert [len(r) for r in stage_layout(plan, 10)] == chunk_sizes(10, 4) == [3, 3, 2, 2]
    with pytest.raises(autopar.AutoparError, match="not the interleaved schedule's chunks"):
        stage_layout(replace(plan, stage_blocks=(4, 6)), 10)
