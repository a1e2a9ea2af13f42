"""The strategy rules and the per-op solve: Megatron's split is found, not written in."""

from __future__ import annotations

import pytest

import autopar
from autopar.costmodel.compute import Split
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY
from autopar.costmodel.step import estimate_step
from autopar.costmodel.topology import mesh_groups
from autopar.analysis.ops import ops_without_rules
from autopar.search.block_tables import Pricing
from autopar.search.tp_solve import StrategySolver
from autopar.analysis.workload import build_workload

CLUSTER = autopar.ClusterSpec.preset("dgx-a100-80g", nodes=1)
TRAIN = autopar.TrainSpec(global_batch=64, seq_len=2048)


def _solve(name: str, tp: int, sp: bool, split_weights: bool = False):
    graph = autopar.trace(autopar.models.build(name), TRAIN)
    base = build_workload(graph, 2.0)
    config = autopar.ParallelConfig(dp=8 // tp, tp=tp, micro_batch=1, zero=1,
                                    sequence_parallel=sp)
    split = Split(1, tp, 1, sp, 2.0, "bf16")
    pricing = Pricing(split, mesh_groups(config, CLUSTER).tp, CLUSTER, DEFAULT_EFFICIENCY,
                      param_step_s=16 / (CLUSTER.gpu.hbm_bytes_per_s * 0.75))
    solver = StrategySolver(graph, base, 2.0, split_weights=split_weights)
    result = solver.solve(pricing, sp)
    return graph, base, config, result


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama", "tiny-moe", "gpt-1.7b", "mixtral-8x7b"])
def test_every_op_of_the_zoo_has_a_rule(name: str) -> None:
    model = autopar.models.build(name)
    seq = min(128, model.config.seq_len)
    graph = autopar.trace(model, autopar.TrainSpec(global_batch=2, seq_len=seq))
    assert ops_without_rules(graph.nodes) == ()


@pytest.mark.parametrize("sp", [False, True])
def test_megatron_column_row_split_comes_out_of_the_solve_for_gpt(sp: bool) -> None:
    _, _, _, result = _solve("gpt-1.7b", 8, sp)
    chosen = dict(result.block_strategies)
    assert chosen["layers_0_attn_qkv"] == "column"
    assert chosen["layers_0_attn_proj"] == "row"
    assert chosen["layers_0_mlp_fc1"] == "column"
    assert chosen["layers_0_mlp_fc2"] == "row"
    assert chosen["scaled_dot_product_attention"] == "heads"
    assert chosen["layers_0_mlp_act"] == "width"
    if sp:  # the norms run over the sequence: Megatron's sequence parallelism
        assert chosen["layers_0_ln1"] == chosen["layers_0_ln2"] == "sequence"
    kinds = sorted({c.kind for c in result.workload.block.tp_collectives})
    # Megatron's f and g: all-reduces, or with sequence parallelism their reduce-scatter and
    # all-gather halves
    assert kinds == (["all-gather", "reduce-scatter"] if sp else ["all-reduce"])
    # two forward, two backward; each split in two with sequence parallelism
    assert len(result.workload.block.tp_collectives) == (8 if sp else 4)


def test_llama_projections_split_by_heads_and_ffn() -> None:
    _, _, _, result = _solve("llama3-8b", 8, True)
    chosen = dict(result.block_strategies)
    for op in ("q_proj", "k_proj", "v_proj"):
        assert chosen[f"layers_0_attn_{op}"] == "column"
    assert chosen["layers_0_attn_o_proj"] == "row"
    assert chosen["layers_0_mlp_gate_proj"] == chosen["layers_0_mlp_up_proj"] == "column"
    assert chosen["layers_0_mlp_down_proj"] == "row"


@pytest.mark.parametrize("name,sp", [("gpt-1.7b", False), ("gpt-1.7b", True),
                                     ("llama3-8b", True)])
def test_free_solve_prices_like_the_megatron_split(name: str, sp: bool) -> None:
    """The free solve finds Megatron's split (or one as good): the step model prices it within
    1 % of the solve with every linear layer forced to split (``split_weights``: Megatron's
    column->row pairs), memory at most 2 % above."""
    _, _, config, result = _solve(name, 8, sp)
    forced = _solve(name, 8, sp, split_weights=True)[3]
    megatron = estimate_step(forced.workload, CLUSTER, TRAIN, config)
    solved = estimate_step(result.workload, CLUSTER, TRAIN, config)
    assert solved.step_time_s == pytest.approx(megatron.step_time_s, rel=0.01)
    assert solved.peak_memory_bytes <= megatron.peak_memory_bytes * 1.02


def test_solves_priced_alike_run_once_and_give_one_workload(monkeypatch) -> None:
    """Two splits whose tables are the same (a dense model under two expert loads) run each
    layer's ILP once and give the same ``StrategyResult``, its workload one object, so the
    cost model's per-layer memos serve both; a split whose tables differ (another tp) solves
    again."""
    import autopar.search.tp_solve as tp_solve

    solves = []
    real = tp_solve.solve
    monkeypatch.setattr(tp_solve, "solve", lambda *a, **k: solves.append(1) or real(*a, **k))
    graph = autopar.trace(autopar.models.build("tiny-gpt"), TRAIN)
    solver = StrategySolver(graph, build_workload(graph, 2.0), 2.0)

    def pricing(tp: int, scale: float) -> Pricing:
        config = autopar.ParallelConfig(dp=8 // tp, tp=tp, micro_batch=1, zero=1,
                                        sequence_parallel=True)
        return Pricing(Split(1, tp, 1, True, 2.0, "bf16"), mesh_groups(config, CLUSTER).tp,
                       CLUSTER, DEFAULT_EFFICIENCY, expert_scale=scale)

    first = solver.solve(pricing(2, 1.0), True)
    assert len(solves) == 3  # the block, the head, the embedding
    again = solver.solve(pricing(2, 1.1), True)
    assert again is first and again.workload is first.workload and len(solves) == 3
    other = solver.solve(pricing(4, 1.0), True)
    assert other.workload.tp == 4 and len(solves) == 6
