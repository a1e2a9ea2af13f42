"""MoE as the engines run it (``costmodel/moe.py``, ``compute.grouped_gemms``, the fold of the
experts' mesh over tp): each expected value is worked out by hand in its test."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.core.errors import AutoparError
from autopar.core.mesh import expert_strides
from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.collectives import Group
from autopar.costmodel.compute import Split, grouped_gemms
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY
from autopar.costmodel.moe import remote_nodes_per_token
from autopar.costmodel.topology import mesh_groups
from autopar.models.routing import limit_groups
from autopar.models.training import ModelSpec

H100 = ClusterSpec.preset("hgx-h100-80g", nodes=4)


def test_the_experts_mesh_folds_over_tp_under_sequence_parallelism_only():
    fold = ParallelConfig(dp=16, tp=2, ep=32, sequence_parallel=True)
    assert (fold.expert_ranks, fold.edp) == (32, 1)
    # etp fastest, then ep, over neighbouring ranks: one ep group is the stage's 32 ranks
    assert expert_strides(fold) == {"etp": 1, "ep": 1, "edp": 32}
    groups = mesh_groups(fold, H100)
    assert (groups.ep.size, groups.ep.per_node) == (32, 8)
    # without sequence parallelism the tp ranks hold the same tokens: ep over dp x cp only
    carved = ParallelConfig(dp=16, tp=2, ep=8)
    assert (carved.expert_ranks, carved.edp) == (16, 2)
    assert expert_strides(carved) == {"etp": 2, "ep": 2, "edp": 16}
    with pytest.raises(AutoparError, match="set sequence_parallel=True"):
        ParallelConfig(dp=16, tp=2, ep=32)


def test_etp_splits_experts_inside_the_tp_group_and_needs_the_fold():
    with pytest.raises(AutoparError, match="does not divide tp"):
        ParallelConfig(dp=4, tp=2, etp=4, sequence_parallel=True)
    with pytest.raises(AutoparError, match="without sequence parallelism"):
        ParallelConfig(dp=4, tp=2, etp=2)
    c = ParallelConfig(dp=4, tp=2, ep=2, etp=2, sequence_parallel=True)
    assert (c.edp, expert_strides(c)) == (2, {"etp": 1, "ep": 2, "edp": 4})


def test_a_token_reaches_the_other_nodes_its_experts_or_groups_sit_on():
    # 256 experts on 8 nodes, 8 chosen: a node is missed with C(224, 8) / C(256, 8)
    miss = math.comb(224, 8) / math.comb(256, 8)
    assert remote_nodes_per_token(256, 8, 8) == pytest.approx(7 * (1 - miss))
    # DeepSeek-V3's 8 groups (one per node), 4 kept: 4 nodes, this one among them half the time
    assert remote_nodes_per_token(256, 8, 8, (8, 4)) == pytest.approx(3.5)
    assert remote_nodes_per_token(256, 8, 1) == 0.0


def test_limit_groups_keeps_each_token_within_its_best_groups():
    logits = torch.tensor([[0.0, 9.0, 1.0, 2.0, 8.0, 0.5, 3.0, 0.1]])  # 4 groups of 2
    routed = limit_groups(logits, groups=4, keep=2)
    top = torch.topk(routed, 3, dim=-1).indices[0].tolist()
    # the groups of 9.0 (experts 0-1) and 8.0 (4-5) are kept; 3.0 in group 3 is not reachable
    assert set(top) == {1, 4, 5} or set(top) == {1, 4, 0}
    assert all(e // 2 in (0, 2) for e in top)


def test_the_local_experts_run_as_one_grouped_gemm_at_the_rows_each_receives():
    model = ModelSpec("tiny-moe", {"capacity_factor": None}).build("meta")
    work = autopar.workload_of(model, TrainSpec(global_batch=8, seq_len=32))
    gate = next(op for op in work.block.ops if op.expert)
    e, k, n = gate.expert_shape
    assert (e, k) == (4, 64)
    split = Split(2, 1, 1, False, 2.0, "bf16", seq_len=32, ep=2)
    forward, _, weight = grouped_gemms(gate, split)
    # this GPU routes 2 sequences x 32 tokens x top-2 = 128 rows and, balanced, receives as
    # many from the ep group, spread over the 2 of the 4 experts it holds
    assert forward.groups == 2 and forward.gemm.rows == pytest.approx(2 * 32 * 2 / 2)
    assert (forward.gemm.cols, forward.gemm.depth) == (n, k)
    assert weight.gemm.depth == forward.gemm.rows  # the weight gradient reduces each expert's rows


def test_under_the_fold_each_tp_rank_computes_its_own_tokens_experts():
    model = ModelSpec("qwen3-30b-a3b", {"num_layers": 12}).build("meta")
    train = TrainSpec(global_batch=64, seq_len=4096)
    cluster = ClusterSpec.preset("hgx-h100-80g", nodes=2)
    folded = autopar.estimate(model, cluster, train,
                              ParallelConfig(dp=8, tp=2, ep=16, sequence_parallel=True, zero=1))
    whole = autopar.estimate(model, cluster, train, ParallelConfig(dp=8, tp=2, ep=8, zero=1))
    # without the fold both tp ranks compute the same tokens' experts: about twice the expert
    # work per GPU (the attention is split by tp either way)
    assert whole.time_breakdown["compute"] > 1.4 * folded.time_breakdown["compute"]


def test_overlap_hides_the_fraction_of_the_all_to_all_the_compute_covers():
    """Per MoE layer, ``Efficiency.ep_overlap`` of the smaller of its all-to-alls and its
    compute: on one node (NVLink) each layer computes longer than it exchanges, so that
    fraction of every all-to-all; over two nodes the exchange outlasts a layer's compute and
    the compute bounds what hides."""
    model = ModelSpec("qwen3-30b-a3b", {"num_layers": 2}).build("meta")
    train = TrainSpec(global_batch=64, seq_len=4096)
    share = DEFAULT_EFFICIENCY.ep_overlap
    for nodes, bounded_by_compute in ((1, False), (2, True)):
        cluster = ClusterSpec.preset("hgx-h100-80g", nodes=nodes)
        base = ParallelConfig(dp=8 * nodes, ep=8 * nodes, zero=1)
        plain = autopar.estimate(model, cluster, train, base)
        over = autopar.estimate(model, cluster, train, base.with_(fusions=("ep_a2a_overlap",)))
        ep = plain.time_breakdown["comm_ep"]
        hidden = ep - over.time_breakdown["comm_ep"]
        if bounded_by_compute:
            assert 0 < hidden < share * ep
        else:
            assert hidden == pytest.approx(share * ep, rel=1e-9)
    dedup = autopar.estimate(model, cluster, train, base.with_(fusions=("deepep",)))
    assert dedup.time_breakdown["comm_ep"] < ep  # each token crosses to a node once


def test_group_size_for_an_ep_group_inside_one_node_rides_nvlink():
    assert mesh_groups(ParallelConfig(dp=64, ep=8, zero=1), ClusterSpec.preset(
        "hgx-h100-80g", nodes=8)).ep == Group(8, 8)
    eff = dataclasses.replace(DEFAULT_EFFICIENCY, ep_overlap=0.5)
    assert eff.ep_overlap == 0.5


def test_ep_64_inside_one_gb200_nvl72_domain_rides_nvlink():
    """On a GB200 NVL72 rack (72 GPUs, 18 hosts of 4, one NVLink domain) an ep group of 64
    spans 16 hosts and stays on NVLink; on HGX H100 (a host is the domain) it crosses 8 nodes.
    The all-to-all is priced accordingly, and the plan's notes say where each group sits."""
    config = ParallelConfig(dp=64, ep=64, zero=1)
    rack = ClusterSpec.preset("gb200-nvl72", nodes=16)
    hgx = ClusterSpec.preset("hgx-h100-80g", nodes=8)
    assert mesh_groups(config, rack).ep == Group(64, 64)
    assert mesh_groups(config, hgx).ep == Group(64, 8)
    model = ModelSpec("qwen3-30b-a3b", {"num_layers": 2}).build("meta")
    train = TrainSpec(global_batch=64, seq_len=4096)
    on_rack = autopar.estimate(model, rack, train, config)
    assert any("ep 64 inside one domain (NVLink5)" in n for n in on_rack.notes), on_rack.notes
    # the same GPUs as 8-GPU NVLink domains: the all-to-all crosses the network
    split = dataclasses.replace(rack, nvlink_domain=8)
    across = autopar.estimate(model, split, train, config)
    assert any("ep 64 across 8 domains" in n for n in across.notes), across.notes
    assert across.time_breakdown["comm_ep"] > 5 * on_rack.time_breakdown["comm_ep"]
    assert not any("NVLink domains" in n for n in autopar.estimate(model, hgx, train,
                                                                  config).notes)
