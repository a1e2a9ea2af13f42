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

import math

import pytest
from launching import events, launch, losses_of

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.training import ModelSpec
from autopar.costmodel.cluster import process_cluster
from autopar.verify import reference

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
    spec = make_spec()
    model = spec.build("meta")
    plans = {k: autopar.plan_for(model, process_cluster(4), TRAIN, c, name=spec.label)
             for k, c in (("a", PLAN_A), ("b", PLAN_B))}
    folders = {k: p.export(tmp_path / k, spec) for k, p in plans.items()}
    log_a, log_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    wall_a, out_a = launch(folders["a"], "--steps", "4", "--save-every", "2",
                           "--checkpoint-dir", str(tmp_path / "ckpt-a"), "--log-file", str(log_a))
    print(f"plan A (dp4 x ep2) run: {wall_a:.1f} s")
    losses_a = losses_of(log_a)
    assert sorted(losses_a) == [1, 2, 3, 4], out_a
    assert (tmp_path / "ckpt-a" / "step-2" / ".metadata").exists(), out_a
    expected = reference(spec, plans["a"], steps=4, seed=0).losses
    for step, ref in enumerate(expected, 1):
        assert losses_a[step] == pytest.approx(ref, rel=LOSS_REL), (step, losses_a, expected)
    wall_b, out_b = launch(folders["b"], "--steps", "4", "--resume",
                           str(tmp_path / "ckpt-a" / "step-2"), "--checkpoint-dir",
                           str(tmp_path / "ckpt-b"), "--log-file", str(log_b))
    print(f"plan B (dp2 x pp2) resumed run: {wall_b:.1f} s")
    assert [r["step"] for r in events(log_b, "resume")] == [2], out_b
    losses_b = losses_of(log_b)
    assert sorted(losses_b) == [3, 4], out_b
    for step in (3, 4):
        assert math.isfinite(losses_b[step])
        assert losses_b[step] == pytest.approx(losses_a[step], rel=LOSS_REL), (losses_a, losses_b)
