"""fp16's dynamic loss scaling: the program gets a scaler (only fp16 does) and the cost model
prices what it adds, the unscaling pass over the gradients and the one-value all-reduce."""

from __future__ import annotations

import pytest
import torch

import autopar
from autopar import ClusterSpec, ParallelConfig, TrainSpec
from autopar.costmodel.collectives import Collective, Group, estimate_collective_s
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY
from autopar.passes.loss_scaling import grad_scaler
from autopar.models.training import LOSS_SCALING


def test_only_fp16_gets_a_scaler_and_it_starts_at_the_recipes_scale():
    for precision in ("fp32", "bf16", "bf16-pure"):
        assert grad_scaler(TrainSpec(global_batch=8, precision=precision),
                           torch.device("cpu")) is None
    scaler = grad_scaler(TrainSpec(global_batch=8, precision="fp16"), torch.device("cpu"))
    assert scaler is not None and scaler.get_scale() == LOSS_SCALING["init_scale"]


def test_fp16_costs_one_pass_over_the_gradients_and_an_all_reduce_more():
    model = autopar.models.build("llama3-8b")
    cluster = ClusterSpec.preset("hgx-h100-80g", nodes=1)
    config = ParallelConfig(dp=8, zero=3, micro_batch=1, checkpoint="full")
    est = {p: autopar.estimate(model, cluster, TrainSpec(global_batch=64, seq_len=4096,
                                                         precision=p), config)
           for p in ("bf16", "fp16")}
    extra = est["fp16"].time_breakdown["optimizer"] - est["bf16"].time_breakdown["optimizer"]
    shard = model.config.num_params() / 8  # ZeRO-3 over 8: this GPU's parameters
    unscale = shard * 2 * 2.0 / (cluster.gpu.hbm_bytes_per_s * DEFAULT_EFFICIENCY.memory)
    flag = estimate_collective_s(Collective.ALL_REDUCE, 4.0, Group(size=8, per_node=8), cluster,
                                 DEFAULT_EFFICIENCY)
    assert extra == pytest.approx(unscale + flag, rel=1e-6)
    assert est["fp16"].memory_breakdown == est["bf16"].memory_breakdown
