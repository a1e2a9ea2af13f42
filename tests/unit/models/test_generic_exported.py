"""The generic family on decoders torch.fx cannot trace (transformers 5's ``forward(...,
**kwargs)``): their description read with torch.export (``models/generic/exported.py``), the
container's modules before and after the repeated blocks (``models.blocks.BlockSpan``), and
what pipelining refuses with the reason."""

from __future__ import annotations

import pytest
import torch

from autopar import AutoparError, ParallelConfig, TrainSpec
from autopar.analysis.admissibility import check, facts_of
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import Checkpoint
from autopar.models import family_of
from autopar.models.blocks import block_span
from autopar.models.generic import describe
from autopar.passes.stage import StageModule

pytest.importorskip("transformers")

TRAIN = TrainSpec(global_batch=4, seq_len=32, precision="fp32")
SEQ = 24
_TINY = {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
_MOE = {**_TINY, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}

ARCHITECTURES = {
    # soft-capped logits; sliding-window (8 < SEQ) and full attention masks alternate by layer
    "Gemma2ForCausalLM": {**_TINY, "head_dim": 8, "sliding_window": 8,
                          "final_logit_softcapping": 3.0},
    "CohereForCausalLM": {**_TINY, "logit_scale": 0.5},  # scaled logits
    "GraniteForCausalLM": {**_TINY, "logits_scaling": 4.0, "embedding_multiplier": 3.0},
    "FalconForCausalLM": {**_TINY, "hidden_dropout": 0.0, "attention_dropout": 0.0},
    "GPTNeoXForCausalLM": {**_TINY, "hidden_dropout": 0.0, "attention_dropout": 0.0},
    "BertForMaskedLM": {**_TINY, "hidden_dropout_prob": 0.0,  # an encoder
                        "attention_probs_dropout_prob": 0.0},
    # experts; its rotary table passed on by the first layer's no-op .to(); tokens.to(device)
    "Llama4ForCausalLM": {**_TINY, "head_dim": 8, "num_local_experts": 4,
                          "num_experts_per_tok": 1, "intermediate_size_mlp": 64},
    # use_cache only through its forward's **kwargs: exported with the cache off (its config's)
    "GraniteMoeForCausalLM": {**_TINY, "num_local_experts": 4, "num_experts_per_tok": 2},
}


def _build(architecture: str, config: dict) -> torch.nn.Module:
    return ModelSpec.transformers_config(architecture, config).build("cpu", seed=0)


def _logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens).logits


def _two_stages(model: torch.nn.Module, seq: int = SEQ) -> tuple[StageModule, StageModule]:
    parts = family_of(model).parts_of(model)
    n = block_span(model, parts.blocks).count
    policies = dict.fromkeys(range(n), Checkpoint.FULL)
    cut = n // 2
    return (StageModule(model, parts, range(0, cut), first=True, last=False, seq_len=seq,
                        policies=policies),
            StageModule(model, parts, range(cut, n), first=False, last=True, seq_len=seq,
                        policies=policies))


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_two_stages_of_an_exported_description_compute_the_models_logits(
        architecture: str) -> None:
    model = _build(architecture, ARCHITECTURES[architecture])
    assert family_of(model).name == "generic"
    parts, facts = family_of(model).parts_of(model), facts_of(model)
    assert facts.unsplittable is None and parts.embedding and parts.head
    first, last = _two_stages(model)
    for batch in (2, 1):  # the trace's batch and another: the graphs hold for both
        tokens = torch.randint(0, 128, (batch, SEQ))
        torch.testing.assert_close(last(first(tokens)), _logits(model, tokens), rtol=0, atol=0)


def test_an_exported_description_refuses_tp_and_cp_with_the_reason() -> None:
    facts = facts_of(_build("Gemma2ForCausalLM", ARCHITECTURES["Gemma2ForCausalLM"]))
    with pytest.raises(AutoparError, match="tp=2: the passes cannot split this model"):
        check(facts, ParallelConfig(tp=2), TRAIN)
    with pytest.raises(AutoparError, match="read with torch.export"):
        check(facts, ParallelConfig(cp=2), TRAIN)
    check(facts, ParallelConfig(pp=2), TRAIN)


