"""transformers decoders admit context parallelism: their attention modules take the hook
(``models/hf_llama/context.py``), and transformers' MoE routes every token alone."""

from __future__ import annotations

import pytest
import torch

from autopar import ParallelConfig, TrainSpec
from autopar.analysis.admissibility import check, facts_of
from autopar.models.training import ModelSpec

pytest.importorskip("transformers")

TRAIN = TrainSpec(global_batch=4, seq_len=32, precision="fp32")
QWEN2_MOE = ModelSpec.transformers_config("Qwen2MoeForCausalLM", {
    "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_experts_per_tok": 2, "max_position_embeddings": 64,
    "num_experts": 4, "moe_intermediate_size": 32, "intermediate_size": 128,
    "shared_expert_intermediate_size": 128})


def test_a_transformers_moe_admits_context_parallelism_with_tp_and_ep() -> None:
    facts = facts_of(QWEN2_MOE.build("meta"))
    assert facts.context_attention and facts.token_routing and facts.context_refused is None
    check(facts, ParallelConfig(cp=2, tp=2, sequence_parallel=True), TRAIN)
    check(facts, ParallelConfig(cp=2, dp=2, ep=2), TRAIN)


def test_the_context_attention_function_calls_the_hook_as_transformers_expects() -> None:
    from autopar.models.hf_llama.context import (CONTEXT_ATTENTION, context_attention_forward,
                                                 use_context_attention)

    model = QWEN2_MOE.build("cpu", 0)
    attention = model.model.layers[0].self_attn
    seen = {}

    def hook(q, k, v, **kwargs):
        seen.update(kwargs, heads=(q.shape[1], k.shape[1]))
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=kwargs["scale"], enable_gqa=kwargs["enable_gqa"])

    attention.context_parallel = hook
    q, k = torch.randn(1, 4, 8, 16), torch.randn(1, 2, 8, 16)
    out, weights = context_attention_forward(attention, q, k, k, None, scaling=0.5)
    assert out.shape == (1, 8, 4, 16) and weights is None
    assert seen == {"dropout_p": 0.0, "scale": 0.5, "enable_gqa": True, "window": None,
                    "heads": (4, 2)}
    use_context_attention(model)
    assert model.config._attn_implementation == CONTEXT_ATTENTION
