"""Behaviour of ``autopar.estimate``: breakdowns add up, and each knob moves what it should."""

from __future__ import annotations

import pytest

import autopar
from autopar import ClusterSpec, ParallelConfig, TrainSpec
from autopar.api import workload_of


@pytest.fixture(scope="module")
def gpt():
    model = autopar.models.build("gpt-7.5b", device="meta")
    train = TrainSpec(global_batch=512, seq_len=2048)
    return autopar.trace(model, train), train


def _est(gpt, cluster: ClusterSpec, **config):
    graph, train = gpt
    return autopar.estimate(graph, cluster, train, ParallelConfig(**config))


def test_breakdown_sums_to_step_time_and_flops_agree(gpt) -> None:
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=4)
    est = _est(gpt, cluster, dp=4, tp=4, pp=2, micro_batch=2, schedule="interleaved",
               virtual_stages=2, checkpoint="full")
    assert sum(est.time_breakdown.values()) == pytest.approx(est.step_time_s)
    assert est.peak_memory_bytes == pytest.approx(sum(est.memory_breakdown.values()))
    assert 0 < est.mfu < est.hfu < 1
    # full recompute adds one forward of the blocks: hardware/model FLOPs close to 4/3
    assert 1.25 < est.hardware_flops_per_step / est.model_flops_per_step < 4 / 3
    # 6*N*tokens is the bulk of the model FLOPs
    graph, train = gpt
    six_n = 6 * workload_of(graph, train).params * train.tokens_per_step
    assert 1.0 < est.model_flops_per_step / six_n < 1.2
    assert est.tokens_per_s == pytest.approx(train.tokens_per_step / est.step_time_s)


def test_recompute_trades_memory_for_time(gpt) -> None:
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=1)
    runs = {p: _est(gpt, cluster, dp=2, tp=4, micro_batch=4, checkpoint=p)
            for p in ("none", "selective", "matmuls", "full")}
    act = {p: e.memory_breakdown["activations"] for p, e in runs.items()}
    # matmuls keeps the linear layers' and attention's outputs and recomputes the
    # memory-bound ops: between none and full in memory and in time.
    assert act["none"] > act["matmuls"] > act["full"]
    assert runs["none"].step_time_s < runs["matmuls"].step_time_s < runs["full"].step_time_s
    # selective recomputes the attention core, which fused attention (this GPT's) does not
    # store: the same memory and time as none
    assert act["selective"] == act["none"]
    assert runs["selective"].step_time_s == runs["none"].step_time_s


def test_selective_recomputes_only_the_eager_attention_core() -> None:
    model = autopar.models.build("gpt-7.5b", attention="eager", num_layers=4, device="meta")
    train = TrainSpec(global_batch=64, seq_len=2048)
    graph = autopar.trace(model, train)
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=1)
    runs = {p: autopar.estimate(graph, cluster, train, ParallelConfig(
                dp=2, tp=4, micro_batch=1, sequence_parallel=True, checkpoint=p))
            for p in ("none", "selective", "matmuls", "full")}
    act = {p: e.memory_breakdown["activations"] for p, e in runs.items()}
    assert act["none"] > act["matmuls"] > act["full"] and act["none"] > act["selective"] > act["full"]
    # selective and matmuls weigh the same at the peak here (the dry run agrees: 5.112 GiB for
    # each, 2026-11-24): the step peaks in the optimizer's step, after the activations are
    # gone; what selective keeps per layer is held to Korthikanti's 34*s*b*h/t in
    # tests/unit/measure/test_published_runs.py
    # its recompute: the core's two batched GEMMs (4*s^2*h FLOPs a layer) and its
    # memory-bound ops; its extra communication: the two gathered inputs it kept as shards,
    # gathered again in the backward -- less than matmuls reissues (every forward collective)
    recompute = {p: e.time_breakdown["recompute"] for p, e in runs.items()}
    assert 0 < recompute["selective"] < recompute["full"]
    comm = {p: e.time_breakdown["comm_tp"] for p, e in runs.items()}
    assert comm["none"] < comm["selective"] < comm["matmuls"] == comm["full"]
    s, h, layers = 2048, model.config.hidden_size, 4
    core_flops = 4 * s * s * h * layers * train.global_batch
    extra = runs["selective"].hardware_flops_per_step - runs["none"].hardware_flops_per_step
    assert extra == pytest.approx(core_flops)


def test_per_block_checkpoint_list_sits_between_the_extremes(gpt) -> None:
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=1)
    half = ("full",) * 18 + ("none",) * 18
    mixed = _est(gpt, cluster, dp=2, tp=4, micro_batch=4, checkpoint=half)
    none = _est(gpt, cluster, dp=2, tp=4, micro_batch=4, checkpoint="none")
    full = _est(gpt, cluster, dp=2, tp=4, micro_batch=4, checkpoint="full")
    assert full.memory_breakdown["activations"] < mixed.memory_breakdown["activations"] \
        < none.memory_breakdown["activations"]
    assert none.step_time_s < mixed.step_time_s < full.step_time_s


