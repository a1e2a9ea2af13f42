"""Closed-form checks of the cost model's pieces: collectives, pipeline schedules, model states."""

from __future__ import annotations

import pytest

from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.collectives import Collective, Group, estimate_collective_s
from autopar.costmodel.efficiency import Efficiency
from autopar.costmodel.errors import AutoparError
from autopar.costmodel.memory import model_state_bytes, state_bytes_per_param
from autopar.costmodel.pipeline import bubble_fraction, even_partition, in_flight_microbatches
from autopar.costmodel.specs import Optimizer, ParallelConfig, Precision, Schedule
from autopar.costmodel.topology import mesh_groups

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
    with pytest.raises(AutoparError, match="virtual_stages"):
        even_partition(10, 4, 2)
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
