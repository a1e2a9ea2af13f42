"""The ``hf-moe`` family: which transformers MoE decoders it recognises, what it refuses, and
that the cost workload sees their experts as the zoo's (so the search prices ep)."""

from __future__ import annotations

import pytest
from torch import nn

from autopar.analysis.admissibility import facts_of
from autopar.core.errors import AutoparError
from autopar.models.family import family_of
from autopar.models.training import ModelSpec

_SHAPE = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts_per_tok": 2,
          "max_position_embeddings": 64}
QWEN2_MOE = {**_SHAPE, "num_experts": 4, "moe_intermediate_size": 32, "intermediate_size": 128,
             "shared_expert_intermediate_size": 128}
MIXTRAL = {**_SHAPE, "num_local_experts": 4, "intermediate_size": 32}
QWEN3_MOE = {**_SHAPE, "num_experts": 4, "moe_intermediate_size": 32, "intermediate_size": 128}


def _build(arch: str, config: dict, device: str = "meta") -> nn.Module:
    return ModelSpec.transformers_config(arch, config).build(device)


@pytest.mark.parametrize("arch,config", [("Qwen2MoeForCausalLM", QWEN2_MOE),
                                         ("MixtralForCausalLM", MIXTRAL),
                                         ("Qwen3MoeForCausalLM", QWEN3_MOE)])
def test_transformers_moe_decoders_are_hf_moe_with_one_expert_layer_per_block(arch, config):
    model = _build(arch, config)
    family = family_of(model)
    assert family.name == "hf-moe"
    layers = family.expert_layers(model)
    assert len(layers) == 2 and all(x.num_experts == 4 and x.top_k == 2 for x in layers)
    assert all(x.capacity_factor is None for x in layers)  # dropless
    assert facts_of(model).num_experts == 4 and facts_of(model).unsplittable is None


def test_dense_layers_beside_sparse_ones_are_recognised_and_skipped():
    model = _build("Qwen2MoeForCausalLM", {**QWEN2_MOE, "mlp_only_layers": [0]})
    assert family_of(model).name == "hf-moe"
    assert len(family_of(model).expert_layers(model)) == 1


def test_a_dense_llama_stays_hf_llama():
    model = _build("LlamaForCausalLM", {k: v for k, v in _SHAPE.items()
                                        if k != "num_experts_per_tok"})
    assert family_of(model).name == "hf-llama"
    from autopar.models.family import family_named
    assert "no sparse MoE block" in family_named("hf-moe").why_not(model)


def test_a_router_with_jitter_noise_is_hf_moe_and_verify_turns_the_noise_off():
    # each rank draws its own jitter for its own tokens, as any data-parallel process does
    from autopar.verify.dropout import without_dropout

    config = {**MIXTRAL, "router_jitter_noise": 0.1}
    model = _build("MixtralForCausalLM", config)
    assert family_of(model).name == "hf-moe" and len(family_of(model).expert_layers(model)) == 2
    spec = ModelSpec.transformers_config("MixtralForCausalLM", config)
    quiet, off = without_dropout(spec)
    assert off["router_jitter_noise"] == 0.1
    assert quiet.transformers["config"]["router_jitter_noise"] == 0.0


def test_experts_of_another_stacked_layout_are_refused():
    model = _build("Qwen3MoeForCausalLM", QWEN3_MOE)
    model.model.layers[1].mlp.experts.is_transposed = True
    with pytest.raises(AutoparError, match="is_transposed=True"):
        family_of(model)


def test_init_draws_experts_and_routers_like_transformers_and_repeats():
    a = _build("Qwen2MoeForCausalLM", QWEN2_MOE, "cpu")
    b = _build("Qwen2MoeForCausalLM", QWEN2_MOE, "cpu")
    experts = a.model.layers[0].mlp.experts
    assert 0.015 < experts.gate_up_proj.std().item() < 0.025  # N(0, initializer_range 0.02)
    assert 0.015 < a.model.layers[0].mlp.gate.weight.std().item() < 0.025
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert p.equal(q), name


def test_the_workload_sees_dropless_experts_and_their_parameters():
    from autopar.analysis.tracing import trace
    from autopar.analysis.workload import build_workload

    model = _build("Qwen2MoeForCausalLM", QWEN2_MOE)
    block = build_workload(trace(model, seq_len=16)).block
    experts = model.model.layers[0].mlp.experts
    assert block.params_expert == experts.gate_up_proj.numel() + experts.down_proj.numel()
    assert block.ep_dropless
    # the rows the all-to-all sends per sequence: top_k x tokens x hidden
    assert block.ep_alltoall_elements == 2 * 16 * 64
    assert [o.expert for o in block.ops].count(True) == 2
