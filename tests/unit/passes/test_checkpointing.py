"""A block checkpointed under FSDP2's bf16 mixed precision recomputes on the inputs its forward
saw, also where FSDP2 leaves the recomputation's inputs uncast (torch 2.11, the GPU machines'
image: ``bench/results/gpu-h200.md``, parts 4 and 5, where SDPA refused fp32 q and k beside a
bf16 v). Here torch 2.13's FSDP2 casts them, so that behaviour is put back by patching its
cast to skip the recomputation, as 2.11's does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard import _fsdp_state
from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

from autopar.core.specs import Checkpoint
from autopar.passes.checkpointing import run_block

pytestmark = pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")


class RopeBlock(nn.Module):
    """q and k rotated by fp32 tables (promoting them to the tables' dtype unless cast), v not."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v = (p(x).unflatten(-1, (2, 4)).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k = q * cos + q.flip(-1) * sin, k * cos + k.flip(-1) * sin
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)


@pytest.fixture
def uncast_recompute(monkeypatch):
    """FSDP2 as torch 2.11 has it: no cast of the inputs when the backward recomputes."""
    cast = _fsdp_state.FSDPState._cast_forward_inputs

    def as_211(self, args, kwargs):
        if self._training_state == TrainingState.PRE_BACKWARD:
            return args, kwargs
        return cast(self, args, kwargs)

    monkeypatch.setattr(_fsdp_state.FSDPState, "_cast_forward_inputs", as_211)


@pytest.mark.parametrize("policy", [Checkpoint.FULL, Checkpoint.MATMULS])
def test_recomputation_sees_the_forwards_cast_inputs(one_rank, uncast_recompute, policy):
    torch.manual_seed(0)
    block = RopeBlock()
    fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                      reduce_dtype=torch.float32))
    x = torch.randn(2, 6, 8, dtype=torch.bfloat16, requires_grad=True)
    angles = torch.rand(6, 4)
    extra = (angles.cos(), angles.sin())  # fp32, as rope_tables makes them

    def call(b, x, extra):
        return b(x, *extra)

    run_block(call, block, x, extra, policy).float().square().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16
    assert all(p.grad is not None for p in block.parameters())


def test_without_the_cast_the_recomputation_fails(one_rank, uncast_recompute):
    """The patch reproduces the failure: the same block under plain checkpoint, no cast."""
    from torch.utils.checkpoint import checkpoint

    block = RopeBlock()
    fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    x = torch.randn(2, 6, 8, dtype=torch.bfloat16, requires_grad=True)
    angles = torch.rand(6, 4)
    out = checkpoint(block, x, angles.cos(), angles.sin(), use_reentrant=False)
    with pytest.raises(Exception, match="dtype|metadata"):
        out.float().sum().backward()