def test_zero_stages_shard_the_optimizer_states(gpt) -> None:
    # the moments (costmodel/peak.py) hold the fp32 master shard and Adam's moments, sharded
    # over dp from ZeRO-1 up, at every moment of the step
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=2)
    mem = [_est(gpt, cluster, dp=16, zero=z, micro_batch=1, checkpoint="full").memory_breakdown
           for z in range(4)]
    assert mem[1]["optimizer"] == pytest.approx(mem[0]["optimizer"] / 16)
    assert mem[3]["optimizer"] == pytest.approx(mem[1]["optimizer"])
    assert mem[3]["params"] < mem[1]["params"] < mem[0]["params"]


def test_sequence_parallel_divides_activations_and_offload_frees_the_optimizer(gpt) -> None:
    cluster = ClusterSpec.preset("hgx-h100-80g", nodes=1)
    base = _est(gpt, cluster, dp=1, tp=8, micro_batch=1)
    sp = _est(gpt, cluster, dp=1, tp=8, micro_batch=1, sequence_parallel=True)
    # without checkpointing DTensor keeps the column-parallel inputs gathered (13 -> 7.75
    # s*b*h a layer, Checkpoint.MATMULS's table); selective keeps them as shards (4.25)
    assert sp.memory_breakdown["activations"] < base.memory_breakdown["activations"] * 0.7
    selective = _est(gpt, cluster, dp=1, tp=8, micro_batch=1, sequence_parallel=True,
                     checkpoint="selective")
    assert selective.memory_breakdown["activations"] < base.memory_breakdown["activations"] / 2
    off = _est(gpt, cluster, dp=1, tp=8, micro_batch=1, offload=True)
    assert off.memory_breakdown["optimizer"] == 0
    assert off.time_breakdown["offload"] > 0


def test_interleaving_shrinks_the_bubble(gpt) -> None:
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=4)
    plain = _est(gpt, cluster, dp=4, tp=2, pp=4, micro_batch=4, checkpoint="full")
    inter = _est(gpt, cluster, dp=4, tp=2, pp=4, micro_batch=4, checkpoint="full",
                 schedule="interleaved", virtual_stages=3)
    gpipe = _est(gpt, cluster, dp=4, tp=2, pp=4, micro_batch=4, checkpoint="full",
                 schedule="gpipe")
    assert inter.time_breakdown["bubble"] < plain.time_breakdown["bubble"] / 2
    assert gpipe.memory_breakdown["activations"] > plain.memory_breakdown["activations"]
    assert len(plain.stage_memory) == 4


def test_tensor_parallel_across_nodes_costs_more_than_inside() -> None:
    model = autopar.models.build("gpt-1.7b", device="meta")
    train = TrainSpec(global_batch=64, seq_len=2048)
    graph = autopar.trace(model, train)
    a100 = ClusterSpec.preset("dgx-a100-80g", nodes=2)
    inside = autopar.estimate(graph, a100, train, ParallelConfig(dp=2, tp=8))
    across = autopar.estimate(graph, a100, train, ParallelConfig(dp=1, tp=16))
    # the same all-reduces now also cross the network (8 NICs per node share the traffic)
    assert across.time_breakdown["comm_tp"] > 2 * inside.time_breakdown["comm_tp"]


def test_context_and_expert_parallel_are_costed() -> None:
    train = TrainSpec(global_batch=16, seq_len=4096)
    moe = autopar.models.build("mixtral-8x7b", device="meta")
    h100 = ClusterSpec.preset("hgx-h100-80g", nodes=8)
    work = workload_of(moe, train)
    assert work.block.params_expert > 0.9 * work.block.params
    # the model itself, not its graph: its config says it has experts for ep
    est = autopar.estimate(moe, h100, train, ParallelConfig(dp=16, tp=4, ep=8, zero=1,
                                                            checkpoint="full"))
    assert est.time_breakdown["comm_ep"] > 0
    no_ep = autopar.estimate(moe, h100, train, ParallelConfig(dp=16, tp=4, zero=1,
                                                              checkpoint="full"))
    assert est.memory_breakdown["params"] < no_ep.memory_breakdown["params"] / 4
    llama = autopar.models.build("llama3-8b", device="meta")
    train8k = TrainSpec(global_batch=8, seq_len=8192)
    lg = autopar.trace(llama, train8k)
    one = ClusterSpec.preset("hgx-h100-80g", nodes=1)
    cp = autopar.estimate(lg, one, train8k, ParallelConfig(dp=2, tp=2, cp=2))
    no_cp = autopar.estimate(lg, one, train8k, ParallelConfig(dp=4, tp=2))
    assert cp.time_breakdown["comm_cp"] >= 0
    assert cp.memory_breakdown["activations"] < no_cp.memory_breakdown["activations"]


