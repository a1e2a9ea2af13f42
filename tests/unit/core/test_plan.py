"""Plan: validation, byte-identical JSON round-trip, report, explain, diff."""

from __future__ import annotations

import pytest

import autopar
from autopar import ClusterSpec, ParallelConfig, TrainSpec
from autopar.costmodel.pipeline import even_partition
from autopar.core.plan import Plan, SolverInfo
from autopar.report.text import diff


@pytest.fixture(scope="module")
def plans() -> tuple[Plan, Plan]:
    model = autopar.models.build("gpt-7.5b", device="meta")
    train = TrainSpec(global_batch=256, seq_len=2048)
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=2)
    graph = autopar.trace(model, train)

    def make(config: ParallelConfig, alternatives=()) -> Plan:
        est = autopar.estimate(graph, cluster, train, config)
        return Plan(model="gpt-7.5b", cluster=cluster.name, nodes=cluster.nodes,
                    gpus_per_node=cluster.gpus_per_node, train=train, config=config,
                    estimate=est,
                    stage_blocks=even_partition(graph.num_blocks, config.pp).blocks,
                    block_strategies=(("qkv", "column"), ("proj", "row")),
                    alternatives=tuple(alternatives),
                    solver=SolverInfo("optimal", 0.0, 2, 0, wall_s=0.1))

    runner = make(ParallelConfig(dp=4, tp=2, pp=2, micro_batch=1, checkpoint="full"))
    best = make(ParallelConfig(dp=4, tp=4, micro_batch=2, zero=1, checkpoint="selective",
                               sequence_parallel=True), [runner])
    return best, runner


def test_json_round_trip_is_byte_identical(plans) -> None:
    best, _ = plans
    text = best.to_json()
    again = Plan.from_json(text)
    assert again.to_json() == text
    assert again.config == best.config
    assert again.alternatives[0].config == best.alternatives[0].config


def test_report_explain_and_diff_name_what_matters(plans) -> None:
    best, runner = plans
    report = best.report()
    for needle in ("Memory per GPU", "Time per step", "Runner-up plans", "dp4 tp4"):
        assert needle in report
    why = best.explain()
    assert "Chosen: dp4 tp4" in why and "#1 dp4 tp2 pp2" in why
    d = diff(best, runner)
    assert "tp: 4 -> 2" in d and "pp: 1 -> 2" in d and "step time" in d


def test_invalid_plans_raise_value_error(plans) -> None:
    best, _ = plans
    with pytest.raises(ValueError, match="stage sizes"):
        Plan(model="m", cluster="c", nodes=2, gpus_per_node=8, train=best.train,
             config=best.config, estimate=best.estimate, stage_blocks=(18, 18))
    with pytest.raises(ValueError, match="GPUs"):
        Plan(model="m", cluster="c", nodes=4, gpus_per_node=8, train=best.train,
             config=best.config, estimate=best.estimate, stage_blocks=(36,))
