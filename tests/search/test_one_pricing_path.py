"""One pricing path: ``autopar.estimate`` gives a configuration the price of the plan
``autopar.optimize`` returns when every ``ParallelConfig`` field is fixed to it -- the per-op
strategies solved for its tp, the stages cut as the search cuts them."""

from __future__ import annotations

import pytest

import autopar
from autopar import ClusterSpec, ParallelConfig, TrainSpec
from autopar.api import workload_of

CLUSTER = ClusterSpec.preset("dgx-a100-80g", nodes=1)
TRAIN = TrainSpec(global_batch=64, seq_len=2048)
CONFIGS = {
    "tp2-sp": ParallelConfig(dp=4, tp=2, micro_batch=1, zero=1, sequence_parallel=True,
                             checkpoint="selective"),
    # 1F1B stages are balanced by compute (the even cut would differ)
    "tp2-sp-pp2": ParallelConfig(dp=2, tp=2, pp=2, micro_batch=1, zero=1,
                                 sequence_parallel=True, schedule="1f1b", checkpoint="none"),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("name", ["gpt-1.7b", "llama3-8b"])
def test_estimate_equals_the_optimized_plan_of_the_same_configuration(
        name: str, config: ParallelConfig) -> None:
    model = autopar.models.build(name, device="meta")
    constraints = config.to_dict()
    assert set(constraints) == set(ParallelConfig.__dataclass_fields__)  # no freedom left
    plan = autopar.optimize(model, CLUSTER, TRAIN, constraints)
    assert plan.config == config
    est = autopar.estimate(model, CLUSTER, TRAIN, config)
    assert est.step_time_s == plan.estimate.step_time_s
    assert est.peak_memory_bytes == plan.estimate.peak_memory_bytes
    assert f"{est.step_time_s:.3f}" == f"{plan.estimate.step_time_s:.3f}"
    if config.pp > 1:
        assert tuple(sm.blocks for sm in est.stage_memory) == plan.stage_blocks


def test_a_workload_is_priced_as_given_with_tp_1_and_refused_with_more() -> None:
    model = autopar.models.build("tiny-gpt", device="meta")
    train = TrainSpec(global_batch=8, seq_len=32)
    work = workload_of(model, train)
    assert work.tp == 1 and work.block.params_tp == 0 and not work.block.tp_collectives
    config = ParallelConfig(dp=8, micro_batch=1)
    assert autopar.estimate(work, CLUSTER, train, config) == \
        autopar.estimate(model, CLUSTER, train, config)
    with pytest.raises(autopar.AutoparError, match="strategies for tp=1, the configuration has tp=2"):
        autopar.estimate(work, CLUSTER, train, ParallelConfig(dp=4, tp=2))


def test_every_entry_point_refuses_context_parallelism_without_fused_attention() -> None:
    """The traced graph tells whether there is a fused attention op for context parallelism
    (the module tree does not): ``strategies_of`` sets that fact for the search and for one
    configuration."""
    model = autopar.models.build("tiny-gpt", device="meta", attention="eager")
    train, cluster = TrainSpec(global_batch=8, seq_len=32), ClusterSpec.preset("hgx-h100-80g")
    config = ParallelConfig(dp=4, cp=2)
    for run in (lambda: autopar.optimize(model, cluster, train, {"cp": 2}),
                lambda: autopar.plan_for(model, cluster, train, config),
                lambda: autopar.estimate(model, cluster, train, config)):
        with pytest.raises(autopar.AutoparError, match="fused attention"):
            run()
