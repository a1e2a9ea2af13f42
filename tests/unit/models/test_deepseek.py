"""The DeepSeek-V3-style family: sizes against the report, the dense layers outside the block
group, and the one-process model's MoE modes."""

from __future__ import annotations

import pytest
import torch

import autopar
from autopar import TrainSpec
from autopar.core.errors import AutoparError
from autopar.models.training import ModelSpec


def test_deepseek_v3_preset_counts_the_reports_671b_main_model():
    """MLA at the report's dims: 187.1 M attention parameters per layer; the whole model is
    the report's 671 B main model (its 11.5 B multi-token prediction module not built)."""
    model = ModelSpec("deepseek-v3").build("meta")
    config = model.config
    assert config.attention_params() == 187_107_328
    assert config.num_params() == pytest.approx(671e9, rel=0.0005)
    assert sum(p.numel() for p in model.parameters()) == config.num_params()


def test_kimi_k2_preset_counts_the_reports_one_trillion():
    """1.026 T from the config.json dims, where the report rounds to 1.04 T (1.5 %)."""
    config = ModelSpec("kimi-k2").build("meta").config
    assert config.num_params() == pytest.approx(1.04e12, rel=0.015)
    assert config.num_heads == 64 and config.num_experts == 384 and config.first_k_dense == 1


def test_tiny_preset_runs_mla_with_192_like_qk_and_narrower_v_heads():
    attn = ModelSpec("tiny-deepseek").build("meta").layers[0].attn
    assert tuple(attn.q_a_proj.weight.shape) == (24, 64)
    assert tuple(attn.q_b_proj.weight.shape) == (4 * (16 + 8), 24)
    assert tuple(attn.kv_a_proj_with_mqa.weight.shape) == (16 + 8, 64)
    assert tuple(attn.kv_b_proj.weight.shape) == (4 * (16 + 12), 16)
    assert tuple(attn.o_proj.weight.shape) == (64, 4 * 12)


def test_mla_attention_flops_per_layer_are_the_formulas():
    """DeepSeek-V3 at seq 4096: the five GEMMs 2 s (h q_lora + q_lora H 192 + h 576 +
    kv_lora H 256 + H 128 h), and the core 2 s^2 H (192 + 128) (the full score matrix, as
    Megatron-LM counts it)."""
    s, h, heads = 4096, 7168, 128
    graph = autopar.trace(ModelSpec("deepseek-v3").build("meta"), TrainSpec(global_batch=1,
                                                                           seq_len=s))
    attn = [n for n in graph.block_nodes(0) if n.module_path.startswith("layers.0.attn")]
    gemms = sum(n.fwd_flop for n in attn if n.op == "linear")
    core = sum(n.fwd_flop for n in attn if n.op == "sdpa")
    assert gemms == 2 * s * (h * 1536 + 1536 * heads * 192 + h * 576 + 512 * heads * 256
                             + heads * 128 * h)
    assert core == 2 * s * s * heads * (192 + 128)


def test_gqa_stays_buildable_for_plans_made_before_mla():
    config = ModelSpec("tiny-deepseek", {"attention": "gqa", "num_kv_heads": 2}).build(
        "meta").config
    assert config.attention == "gqa" and config.rope_dim == 16


def test_mla_refuses_fewer_kv_heads_than_heads():
    with pytest.raises(AutoparError, match="num_kv_heads"):
        ModelSpec("tiny-deepseek", {"num_kv_heads": 2}).build("meta")


def test_trace_groups_the_moe_layers_and_leaves_the_dense_ones_before_them():
    model = ModelSpec("tiny-deepseek").build("meta")
    graph = autopar.trace(model, TrainSpec(global_batch=2, seq_len=32))
    assert graph.blocks.path == "layers" and len(graph.blocks.instances) == 2
    workload = autopar.workload_of(model, TrainSpec(global_batch=2, seq_len=32))
    assert workload.num_blocks == 2
    assert workload.block.params_expert > 0 and workload.block.ep_dropless
    assert workload.pre.params > 256 * 64  # the embedding and the dense layer


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_dense_layers_split_over_tp_as_the_blocks_attention_and_mlp(sequence_parallel):
    """The dense first layers are layers the engine splits as a block's
    (``GraphIR.outer_layers``): at tp 2 their attention and MLP take column splits closed by
    row splits, as Megatron-LM runs them, where they were whole on every tp rank -- their
    activations and compute priced twice over (``tests/dist/test_parity.py``'s deepseek tp
    cases run them split); a Llama has no such layers."""
    spec = ModelSpec("tiny-deepseek")
    train = TrainSpec(global_batch=8, seq_len=32)
    graph = autopar.trace(spec.build("meta"), train)
    assert graph.outer_layers == frozenset({"dense_layers.0"})
    assert not autopar.trace(ModelSpec("tiny-llama").build("meta"), train).outer_layers
    config = autopar.ParallelConfig(dp=4, tp=2, sequence_parallel=sequence_parallel)
    plan = autopar.plan_for(spec.build("meta"), "hgx-h100-80g", train, config, model_spec=spec)
    styles = {name: str(style) for name, style in plan.module_strategies
              if name.startswith("dense_layers.0.")}
    split = {f"dense_layers.0.{m}": s for m, s in (
        ("attn.q_b_proj", "column"), ("attn.kv_b_proj", "column"), ("attn.o_proj", "row"),
        ("mlp.gate_proj", "column"), ("mlp.up_proj", "column"), ("mlp.down_proj", "row"))}
    assert {k: styles[k] for k in split} == split


def test_dropless_equals_a_capacity_that_drops_nothing():
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    dropless = ModelSpec("tiny-deepseek").build("cpu", 0)
    roomy = ModelSpec("tiny-deepseek", {"capacity_factor": 4.0}).build("cpu", 0)
    a, b = dropless(tokens, tokens), roomy(tokens, tokens)
    assert a.item() == pytest.approx(b.item(), rel=1e-6)
    a.backward()
    b.backward()
    for (name, p), (_, q) in zip(dropless.named_parameters(), roomy.named_parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-5), name


def test_load_balancing_loss_trains_the_router_without_entering_the_loss():
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    grads = []
    for coef in (0.0, 0.5):
        model = ModelSpec("tiny-moe", {"router_aux_loss_coef": coef}).build("cpu", 0)
        loss = model(tokens, tokens)
        loss.backward()
        grads.append((loss.item(), model.layers[0].moe.router.weight.grad.clone(),
                      model.layers[-1].moe.experts.w_up.grad.clone()))
    (l0, r0, e0), (l1, r1, e1) = grads
    assert l0 == l1  # the reported loss is the cross-entropy
    assert not torch.allclose(r0, r1)  # the router's gradient has the aux term
    assert torch.equal(e0, e1)  # the last experts, which feed no router, do not


def test_first_k_dense_must_leave_a_moe_layer():
    with pytest.raises(AutoparError, match="first_k_dense"):
        ModelSpec("tiny-deepseek", {"first_k_dense": 3}).build("meta")