def test_bad_configurations_name_the_field() -> None:
    model = autopar.models.build("tiny-gpt", device="meta")
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=1)
    train = TrainSpec(global_batch=8, seq_len=32)
    with pytest.raises(autopar.AutoparError, match="dp\\*tp\\*pp\\*cp"):
        autopar.estimate(model, cluster, train, ParallelConfig(dp=2, tp=2))
    with pytest.raises(autopar.AutoparError, match="ep=3"):
        ParallelConfig(dp=4, ep=3)
    with pytest.raises(autopar.AutoparError, match="global_batch"):
        autopar.estimate(model, cluster, train, ParallelConfig(dp=8, micro_batch=2))
    with pytest.raises(autopar.AutoparError, match="virtual_stages"):
        ParallelConfig(pp=2, virtual_stages=2, schedule="1f1b")
    with pytest.raises(autopar.AutoparError, match="checkpoint"):
        ParallelConfig(checkpoint="sometimes")


def test_offloaded_optimizer_states_must_fit_in_the_nodes_host_memory():
    """Offload moves the fp32 master weights and Adam moments (12 bytes a parameter) to the
    host: 8 GPUs' shards of llama3-70b (840 GB) fit in a DGX's 2 TiB, llama3-405b's (4.9 TB)
    do not, however much HBM it frees."""

    cluster = ClusterSpec.preset("hgx-h100-80g", nodes=1)
    train = TrainSpec(global_batch=8, seq_len=2048)
    config = ParallelConfig(dp=8, zero=3, offload=True, checkpoint="full")
    for name, fits in (("llama3-70b", True), ("llama3-405b", False)):
        model = autopar.models.build(name)
        est = autopar.estimate(model, cluster, train, config)
        assert est.host_memory_bytes == pytest.approx(12 * model.config.num_params(), rel=1e-6)
        assert est.usable_host_memory_bytes == cluster.host_memory_bytes
        assert (est.host_memory_bytes <= est.usable_host_memory_bytes) is fits
    assert not est.fits  # 405b: host memory short, whatever its HBM peak
    plain = autopar.estimate(model, cluster, train, config.with_(offload=False))
    assert plain.host_memory_bytes == 0


@pytest.mark.parametrize("offload", [False, True])
def test_the_optimizer_terms_are_the_estimate_s(gpt, offload) -> None:
    """``step.optimizer_terms_s`` (what the search adds to an offloaded twin's bound) is the
    estimate's ``optimizer`` plus ``offload`` seconds, whatever the checkpointing."""
    from autopar.costmodel.step import optimizer_terms_s

    graph, train = gpt
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=4)
    for checkpoint in ("none", "full"):
        config = ParallelConfig(dp=16, pp=2, zero=1, micro_batch=2, offload=offload,
                                checkpoint=checkpoint)
        est = autopar.estimate(graph, cluster, train, config)
        terms = est.time_breakdown["optimizer"] + est.time_breakdown["offload"]
        work = workload_of(graph, train)  # tp 1: the estimate's own workload
        assert optimizer_terms_s(work, cluster, train, config) == pytest.approx(terms)
        assert (terms > est.time_breakdown["optimizer"]) is offload


@pytest.mark.parametrize("config", [
    ParallelConfig(dp=32, zero=1, micro_batch=2),
    ParallelConfig(dp=8, pp=4, zero=3, micro_batch=1, checkpoint="selective"),
    ParallelConfig(dp=4, pp=8, zero=1, micro_batch=1, schedule="interleaved",
                   virtual_stages=2, checkpoint="full"),
    ParallelConfig(dp=16, pp=2, zero=1, micro_batch=2, offload=True),
], ids=["pp1", "pp4-zero3", "pp8-interleaved", "offload"])
def test_exceeds_memory_is_the_estimates_peak_over_the_usable_hbm(gpt, config) -> None:
    """``step.exceeds_memory`` (the search's check before it prices a candidate) sizes the
    stages as ``estimate_step`` does: with the usable HBM at the estimate's peak it is false,
    a byte below it true."""
    import math
    from dataclasses import replace

    from autopar.costmodel.step import estimate_step, exceeds_memory

    graph, train = gpt
    base = ClusterSpec.preset("dgx-a100-80g", nodes=4)
    work = workload_of(graph, train)  # tp 1: the estimate's own workload
    peak = math.ceil(estimate_step(work, base, train, config).peak_memory_bytes)
    for usable, over in ((peak, False), (peak - 1, True)):
        cluster = replace(base, memory_headroom=0.0, gpu=replace(
            base.gpu, hbm_bytes=usable + base.hbm_reserved_bytes))
        assert cluster.usable_hbm_bytes == usable
        assert exceeds_memory(work, cluster, train, config) is over
