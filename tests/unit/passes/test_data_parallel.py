"""FSDP2's mixed-precision policy as the plan's ``TrainSpec`` says (``passes/data_parallel.py``):
compute in the low dtype, the gradients accumulated and reduced in ``grad_dtype``, the reduced
shard back in fp32."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.core.model_spec import ModelSpec
from autopar.costmodel.cluster import process_cluster
from autopar.passes.data_parallel import mixed_precision
from autopar.passes.mesh import device_mesh
from autopar.passes.program import parallelize


@pytest.mark.parametrize("grad_dtype, reduce", [("fp32", torch.float32),
                                                ("bf16", torch.bfloat16)])
def test_the_policy_reduces_in_the_plans_grad_dtype(grad_dtype, reduce):
    policy = mixed_precision(TrainSpec(global_batch=8, precision="bf16", grad_dtype=grad_dtype))
    assert policy.param_dtype is torch.bfloat16 and policy.reduce_dtype is reduce
    assert mixed_precision(TrainSpec(global_batch=8, precision="fp32")) is None


@pytest.mark.parametrize("grad_dtype, reduce", [("fp32", torch.float32),
                                                ("bf16", torch.bfloat16)])
def test_every_fsdp_unit_of_the_program_reduces_in_it_and_steps_on_fp32(one_rank, grad_dtype,
                                                                        reduce):
    spec = ModelSpec("tiny-llama")
    config = ParallelConfig(zero=1, micro_batch=2)
    train = TrainSpec(global_batch=4, seq_len=16, precision="bf16", grad_dtype=grad_dtype)
    plan = autopar.plan_for(spec.build("meta"), process_cluster(1), train, config,
                            name=spec.label)
    program = parallelize(spec.build("cpu", 0), plan, device_mesh(plan, "cpu"), "cpu")
    units = [m for m in program.modules if hasattr(m, "_get_fsdp_state")]
    units += [m for root in program.modules for m in root.modules()
              if hasattr(m, "_get_fsdp_state") and m not in units]
    assert units
    for unit in units:
        assert unit._get_fsdp_state()._mp_policy.reduce_dtype is reduce
    tokens = torch.randint(0, 64, (4, 16))
    program.step(tokens, tokens)
    grads = [p.grad for p in program.parameters() if p.grad is not None]
    assert grads and all(g.dtype is torch.float32 for g in grads)  # the reduced shards


def test_a_low_grad_dtype_is_refused_where_the_gradients_are_not_made_in_it():
    with pytest.raises(autopar.AutoparError, match="grad_dtype='bf16' under precision 'fp32'"):
        TrainSpec(global_batch=8, precision="fp32", grad_dtype="bf16")
    with pytest.raises(autopar.AutoparError, match="grad_dtype='fp16' under precision 'bf16'"):
        TrainSpec(global_batch=8, precision="bf16", grad_dtype="fp16")
    assert TrainSpec(global_batch=8, precision="fp16", grad_dtype="fp16").to_dict()[
        "grad_dtype"] == "fp16"
    assert "grad_dtype" not in TrainSpec(global_batch=8).to_dict()  # plans' JSON as before


def test_experts_fewer_than_their_dp_ranks_shard_along_the_hidden_dim():
    """One expert a rank (Mixtral at ep 8) over 2 expert-dp ranks: the stacked weight's expert
    dim (1) cannot be split, so the first dim that can is; where the experts divide evenly FSDP2
    keeps its dim 0; where no dim divides, dim 0 as before."""
    from torch.distributed.tensor import Shard

    from autopar.passes.data_parallel import expert_dp_placement

    place = expert_dp_placement(2)
    assert place(nn.Parameter(torch.empty(1, 64, 48, device="meta"))) == Shard(1)
    assert place(nn.Parameter(torch.empty(1, 3, 48, device="meta"))) == Shard(2)
    assert place(nn.Parameter(torch.empty(4, 64, 48, device="meta"))) is None
    assert place(nn.Parameter(torch.empty(1, 3, 5, device="meta"))) is None