def test_stages_of_a_bf16_model_compute_its_bf16_logits() -> None:
    """An exported graph bakes its trace's dtypes in (a mask's finfo.min, cos.to(x.dtype)):
    a stage of another compute dtype runs the graphs of another export."""
    model = _build("Gemma2ForCausalLM", ARCHITECTURES["Gemma2ForCausalLM"])
    describe(model)  # read in fp32
    model.to(torch.bfloat16)
    first, last = _two_stages(model)
    tokens = torch.randint(0, 128, (2, SEQ))
    logits = last(first(tokens))
    assert logits.dtype is torch.bfloat16
    torch.testing.assert_close(logits, _logits(model, tokens), rtol=0, atol=0)


DEEPSEEK_V3 = {**_MOE, "num_hidden_layers": 3, "num_key_value_heads": 4, "first_k_dense_replace": 1,
               "n_routed_experts": 4, "n_shared_experts": 1, "n_group": 2, "topk_group": 1,
               "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8,
               "qk_nope_head_dim": 8, "v_head_dim": 8}
"""A tiny DeepSeek-V3 as transformers' own tests make one (MLA: as many key/value heads as
heads), its first layer dense."""


def test_a_dense_first_layer_runs_on_the_first_stage_and_is_no_block_of_the_plan() -> None:
    model = _build("DeepseekV3ForCausalLM", DEEPSEEK_V3)
    span = block_span(model, "model.layers")
    assert (span.lead, span.count, span.trail) == (1, 2, 0)
    assert facts_of(model).num_blocks == 2 and facts_of(model).unsplittable is None
    first, last = _two_stages(model)
    assert sorted(first.get_submodule("model.layers")) == ["0", "1"]  # dense layer, block 0
    assert sorted(last.get_submodule("model.layers")) == ["2"]
    tokens = torch.randint(0, 128, (2, SEQ))
    torch.testing.assert_close(last(first(tokens)), _logits(model, tokens), rtol=0, atol=0)


def test_qwen2_moe_with_a_dense_first_layer_pipelines_its_sparse_layers() -> None:
    model = _build("Qwen2MoeForCausalLM", {**_MOE, "num_hidden_layers": 3,
                                           "shared_expert_intermediate_size": 32,
                                           "mlp_only_layers": [0]})
    assert family_of(model).name == "hf-moe"
    assert facts_of(model).num_blocks == 2
    check(facts_of(model), ParallelConfig(pp=2), TRAIN)
    first, last = _two_stages(model)
    tokens = torch.randint(0, 128, (2, SEQ))
    torch.testing.assert_close(last(first(tokens)), _logits(model, tokens), rtol=0, atol=0)


def test_alternating_dense_and_sparse_layers_run_in_one_stage_and_refuse_pp() -> None:
    model = _build("Qwen3MoeForCausalLM", {**_MOE, "num_hidden_layers": 4, "head_dim": 8,
                                           "decoder_sparse_step": 2})
    facts = facts_of(model)
    assert facts.num_blocks == 1
    assert "not leading layers followed by one run" in facts.unsplittable
    check(facts, ParallelConfig(dp=2), TRAIN)
    with pytest.raises(AutoparError, match="pp=2: the passes cannot cut this model"):
        check(facts, ParallelConfig(pp=2), TRAIN)
    parts = family_of(model).parts_of(model)
    whole = StageModule(model, parts, range(1), first=True, last=True, seq_len=SEQ,
                        policies={0: Checkpoint.FULL})
    assert sorted(whole.get_submodule("model.layers"), key=int) == ["0", "1", "2", "3"]
    tokens = torch.randint(0, 128, (2, SEQ))
    torch.testing.assert_close(whole(tokens), _logits(model, tokens), rtol=0, atol=0)
