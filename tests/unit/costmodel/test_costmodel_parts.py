"""Closed-form checks of the cost model's pieces: collectives, pipeline schedules, model states,
GEMM shape efficiency, context parallelism's K/V all-gather and data-parallel exposure by ZeRO
stage."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.collectives import Collective, Group, estimate_collective_s
from autopar.costmodel.compute import (
    Gemm,
    Split,
    epilogue_depth,
    estimate_op_s,
    gemm_efficiency,
    linear_gemms,
)
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autopar.core.errors import AutoparError
from autopar.costmodel.memory import model_state_bytes, saved_bytes, state_bytes_per_param
from autopar.costmodel.pipeline import bubble_fraction, even_partition, in_flight_microbatches
from autopar.core.specs import Checkpoint, Optimizer, ParallelConfig, Precision, Schedule
from autopar.costmodel.dp_comm import _fsdp_exposed_s, dp_comm_s as _dp_comm_s
from autopar.costmodel.step import _cp_comm_s
from autopar.costmodel.topology import mesh_groups
from autopar.costmodel.workload import LayerCost, OpCost, OpKind, Shard

IDEAL = Efficiency(nvlink=1.0, network=1.0)


@pytest.fixture
def a100() -> ClusterSpec:
    return ClusterSpec.preset("dgx-a100-80g", nodes=4)


def test_all_reduce_inside_a_node_is_the_nvlink_ring(a100: ClusterSpec) -> None:
    nbytes = 1e9
    t = estimate_collective_s(Collective.ALL_REDUCE, nbytes, Group(8, 8), a100, IDEAL)
    ring = 2 * 7 / 8 * nbytes / a100.intra_node.bytes_per_s
    assert t == pytest.approx(ring + 14 * a100.intra_node.latency_s)


def test_all_reduce_across_nodes_is_bound_by_the_network_per_gpu(a100: ClusterSpec) -> None:
    nbytes = 1e9
    t = estimate_collective_s(Collective.ALL_REDUCE, nbytes, Group(4, 1), a100, IDEAL)
    ring = 2 * 3 / 4 * nbytes / a100.inter_node.bytes_per_s
    assert t == pytest.approx(ring + 6 * a100.inter_node.latency_s)
    inside = estimate_collective_s(Collective.ALL_REDUCE, nbytes, Group(4, 4), a100, IDEAL)
    assert inside < t / 5


def test_all_gather_and_reduce_scatter_are_half_an_all_reduce(a100: ClusterSpec) -> None:
    g = Group(32, 8)
    ar = estimate_collective_s(Collective.ALL_REDUCE, 1e9, g, a100, IDEAL)
    for kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        assert estimate_collective_s(kind, 1e9, g, a100, IDEAL) == pytest.approx(ar / 2)


def test_all_to_all_across_nodes_sends_the_off_node_share_over_the_network(a100) -> None:
    t = estimate_collective_s(Collective.ALL_TO_ALL, 1e9, Group(16, 8), a100, IDEAL)
    assert t == pytest.approx(8 / 16 * 1e9 / a100.inter_node.bytes_per_s
                              + 7 * a100.intra_node.latency_s + a100.inter_node.latency_s)


def test_group_of_one_costs_nothing(a100: ClusterSpec) -> None:
    assert estimate_collective_s(Collective.ALL_REDUCE, 1e9, Group(1, 1), a100, IDEAL) == 0.0


def test_tensor_parallel_stays_inside_the_node_and_pipeline_crosses() -> None:
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=16)
    g = mesh_groups(ParallelConfig(dp=4, tp=8, pp=4), cluster)
    assert (g.tp.size, g.tp.per_node) == (8, 8)
    assert (g.dp.size, g.dp.per_node) == (4, 1)
    assert g.pp_crosses_node
    g2 = mesh_groups(ParallelConfig(dp=32, tp=2, pp=2), cluster)
    assert (g2.dp.per_node, g2.tp.per_node) == (4, 2)


@pytest.mark.parametrize(
    ("schedule", "stage", "expected"),
    [(Schedule.GPIPE, 0, 16), (Schedule.ONE_F_ONE_B, 0, 4), (Schedule.ONE_F_ONE_B, 3, 1),
     (Schedule.INTERLEAVED, 0, 4 * (1 + 3 / (4 * 2)))],
)
def test_in_flight_microbatches_per_schedule(schedule, stage, expected) -> None:
    assert in_flight_microbatches(schedule, stage, pp=4, m=16, v=2) == pytest.approx(expected)


def test_bubble_shrinks_with_interleaving() -> None:
    assert bubble_fraction(Schedule.ONE_F_ONE_B, 8, 32, 1) == pytest.approx(7 / 32)
    assert bubble_fraction(Schedule.INTERLEAVED, 8, 32, 4) == pytest.approx(7 / 128)


def test_even_partition_gives_the_remainder_to_middle_stages() -> None:
    assert even_partition(10, 4).blocks == (2, 3, 3, 2)
    assert sum(even_partition(126, 16).blocks) == 126
    # interleaved: each rank's chunks as the engine cuts them, uneven when they must be
    assert even_partition(10, 4, 2).blocks == (3, 3, 2, 2)
    assert sum(even_partition(126, 16, 2).blocks) == 126
    # two chunks more than blocks: the embedding and the loss each alone (core.stages)
    assert even_partition(10, 4, 3).blocks == (2, 3, 3, 2)
    with pytest.raises(AutoparError, match="virtual_stages"):
        even_partition(10, 4, 4)
    with pytest.raises(AutoparError, match="pp"):
        even_partition(4, 8)


def test_state_bytes_follow_zero_and_the_precision_policy() -> None:
    mixed = state_bytes_per_param(Precision.BF16, Optimizer.ADAMW)
    assert (mixed.weights, mixed.grads, mixed.optimizer) == (2, 2, 12)
    pure = state_bytes_per_param(Precision.BF16_PURE, Optimizer.ADAMW)
    assert (pure.weights, pure.grads, pure.optimizer) == (2, 2, 4)
    fp32 = state_bytes_per_param(Precision.FP32, Optimizer.SGD)
    assert (fp32.weights, fp32.grads, fp32.optimizer) == (4, 4, 4)
    st = model_state_bytes(1e9, 0, mixed, zero=3, dp=8, expert_dp=1, offload=True)
    assert (st.params, st.grads, st.optimizer) == (2e9 / 8, 2e9 / 8, 0.0)


# --- GEMM shape efficiency --------------------------------------------------------------------

EFF = DEFAULT_EFFICIENCY
ONE_TILE = Efficiency(gemm_tiles=((128, 128),))


def _k_out(cluster: ClusterSpec, out_bytes: float, eff: Efficiency = EFF) -> float:
    return epilogue_depth(out_bytes, cluster.gpu.peak("bf16") * eff.matmul_mainloop,
                          cluster.gpu.hbm_bytes_per_s * eff.memory)


def _eff(cluster: ClusterSpec, rows: float, cols: float, depth: float,
         eff: Efficiency = EFF) -> float:
    return gemm_efficiency(Gemm(rows, cols, depth, 0.0, 2.0), cluster, eff, "bf16")


def test_epilogue_depth_is_half_the_ridge_point_per_output_byte(a100: ClusterSpec) -> None:
    peak, hbm = 312e12 * 0.7, 2.0e12 * 0.75
    assert epilogue_depth(2.0, peak, hbm) == pytest.approx(2.0 * peak / (2 * hbm))
    assert epilogue_depth(4.0, peak, hbm) == pytest.approx(2 * epilogue_depth(2.0, peak, hbm))


def test_gemm_efficiency_approaches_one_for_large_gemms_and_falls_for_small_ones(
        a100: ClusterSpec) -> None:
    h100 = ClusterSpec.preset("hgx-h100-80g")
    for cluster in (a100, h100):
        big = _eff(cluster, 16384, 16384, 16384)
        assert 0.95 < big <= 1.0
        # fewer tokens per GPU (a sequence split by cp, micro-batch 1), same weight
        by_tokens = [_eff(cluster, m, 2304, 2304) for m in (16384, 2048, 256)]
        assert by_tokens[0] > by_tokens[1] > by_tokens[2]
        assert by_tokens[2] < 0.8 * big
        # a short reduction (a 2304-wide layer split 8 ways by tp)
        assert _eff(cluster, 2048, 2304, 288) < 0.7 * big


def test_a_wave_one_tile_too_long_runs_at_about_half(a100: ClusterSpec) -> None:
    sms, depth = a100.gpu.sm_count, 8192
    k = _k_out(a100, 2.0, ONE_TILE)
    full = _eff(a100, 128, 128 * sms, depth, ONE_TILE)
    assert full == pytest.approx(depth / (depth + k))
    over = _eff(a100, 128, 128 * (sms + 1), depth, ONE_TILE)
    assert over == pytest.approx((sms + 1) / (2 * sms) * depth / (depth + k))


def test_tile_quantisation_pads_a_partial_tile(a100: ClusterSpec) -> None:
    sms, depth = a100.gpu.sm_count, 8192
    k = _k_out(a100, 2.0, ONE_TILE)
    # 108 tiles of which every one is half empty along the rows
    assert _eff(a100, 64, 128 * sms, depth, ONE_TILE) == pytest.approx(0.5 * depth / (depth + k))


def test_split_k_spreads_a_single_tile_over_every_sm(a100: ClusterSpec) -> None:
    sms = a100.gpu.sm_count
    depth = 1024 * sms
    k_partial = _k_out(a100, 4.0, ONE_TILE)  # fp32 partial sums
    assert _eff(a100, 128, 128, depth, ONE_TILE) == pytest.approx(1024 / (1024 + k_partial))


def _linear(tokens: int, k: int, n: int, a: float = 2.0, shard: Shard = Shard.TP,
            bias: bool = False) -> OpCost:
    return OpCost("fc", "linear", OpKind.MATMUL, flop=2.0 * tokens * k * n,
                  bytes=a * (tokens * k + k * n + tokens * n + (n if bias else 0)),
                  shard=shard, weight_shape=(n, k))


def test_linear_gemms_take_the_weights_shape_and_split_its_wider_side_by_tp() -> None:
    s, k, n = 2048, 2304, 9216
    split = Split(micro_batch=2, tp=4, cp=2, sequence_parallel=True, act_bytes=2.0,
                  compute_dtype="bf16", seq_len=s)
    first, second, weight = linear_gemms(_linear(s, k, n), split)
    m = 2 * s / 2
    assert (first.rows, first.cols, first.depth) == pytest.approx((m, n / 4, k))
    assert (second.rows, second.cols, second.depth) == pytest.approx((m, k, n / 4))
    assert (weight.rows, weight.cols, weight.depth) == pytest.approx((n / 4, k, m))
    # the weight is read once per GEMM, whatever the micro-batch and cp
    assert first.bytes == pytest.approx(2.0 * (m * k + k * n / 4 + m * n / 4))
    # and its gradient accumulated: read and written
    assert weight.bytes == pytest.approx(2.0 * (m * k + m * n / 4 + 2 * k * n / 4))
    assert weight.out_bytes == 4.0


def test_a_square_weight_with_a_bias_keeps_its_own_shape() -> None:
    """GPT-530B's attention projection (20480 x 20480 with a bias, split 8 ways): solved back
    from its FLOPs and bytes, as the cost model did before it recorded the weight's shape, it
    came out 2617 x 20032."""
    h = 20480
    split = Split(1, 8, 1, False, 2.0, "fp16", seq_len=2048)
    first, second, weight = linear_gemms(_linear(2048, h, h, bias=True), split)
    assert (first.rows, first.cols, first.depth) == (2048, h / 8, h)
    assert (weight.rows, weight.cols, weight.depth) == (h / 8, h, 2048)


def test_gemms_without_a_known_shape_keep_the_whole_run_rate(a100: ClusterSpec) -> None:
    op = _linear(2048, 2304, 9216)
    no_seq = Split(1, 1, 1, False, 2.0, "bf16")
    assert linear_gemms(op, no_seq) is None
    no_weight = OpCost("fc", "linear", OpKind.MATMUL, op.flop, op.bytes, Shard.TP)
    assert linear_gemms(no_weight, Split(1, 1, 1, False, 2.0, "bf16", 2048)) is None
    bmm = OpCost("scores", "bmm", OpKind.MATMUL, op.flop, op.bytes, Shard.TP)
    assert linear_gemms(bmm, Split(1, 1, 1, False, 2.0, "bf16", 2048)) is None
    t = estimate_op_s(op, no_seq, a100, EFF)
    expected = max(op.flop / (312e12 * EFF.matmul), op.bytes / (a100.gpu.hbm_bytes_per_s
                                                                  * EFF.memory))
    assert t.forward == pytest.approx(expected + EFF.kernel_overhead_s)
    assert t.forward == t.backward_act == t.backward_weight


def _per_token_s(op: OpCost, split: Split, cluster: ClusterSpec) -> float:
    t = estimate_op_s(op, split, cluster, EFF)
    return (t.forward + t.backward) * split.tp * split.cp / split.micro_batch


def test_splitting_2048_tokens_eight_ways_by_cp_costs_more_per_token(a100) -> None:
    qkv = _linear(2048, 25600, 3 * 25600)  # GPT-1T
    whole = _per_token_s(qkv, Split(1, 4, 1, True, 2.0, "bf16", 2048), a100)
    eighth = _per_token_s(qkv, Split(1, 4, 8, True, 2.0, "bf16", 2048), a100)
    assert eighth > 1.2 * whole


def test_tp8_on_a_small_model_costs_more_per_flop(a100: ClusterSpec) -> None:
    proj = _linear(2048, 2304, 2304)  # GPT-1.7B attention output projection
    alone = _per_token_s(proj, Split(8, 1, 1, True, 2.0, "bf16", 2048), a100)
    split8 = _per_token_s(proj, Split(8, 8, 1, True, 2.0, "bf16", 2048), a100)
    assert split8 > 1.25 * alone


def test_context_parallel_prices_the_kv_all_gather_it_runs(a100: ClusterSpec) -> None:
    # passes/context_parallel.py: K/V all-gathered over cp (forward), dK/dV reduce-scattered
    # (backward), the gather again in a recomputed forward; the attention itself is 1/cp of
    # the full score matrix with nothing to merge
    s, h, a = 2048, 2304, 2.0
    kv = 2 * s * h
    sdpa = OpCost("attn", "sdpa", OpKind.ATTENTION, flop=4.0 * s * s * h,
                  bytes=a * (2 * s * h + kv), shard=Shard.TP, kv_elements=kv)
    layer = LayerCost("block", (sdpa,), (), 0.0, 0.0, 0, 0)
    config = ParallelConfig(dp=2, tp=2, cp=8)
    g = mesh_groups(config, a100)
    split = Split(2, 2, 8, False, a, "bf16")
    gathered = kv * 2 * a / 2  # micro-batch 2, this tp rank's half of the heads
    ag = estimate_collective_s(Collective.ALL_GATHER, gathered, g.cp, a100, EFF)
    rs = estimate_collective_s(Collective.REDUCE_SCATTER, gathered, g.cp, a100, EFF)
    assert _cp_comm_s(layer, split, Checkpoint.NONE, g, a100, EFF) == pytest.approx(ag + rs)
    assert _cp_comm_s(layer, split, Checkpoint.FULL, g, a100, EFF) == pytest.approx(2 * ag + rs)
    assert _cp_comm_s(layer, Split(2, 2, 1, False, a, "bf16"), Checkpoint.NONE, g, a100,
                      EFF) == 0.0
    # memory: the whole sequence's K/V (this tp rank's heads) is saved beyond the traced 1/cp
    # share, without checkpointing only; an attention masked explicitly (a sliding window)
    # adds the (s/cp, s) mask in the activation dtype, a causal one none (its query chunks run
    # the fused causal kernel, passes/context_parallel.py:lower_right_attention)
    with_seq = Split(2, 2, 8, False, a, "bf16", s)
    assert saved_bytes(layer, with_seq, Checkpoint.NONE) == pytest.approx(
        gathered * (1 - 1 / 8) + s * s / 8 * a)
    causal = LayerCost("block", (replace(sdpa, causal=True),), (), 0.0, 0.0, 0, 0)
    assert saved_bytes(causal, with_seq, Checkpoint.NONE) == pytest.approx(
        gathered * (1 - 1 / 8))
    assert saved_bytes(layer, with_seq, Checkpoint.MATMULS) == 0.0
    one = estimate_op_s(sdpa, Split(2, 2, 1, False, a, "bf16"), a100, EFF)
    eight = estimate_op_s(sdpa, split, a100, EFF)
    k = EFF.kernel_overhead_s
    assert eight.forward - k == pytest.approx((one.forward - k) / 8)


# --- data-parallel exposure by ZeRO stage ------------------------------------------------------

def _exposed(zero: int, cluster: ClusterSpec, *, dense: float = 1.7e9, m: int = 4,
             compute_s: float = 1.0, unit_params: float | None = None) -> float:
    config = ParallelConfig(dp=cluster.num_gpus, zero=zero)
    g = mesh_groups(config, cluster)
    return _dp_comm_s(dense, 0.0, 2.0, 2.0, config, m, compute_s * 2 / 3, compute_s, g,
                      cluster, EFF, unit_params=unit_params)


@pytest.mark.parametrize("compute_s", [1e-3, 0.1, 10.0])
@pytest.mark.parametrize("m", [1, 4])
def test_zero3_is_not_cheaper_than_zero1_in_exposed_comm(a100: ClusterSpec, compute_s: float,
                                                          m: int) -> None:
    zero1 = _exposed(1, a100, m=m, compute_s=compute_s)
    assert _exposed(3, a100, m=m, compute_s=compute_s) > zero1
    assert _exposed(0, a100, m=m, compute_s=compute_s) >= zero1 * (1 - 1e-12)
    assert _exposed(2, a100, m=m, compute_s=compute_s) >= zero1 * (1 - 1e-12)


def test_fsdp_exposes_the_first_all_gather_and_last_reduce_scatter(a100: ClusterSpec) -> None:
    config = ParallelConfig(dp=32, zero=3)
    g = mesh_groups(config, a100)
    unit = 5e7
    ag = estimate_collective_s(Collective.ALL_GATHER, unit * 2.0, g.dp_cp, a100, EFF)
    rs = estimate_collective_s(Collective.REDUCE_SCATTER, unit * 2.0, g.dp_cp, a100, EFF)
    hidden = _fsdp_exposed_s(1.7e9, 0.0, unit, 2.0, 2.0, 2, 1e3, g, a100, EFF)
    assert hidden == pytest.approx(ag + rs)
    # with nothing to hide under, every unit's collectives show, each with its latency
    bare = _fsdp_exposed_s(1.7e9, 0.0, unit, 2.0, 2.0, 2, 0.0, g, a100, EFF)
    assert bare == pytest.approx(34 * (2 * ag + rs))
    finer = _fsdp_exposed_s(1.7e9, 0.0, unit / 4, 2.0, 2.0, 2, 0.0, g, a100, EFF)
    assert finer > bare


def test_zero3_exposure_repeats_every_micro_batch(a100: ClusterSpec) -> None:
    one = _exposed(3, a100, m=1, compute_s=10.0, unit_params=6.4e7)
    assert _exposed(3, a100, m=8, compute_s=10.0, unit_params=6.4e7) == pytest.approx(8 * one)


def test_zero3_recomputation_adds_no_gather(a100: ClusterSpec) -> None:
    """A checkpointed block recomputes on the weights its backward gathered (FSDP2 over the
    checkpointed block: ``tests/dist/test_comm_counts.py`` counts the engine's gathers), so the
    same compute window exposes the same FSDP traffic under any policy."""
    g = mesh_groups(ParallelConfig(dp=32, zero=3), a100)
    exposed = {policy: _dp_comm_s(1.7e9, 0.0, 2.0, 2.0,
                                  ParallelConfig(dp=32, zero=3, checkpoint=policy), 4, 0.02,
                                  0.03, g, a100, EFF)
               for policy in ("none", "full", "selective")}
    assert exposed["full"] == exposed["none"] == exposed["selective"]


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("m", [1, 4])
def test_exposed_dp_comm_never_grows_with_the_recompute_it_hides_under(
        a100: ClusterSpec, zero: int, m: int) -> None:
    """The search's floor (``step.floor_terms_s``) prices the data-parallel communication under
    the most compute a checkpoint choice can add (the forward again): it holds only while more
    recomputation never exposes more."""
    config = ParallelConfig(dp=32, zero=zero)
    g = mesh_groups(config, a100)
    forward, backward = 0.01, 0.02
    exposed = [_dp_comm_s(1.7e9, 0.0, 2.0, 2.0, config, m, backward + r, forward + backward + r,
                          g, a100, EFF) for r in (0.0, 0.001, 0.005, forward)]
    assert all(later <= earlier for earlier, later in zip(exposed, exposed[1:]))
    assert exposed[0] > exposed[-1]  # it does hide some


def test_a_layer_without_experts_is_priced_alike_under_any_expert_layout(a100) -> None:
    """``step.layer_compute_s`` keeps one entry for a layer without expert ops whatever the
    split's ep and etp and the experts' load: its price is ``estimate_layer_s``'s under each."""
    from dataclasses import replace

    from autopar.costmodel.compute import estimate_layer_s
    from autopar.costmodel.step import layer_compute_s

    fc = OpCost("fc", "linear", OpKind.MATMUL, flop=2.0 * 128 * 256 * 1024,
                bytes=2.0 * (128 * 256 + 256 * 1024 + 128 * 1024), shard=Shard.TP,
                weight_shape=(1024, 256))
    norm = OpCost("norm", "layer_norm", OpKind.MEMORY, flop=0.0, bytes=2.0 * 2 * 128 * 256,
                  shard=Shard.SEQ)
    layer = LayerCost("block", (norm, fc), (), 0.0, 0.0, 0, 0)
    split = Split(2, 2, 1, True, 2.0, "bf16", seq_len=128)
    plain = layer_compute_s(layer, split, a100, EFF)
    for ep, etp, scale in ((4, 1, 1.1), (2, 2, 1.0)):
        moved = replace(split, ep=ep, etp=etp)
        assert layer_compute_s(layer, moved, a100, EFF, scale) == plain == \
            estimate_layer_s(layer, moved, a100, EFF, expert_scale=scale)
