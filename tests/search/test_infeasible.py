"""The error raised when nothing fits: the smallest footprint, how far off it is, what would fit."""

from __future__ import annotations

import dataclasses
import re

import pytest

import autopar
from autopar.core.estimate import Estimate
from autopar.search.infeasible import InfeasibleError, infeasible_error
from autopar.analysis.admissibility import ModelFacts

GIB = 2**30
CLUSTER = autopar.ClusterSpec.preset("dgx-a100-80g", nodes=1)  # 8 GPUs, 76 GiB usable


def _estimate(config: autopar.ParallelConfig, **gib: float) -> Estimate:
    """An estimate whose only meaningful parts are the config and the memory breakdown."""
    breakdown = {k: gib.get(k, 0.0) * GIB
                 for k in ("params", "grads", "optimizer", "activations", "buffers")}
    return Estimate(config=config, step_time_s=1.0, tokens_per_s=1.0, model_flops_per_step=1.0,
                    hardware_flops_per_step=1.0, mfu=0.5, hfu=0.5,
                    peak_memory_bytes=sum(breakdown.values()), memory_breakdown=breakdown,
                    time_breakdown={"compute": 1.0}, usable_memory_bytes=76.0 * GIB,
                    num_microbatches=8)


def test_model_states_dominate_gives_the_gpu_count_that_shards_them_enough() -> None:
    config = autopar.ParallelConfig(dp=1, tp=8, offload=True, checkpoint="full")
    est = _estimate(config, params=40, grads=40, activations=1)
    err = infeasible_error(est, CLUSTER, {})
    text = str(err)
    assert isinstance(err, InfeasibleError) and isinstance(err, autopar.AutoparError)
    assert err.smallest is est
    assert "dp1 tp8 pp1 zero0 mb1x8 ckpt:full offload" in text
    assert "needs 81.0 GiB per GPU but 76.0 GiB is usable, 5.0 GiB short" in text
    assert "params 40.0 + grads 40.0 + optimizer 0.0 (offloaded) + activations 1.0" in text
    assert "model states (params, grads, optimizer) are 99% of it" in text
    # 640 GiB of states over N GPUs beside 1 GiB: N >= 640 / 75 -> 9 GPUs, 2 nodes
    assert "use at least 9 GPUs (2 nodes of 8" in text and "an estimate" in text
    assert "\n" not in text


def test_constrained_zero_stage_is_named_with_the_zero3_footprint() -> None:
    config = autopar.ParallelConfig(dp=8, zero=1, checkpoint="full")
    est = _estimate(config, params=34, grads=34, optimizer=2, activations=10)
    text = str(infeasible_error(est, CLUSTER, {"zero": 1}))
    # replicated 34 + 34 GiB and 8 x 2 GiB optimizer shards: (34 + 34 + 16) / 8 + 10 = 20.5 GiB
    assert "relax the constraint zero=1, then use ZeRO-3 over the 8 dp*cp ranks (about " \
           "20.5 GiB per GPU" in text
    assert "offload the optimizer (frees its 2.0 GiB)" in text
    assert "drop the constraints zero=1: sharded over all 8 GPUs" in text
    assert "use at least" not in text  # 8 GPUs are enough once sharded
    assert "constraints: zero=1" in text


def test_activations_dominate_gives_recompute_and_micro_batch_advice() -> None:
    config = autopar.ParallelConfig(dp=8, zero=3, micro_batch=4, checkpoint="none")
    est = _estimate(config, params=1, grads=1, optimizer=1, activations=80, buffers=0.5)
    text = str(infeasible_error(est, CLUSTER, {"checkpoint": "none"}))
    assert "activations are 96% of it" in text
    assert "relax the constraint checkpoint=none, then use full recomputation" in text
    assert "use micro-batch 1 (activations about 20.0 GiB instead of 80.0)" in text
    assert "GPUs (" not in text  # more GPUs do not shrink activations


def test_activations_already_minimal_suggest_a_wider_sequence_split() -> None:
    config = autopar.ParallelConfig(dp=8, zero=3, checkpoint="full")
    est = _estimate(config, params=1, activations=80)
    text = str(infeasible_error(est, CLUSTER, {}))
    assert "use a larger tp or cp (each divides the 80.0 GiB of activations)" in text
    assert "full recomputation" not in text and "micro-batch 1" not in text


def test_no_valid_configuration_names_the_constraint_at_fault() -> None:
    text = str(infeasible_error(None, CLUSTER, {"tp": 3}))
    assert "tp=3 does not divide the 8 GPUs (divisors: 1, 2, 4, 8)" in text
    two = CLUSTER.with_nodes(2)
    text = str(infeasible_error(None, two, {"tp": 16, "dp": 1}, facts=ModelFacts(24, 24),
                                train=autopar.TrainSpec(global_batch=8)))
    assert "tp=16 does not divide the 24 attention heads" in text
    text = str(infeasible_error(None, two, {"dp": 16}, train=autopar.TrainSpec(global_batch=8)))
    assert "global batch 8 is not a multiple of dp=16" in text
    text = str(infeasible_error(None, CLUSTER, {"tp": 2, "pp": 4, "dp": 2, "cp": 1}))
    assert "dp*tp*pp*cp = 16 but the cluster has 8 GPUs" in text
    text = str(infeasible_error(None, CLUSTER, {"tp": 4, "pp": 4}))
    assert "tp*pp = 16 does not divide the 8 GPUs" in text
    # nothing this module can check: the general advice
    assert "relax the constraints" in str(infeasible_error(None, CLUSTER, {}))


def test_suggested_gpu_count_is_enough_for_the_search() -> None:
    model = autopar.models.build("gpt-1.7b", device="meta")
    train = autopar.TrainSpec(global_batch=48, seq_len=2048)
    # 0.9 GiB usable per GPU: the model states do not fit on one node even fully sharded
    small = dataclasses.replace(CLUSTER, hbm_reserved_bytes=CLUSTER.gpu.hbm_bytes - 9 * GIB // 10)
    with pytest.raises(InfeasibleError) as info:
        autopar.optimize(model, small, train, keep=1)
    assert info.value.smallest is not None and not info.value.smallest.fits
    found = re.search(r"use at least (\d+) GPUs \((\d+) nodes of 8", str(info.value))
    assert found, str(info.value)
    nodes = int(found.group(2))
    assert nodes > 1
    plan = autopar.optimize(model, small.with_nodes(nodes), train, keep=1)
    assert plan.estimate.fits and plan.config.world_size == 8 * nodes
