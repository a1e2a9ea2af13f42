"""The cost model prices the expert parallelism the passes run (``costmodel/step.py``):
a capacity layer's static slots, a dropless layer's rows grown by the load imbalance, and the
all-to-all count of ``ep_alltoalls``."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.core.specs import Checkpoint
from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY
from autopar.costmodel.moe import ep_alltoalls
from autopar.costmodel.step import estimate_step
from autopar.models.training import ModelSpec

TRAIN = TrainSpec(global_batch=64, seq_len=32)
CONFIG = ParallelConfig(dp=8, ep=4, zero=1, micro_batch=8)


def _workload(overrides: dict):
    return autopar.workload_of(ModelSpec("tiny-moe", overrides).build("meta"), TRAIN)


def _ep_seconds(workload, imbalance: float) -> float:
    eff = dataclasses.replace(DEFAULT_EFFICIENCY, moe_load_imbalance=imbalance)
    est = estimate_step(workload, ClusterSpec.preset("hgx-h100-80g"), TRAIN, CONFIG,
                        efficiency=eff)
    return est.time_breakdown["comm_ep"]


def test_capacity_layers_move_their_static_slots_whatever_the_imbalance():
    work = _workload({"capacity_factor": 1.25})
    assert not work.block.ep_dropless
    # (E, C, h) per sequence: C = ceil(1.25 * 2 * 32 / 4) = 20 slots of the 4 experts
    assert work.block.ep_alltoall_elements == 4 * 20 * 64
    assert _ep_seconds(work, 1.0) == _ep_seconds(work, 1.5) > 0


def test_dropless_layers_move_the_mean_rows_times_the_imbalance():
    work = _workload({"capacity_factor": None})
    assert work.block.ep_dropless
    assert work.block.ep_alltoall_elements == 2 * 32 * 64  # top_k * T rows of h
    assert _ep_seconds(work, 1.5) > _ep_seconds(work, 1.0)


@pytest.mark.parametrize("dropless,policy,expected", [
    (False, Checkpoint.NONE, (2, 2)), (False, Checkpoint.FULL, (2, 4)),
    (True, Checkpoint.NONE, (3, 2)), (True, Checkpoint.MATMULS, (3, 5)),
])
def test_all_to_alls_per_layer_follow_the_mode_and_the_recompute(dropless, policy, expected):
    work = _workload({"capacity_factor": None if dropless else 1.25})
    assert ep_alltoalls(work.block, policy) == expected
