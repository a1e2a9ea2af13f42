"""The ``moe`` checkpoint policy as the cost model prices it (Megatron-Core's
``--recompute-modules moe``): the MoE layers' ops rerun, their internals not kept, their
all-to-alls issued again; every other op of the block as under ``none``."""

from __future__ import annotations

from dataclasses import replace

import pytest

import autopar
from autopar import TrainSpec
from autopar.core.specs import Checkpoint
from autopar.costmodel.compute import Split, reruns
from autopar.costmodel.memory import _sized, recompute_working_bytes, saved_bytes
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


def test_the_routers_fp32_input_is_a_copy_in_bf16_and_a_view_in_fp32():
    """The router casts its input to fp32 (``Fp32Linear``): in bf16 it keeps a 4-byte copy of
    the layer's input beside the input, in fp32 the input itself (the dry run's account found
    the copy: 32 MiB a qwen3-30b-a3b layer and micro-batch, ``bench/results/memory_grid.md``)."""
    block = _block("tiny-moe")
    copies = [t for t in block.saved if t.widened_from is not None]
    assert len(copies) == 1
    copy = copies[0]
    assert copy.bytes_per_element == 4.0 and copy.moe_layer
    source = next(t for t in block.saved if t.name == copy.widened_from)
    assert not source.moe_layer  # the layer's input, kept under the moe policy too
    fp32 = replace(SPLIT, act_bytes=4.0, compute_dtype="fp32")
    one = _sized([copy], SPLIT)
    assert one == pytest.approx(copy.elements * 4.0 * SPLIT.scale(copy.shard))
    assert _sized([copy, source], SPLIT) == pytest.approx(one + _sized([source], SPLIT))
    # fp32: the cast is a view of its input, counted once
    assert _sized([copy, source], fp32) == pytest.approx(_sized([source], fp32))
    assert _sized([copy], fp32) == pytest.approx(one)
