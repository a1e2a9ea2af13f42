"""An exported expert-parallel plan trains under ``bash launch.sh`` (torchrun, 4 gloo processes
on the CPU) on the one-process reference's losses, and its checkpoint resumes under a plan
without expert parallelism.

Plan A is dp 4 x ep 2, ZeRO-1 (each MoE layer's experts DTensor ``Shard(0)`` over 2 ranks, the
experts' FSDP2 over the other 2); plan B is dp 2 x pp 2 with 1F1B and ep 1 (every expert on
each rank, FSDP2 only). Both run the global batch of 8 as 8 calls of one sequence, so every MoE
call routes and drops the same tokens under both plans (the capacity depends on the tokens of
the call): B's losses after resuming A's step-2 checkpoint must be A's. Success is judged by
the files the ranks write, as in ``test_export.py``.

The same for a transformers MoE (Qwen2-MoE, the ``hf-moe`` family: stacked experts sharded the
same way, the all-to-all dispatch of ``models/expert_layers.py``): its layers are dropless, so
every plan computes the same tokens per expert.
"""

from __future__ import annotations

import pytest
from launching import train_then_resume

from autopar import ParallelConfig, TrainSpec
from autopar.models.training import ModelSpec

TRAIN = TrainSpec(global_batch=8, seq_len=32, precision="fp32")
PLAN_A = ParallelConfig(dp=4, ep=2, zero=1, micro_batch=1)
PLAN_B = ParallelConfig(dp=2, pp=2, zero=1, micro_batch=1, schedule="1f1b")
LOSS_REL = 1e-5
"""fp32: the plans reduce in different orders; ``test_export.py`` explains the bound."""


def _qwen2_moe() -> ModelSpec:
    pytest.importorskip("transformers")
    return ModelSpec.transformers_config("Qwen2MoeForCausalLM", {
        "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "intermediate_size": 128,
        "shared_expert_intermediate_size": 64, "max_position_embeddings": 64})


@pytest.mark.parametrize("make_spec", [lambda: ModelSpec("tiny-moe"), _qwen2_moe],
                         ids=["tiny-moe", "qwen2-moe"])
def test_ep_plan_trains_and_resumes_under_dp_pp_with_the_same_losses(tmp_path, make_spec):
    train_then_resume(tmp_path, make_spec(), TRAIN, PLAN_A, PLAN_B, rel=LOSS_REL)


PLAN_FOLD = ParallelConfig(dp=2, tp=2, sequence_parallel=True, ep=4, zero=1, micro_batch=1)
"""The experts' mesh folded over the tp ranks (issue 30): ep 4 spans tp 2 x dp 2, each tp rank
routing its own sequence shard to the experts' owners (``passes/expert_parallel.py``)."""


@pytest.mark.parametrize("spec", [ModelSpec("tiny-moe"), ModelSpec("tiny-deepseek")],
                         ids=["tiny-moe", "tiny-deepseek"])
def test_ep_over_tp_plan_trains_and_resumes_under_dp_pp_with_the_same_losses(tmp_path, spec):
    train_then_resume(tmp_path, spec, TRAIN, PLAN_FOLD, PLAN_B, rel=LOSS_REL)
