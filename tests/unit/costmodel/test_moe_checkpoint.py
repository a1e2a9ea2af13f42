"""The ``moe`` checkpoint policy as the cost model prices it (Megatron-Core's
``--recompute-modules moe``): the MoE layers' ops rerun, their internals not kept, their
all-to-alls issued again; every other op of the block as under ``none``."""

from __future__ import annotations

import pytest

import autopar
from autopar import TrainSpec
from autopar.core.specs import Checkpoint
from autopar.costmodel.compute import Split, reruns
from autopar.costmodel.memory import recompute_working_bytes, saved_bytes
from autopar.costmodel.moe import ep_alltoalls
from autopar.models.training import ModelSpec

TRAIN = TrainSpec(global_batch=8, seq_len=32)
SPLIT = Split(micro_batch=2, tp=1, cp=1, sequence_parallel=False, act_bytes=2.0,
              compute_dtype="bf16")


def _block(name: str):
    return autopar.workload_of(ModelSpec(name).build("meta"), TRAIN).block


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-deepseek"])
def test_moe_reruns_the_router_and_the_experts_and_nothing_of_the_attention(name):
    block = _block(name)
    rerun = [op for op in block.ops if reruns(op, Checkpoint.MOE)]
    assert rerun == [op for op in block.ops if op.moe_layer]
    assert any(op.expert for op in rerun) and any(op.op == "topk" for op in rerun)
    assert not any(op.kind.value == "attention" or "attn" in op.name for op in rerun)
    assert all(op.expert is False for op in block.ops if not op.moe_layer)
    assert not any(reruns(op, Checkpoint.NONE) for op in block.ops)


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-deepseek"])
def test_moe_keeps_what_none_keeps_but_the_moe_layers_internals(name):
    block = _block(name)
    none = saved_bytes(block, SPLIT, Checkpoint.NONE)
    moe = saved_bytes(block, SPLIT, Checkpoint.MOE)
    inside = [t for t in block.saved if t.without_checkpoint and t.moe_layer]
    # router scores, the dispatched rows, the experts' GEMM and activation outputs
    assert len(inside) >= 5 and moe < none
    per_micro_batch = sum(t.elements * SPLIT.act_bytes if t.bytes_per_element is None
                          else t.elements * t.bytes_per_element for t in inside)
    assert none - moe == pytest.approx(per_micro_batch * SPLIT.micro_batch)
    # the layer's input (the ffn norm's output) is made outside it: kept
    assert any(t.name.endswith("ffn_norm") and not t.moe_layer for t in block.saved)
    # the recomputation rebuilds what it dropped, one layer at a time
    assert recompute_working_bytes(block, SPLIT, Checkpoint.MOE) == pytest.approx(none - moe)


def test_moe_keeps_everything_of_a_dense_block():
    block = _block("tiny-gpt")
    assert not any(op.moe_layer for op in block.ops)
    assert saved_bytes(block, SPLIT, Checkpoint.MOE) == saved_bytes(block, SPLIT,
                                                                     Checkpoint.NONE)


@pytest.mark.parametrize("overrides,expected", [
    ({"capacity_factor": 1.25}, (2, 4)), ({"capacity_factor": None}, (3, 5)),
])
def test_moe_issues_the_forward_all_to_alls_again_in_the_backward(overrides, expected):
    block = autopar.workload_of(ModelSpec("tiny-moe", overrides).build("meta"), TRAIN).block
    assert ep_alltoalls(block, Checkpoint.MOE) == expected
    assert ep_alltoalls(block, Checkpoint.SELECTIVE) == (expected[0], 2)
