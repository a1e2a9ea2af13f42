"""The model zoo: shapes against published parameter counts, training, tracing, MoE dispatch."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.fx
import torch.nn.functional as F

import autopar.models as models
from autopar import AutoparError
from autopar.models.llama import apply_rope, rope_tables
from autopar.models.deepseek import DeepSeekConfig
from autopar.models.moe import MoEConfig, MoELayer, expert_capacity

TINY = ["tiny-gpt", "tiny-llama", "tiny-moe"]


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)
    torch.set_flush_denormal(True)


def _num_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once


def _tokens(model: torch.nn.Module, batch: int = 2, seq: int | None = None, device: str = "cpu"):
    cfg = model.config
    seq = seq or cfg.seq_len
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    targets = torch.randint(0, cfg.vocab_size, (batch, seq), device=device)
    return tokens, targets


# --- the zoo --------------------------------------------------------------------------------------

def test_names_and_families_are_listed_in_zoo_order() -> None:
    assert models.names() == [
        "deepseek-v3", "kimi-k2", "gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18b", "gpt-39b", "gpt-76b",
        "gpt-145b", "gpt-175b", "gpt-310b", "gpt-530b", "gpt-1t", "llama3-8b", "llama3-70b",
        "llama3-405b", "qwen3-30b-a3b", "mixtral-8x7b", "qwen3-235b-a22b", "gpt-oss-120b",
        "gpt-oss-20b", "tiny-deepseek",
        "tiny-gpt", "tiny-llama", "tiny-moe", "tiny-gpt-oss",
    ]
    assert models.families() == ["deepseek", "gpt", "llama", "moe"]


def _closed_form(cfg: models.ModelConfig) -> int:
    """Parameter counts written out independently of the configs' own ``num_params``."""
    L, h, V = cfg.num_layers, cfg.hidden_size, cfg.vocab_size
    if isinstance(cfg, models.GPTConfig):
        # Narayanan et al. 2021, sec. 5.1: 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)), ffn = 4h,
        # times out to 12 l h^2 + 13 l h + (V + s) h; plus the final LayerNorm's 2h.
        assert cfg.ffn_hidden_size == 4 * h
        head = 0 if cfg.tie_embeddings else V * h
        return 12 * L * h * h + 13 * L * h + (V + cfg.seq_len) * h + 2 * h + head
    d = cfg.head_size or h // cfg.num_heads
    kv = cfg.num_kv_heads * d
    attn = 2 * h * cfg.num_heads * d + 2 * h * kv
    if isinstance(cfg, DeepSeekConfig):  # k dense layers, then routed + shared experts
        if cfg.attention == "mla":  # DeepSeek-V2 eq. 9-19: the low-rank q and kv, their norms
            heads, lq, lkv = cfg.num_heads, cfg.q_lora_rank, cfg.kv_lora_rank
            qk, rope = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, cfg.qk_rope_head_dim
            q = h * heads * qk if lq is None else h * lq + lq + lq * heads * qk
            attn = (q + h * (lkv + rope) + lkv + lkv * heads * (cfg.qk_nope_head_dim
                                                               + cfg.v_head_dim)
                    + heads * cfg.v_head_dim * h)
        k, f = cfg.first_k_dense, cfg.moe_ffn_hidden_size
        dense = attn + 3 * h * cfg.ffn_hidden_size + 2 * h
        moe = (attn + cfg.num_experts * 3 * h * f + h * cfg.num_experts
               + cfg.num_shared_experts * 3 * h * f + 2 * h)
        return k * dense + (L - k) * moe + h + V * h * (1 if cfg.tie_embeddings else 2)
    if isinstance(cfg, MoEConfig):
        e, f = cfg.num_experts, cfg.ffn_hidden_size
        ffn = e * 3 * h * f + h * e
        # GPT-OSS: q/k/v/o biases, a sink per head, router and expert biases
        attn += (cfg.num_heads * d + 2 * kv + h) * cfg.attention_bias + \
            cfg.num_heads * cfg.attention_sinks
        ffn += (e + e * (2 * f + h)) * cfg.expert_bias
    else:
        ffn = 3 * h * cfg.ffn_hidden_size
    return L * (attn + ffn + 2 * h) + h + V * h * (1 if cfg.tie_embeddings else 2)


@pytest.mark.parametrize("name", models.names())
def test_preset_builds_on_meta_with_closed_form_param_count(name: str) -> None:
    model = models.build(name)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert isinstance(model.layers, torch.nn.ModuleList)
    dense = len(getattr(model, "dense_layers", ()))  # DeepSeek's first k layers
    assert len(model.layers) + dense == model.config.num_layers
    count = _num_params(model)
    assert count == _closed_form(model.config)
    assert count == models.describe(name)["params"] == model.config.num_params()


# Published sizes: Megatron-LM table 1 (printed to 0.1 B, so the 1.7 B row is 1.652 B), GPT-3 175B,
# the Llama 3 model cards (8.03 B, 70.6 B, 405.9 B), Mixtral's 46.7 B, the GPT-OSS model card's
# table 1 (116.83 B and 20.91 B; the presets leave out its ~40 M biases and sinks, well inside
# 1 %) and DeepSeek-V3's 671 B main model (arXiv 2412.19437, MLA, no MTP module).
PUBLISHED = {
    "gpt-oss-120b": 116.83e9, "gpt-oss-20b": 20.91e9, "deepseek-v3": 671e9,
    "gpt-1.7b": 1.7e9, "gpt-3.6b": 3.6e9, "gpt-7.5b": 7.5e9, "gpt-18b": 18.4e9,
    "gpt-39b": 39.1e9, "gpt-76b": 76.1e9, "gpt-145b": 145.6e9, "gpt-175b": 174.6e9,
    "gpt-310b": 310.1e9, "gpt-530b": 529.6e9, "gpt-1t": 1008.0e9, "llama3-8b": 8.03e9,
    "llama3-70b": 70.6e9, "llama3-405b": 405.9e9, "mixtral-8x7b": 46.7e9,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_param_count_matches_published_figure(name: str) -> None:
    params = models.describe(name)["params"]
    # 1 %, or half the last printed digit (0.05 B) where the source rounds coarser than that.
    assert abs(params - PUBLISHED[name]) <= max(0.01 * PUBLISHED[name], 0.05e9)


def test_llama3_405b_builds_on_meta() -> None:
    model = models.build("llama3-405b")
    assert model.layers[0].attn.k_proj.weight.shape == (8 * 128, 16384)
    assert model.layers[0].mlp.down_proj.weight.shape == (16384, 53248)
    assert not model.config.tie_embeddings and model.head.weight is not model.tok_emb.weight


def test_gpt_head_is_tied_to_token_embedding() -> None:
    model = models.build("gpt-1.7b")
    assert model.head.weight is model.tok_emb.weight
    untied = models.build("tiny-gpt", tie_embeddings=False)
    assert _num_params(untied) == untied.config.num_params() == _closed_form(untied.config)
    assert _num_params(untied) == _num_params(models.build("tiny-gpt")) + 256 * 64


def test_describe_gives_family_params_and_a_sourced_description() -> None:
    for name in models.names():
        info = models.describe(name)
        assert info["family"] in models.families()
        assert info["description"] and info["name"] == name
    assert "Narayanan" in models.describe("gpt-39b")["description"]
    assert models.describe("mixtral-8x7b")["config"]["rope_theta"] == 1e6


def test_family_with_explicit_shape_equals_preset() -> None:
    explicit = models.build("gpt", num_layers=2, hidden_size=64, num_heads=4, vocab_size=256,
                            seq_len=32)
    assert explicit.config == models.build("tiny-gpt").config
    assert explicit.config.ffn_hidden_size == 256


def test_overrides_set_preset_fields_and_config_is_frozen() -> None:
    model = models.build("gpt-1.7b", num_layers=2, attention="eager", dropout=0.1)
    assert model.config.num_layers == 2 and len(model.layers) == 2
    assert model.config.attention is models.Attention.EAGER
    assert model.layers[0].attn.causal_mask.dtype == torch.bool
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.config.num_layers = 3  # type: ignore[misc]


# --- errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("name", "overrides", "field"),
    [
        ("gpt-2", {}, "name"),
        ("tiny-gpt", {"hidden_siz": 32}, "hidden_siz"),
        ("tiny-gpt", {"hidden_size": 66}, "num_heads"),
        ("tiny-gpt", {"num_layers": 0}, "num_layers"),
        ("tiny-gpt", {"attention": "flash"}, "attention"),
        ("tiny-gpt", {"dropout": 1.5}, "dropout"),
        ("tiny-llama", {"num_kv_heads": 3}, "num_kv_heads"),
        ("tiny-llama", {"rope_theta": -1.0}, "rope_theta"),
        ("tiny-moe", {"top_k": 5}, "top_k"),
        ("tiny-moe", {"capacity_factor": 0}, "capacity_factor"),
        ("llama", {"num_layers": 2, "hidden_size": 64}, "num_heads"),
    ],
)
def test_bad_name_or_override_raises_autopar_error_naming_the_field(
    name: str, overrides: dict[str, object], field: str
) -> None:
    with pytest.raises(AutoparError) as info:
        models.build(name, **overrides)
    assert isinstance(info.value, ValueError)
    assert field in info.value.where and field in str(info.value)
    assert info.value.fix


def test_bad_device_and_dtype_raise_autopar_error() -> None:
    with pytest.raises(AutoparError, match="device"):
        models.build("tiny-gpt", device="nonsense")
    with pytest.raises(AutoparError, match="dtype"):
        models.build("tiny-gpt", dtype=torch.int64)


# --- running --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TINY)
def test_tiny_model_loss_decreases_on_a_fixed_batch_with_adamw(name: str) -> None:
    model = models.build(name, device="cpu")
    tokens, targets = _tokens(model, batch=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = model(tokens, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert abs(losses[0] - math.log(256)) < 0.1  # the init predicts close to uniform
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < 0.6 * losses[0]


@pytest.mark.parametrize("name", TINY)
def test_forward_returns_logits_without_targets(name: str) -> None:
    model = models.build(name, device="cpu")
    tokens, targets = _tokens(model, seq=16)
    logits = model(tokens)
    assert logits.shape == (2, 16, 256)
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    assert torch.allclose(model(tokens, targets), expected)


def test_init_uses_gpt2_std_and_scaled_residual_projections() -> None:
    model = models.build("tiny-gpt", device="cpu", hidden_size=256, num_heads=4, vocab_size=1024)
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.layers[0].mlp.fc2.weight.std().item() == pytest.approx(0.01, rel=0.05)  # 2 layers
    assert torch.all(model.layers[0].attn.qkv.bias == 0)


@pytest.mark.parametrize(
    ("name", "overrides"),
    [("tiny-gpt", {}), ("tiny-gpt", {"attention": "eager"}), ("tiny-llama", {}), ("tiny-moe", {}),
     ("llama3-8b", {"num_layers": 2}), ("mixtral-8x7b", {"num_layers": 2})],
)
def test_forward_backward_on_meta(name: str, overrides: dict[str, object]) -> None:
    model = models.build(name, dtype=torch.bfloat16, **overrides)
    tokens, targets = _tokens(model, seq=32, device="meta")
    loss = model(tokens, targets)
    assert loss.shape == () and loss.dtype == torch.bfloat16
    loss.backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "overrides"),
    [("tiny-gpt", {}), ("tiny-gpt", {"attention": "eager"}), ("tiny-llama", {}),
     ("tiny-llama", {"num_kv_heads": 4}), ("tiny-moe", {})],
)
def test_every_family_traces_with_fx_and_the_graph_matches(name: str, overrides: dict) -> None:
    model = models.build(name, device="cpu", **overrides).eval()
    tokens, targets = _tokens(model)
    loss_graph = torch.fx.symbolic_trace(model)
    assert torch.allclose(loss_graph(tokens, targets), model(tokens, targets))
    logits_graph = torch.fx.symbolic_trace(model, concrete_args={"targets": None})
    short = tokens[:, :8]  # the graph is not specialised to one sequence length
    assert torch.allclose(logits_graph(short), model(short), atol=1e-6)


def test_eager_and_sdpa_gpt_attention_agree() -> None:
    sdpa = models.build("tiny-gpt", device="cpu")
    eager = models.build("tiny-gpt", device="cpu", attention="eager")
    eager.load_state_dict(sdpa.state_dict())
    tokens, _ = _tokens(sdpa)
    torch.testing.assert_close(eager(tokens), sdpa(tokens), atol=1e-5, rtol=1e-5)


def test_meta_model_materialises_with_to_empty_and_init_weights() -> None:
    model = models.build("tiny-llama").to_empty(device="cpu")
    model.init_weights()
    direct = models.build("tiny-llama", device="cpu")
    assert torch.equal(model.rope_cos, direct.rope_cos)
    assert torch.equal(model.rope_sin, direct.rope_sin)
    tokens, targets = _tokens(model)
    assert torch.isfinite(model(tokens, targets))


def test_bf16_model_runs_on_cpu() -> None:
    model = models.build("tiny-moe", device="cpu", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    tokens, targets = _tokens(model)
    assert torch.isfinite(model(tokens, targets).float())


# --- attention pieces -----------------------------------------------------------------------------

def test_gqa_attention_matches_repeated_kv_reference() -> None:
    model = models.build("tiny-llama", device="cpu")  # 4 query heads, 2 kv heads
    attn, cfg = model.layers[0].attn, model.config
    x = torch.randn(2, 16, cfg.hidden_size)
    cos, sin = model.rope_cos[:16], model.rope_sin[:16]
    heads = lambda t: t.view(2, 16, -1, cfg.head_dim).transpose(1, 2)  # noqa: E731
    q = apply_rope(heads(attn.q_proj(x)), cos, sin)
    k = apply_rope(heads(attn.k_proj(x)), cos, sin).repeat_interleave(2, dim=1)
    v = heads(attn.v_proj(x)).repeat_interleave(2, dim=1)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = attn.o_proj(ref.transpose(1, 2).reshape(2, 16, -1))
    torch.testing.assert_close(attn(x, cos, sin), ref)


def test_rope_scores_depend_only_on_relative_position() -> None:
    cos, sin = rope_tables(64, 8, 10000.0)
    q, k = torch.randn(8), torch.randn(8)
    rotated = lambda v, m: apply_rope(v.view(1, 1, 1, 8), cos[m], sin[m]).flatten()  # noqa: E731
    torch.testing.assert_close(rotated(q, 10) @ rotated(k, 7), rotated(q, 40) @ rotated(k, 37))
    torch.testing.assert_close(rotated(q, 5).norm(), q.norm())


# --- MoE dispatch ---------------------------------------------------------------------------------

def _moe_reference(layer: MoELayer, x: torch.Tensor, capacity: int) -> torch.Tensor:
    """Loop over assignments in GShard priority order (choice-major) and experts, one at a time."""
    tokens = x.reshape(-1, x.shape[-1])
    top_logits, top_experts = torch.topk(layer.router(tokens), layer.top_k, dim=-1)
    weights = torch.softmax(top_logits, dim=-1)
    w = layer.experts
    out = torch.zeros_like(tokens)
    load = [0] * layer.num_experts
    for choice in range(layer.top_k):
        for t in range(tokens.shape[0]):
            e = int(top_experts[t, choice])
            if load[e] >= capacity:
                continue  # dropped, as in Switch
            load[e] += 1
            hidden = F.silu(tokens[t] @ w.w_gate[e]) * (tokens[t] @ w.w_up[e])
            out[t] += weights[t, choice] * (hidden @ w.w_down[e])
    return out.view_as(x)


def _moe_layer(**overrides: object) -> MoELayer:
    model = models.build("tiny-moe", device="cpu", **overrides)
    return model.layers[0].moe


def test_moe_matches_loop_reference_when_nothing_is_dropped() -> None:
    layer = _moe_layer(capacity_factor=2.0)  # E / top_k = 2: every expert can take every token
    x = torch.randn(3, 20, 64, requires_grad=True)
    assert expert_capacity(60, 4, 2, 2.0) == 60
    out = layer(x)
    ref = _moe_reference(layer, x, capacity=60)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    (ref_grad,) = torch.autograd.grad(ref.square().sum(), x)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-4)


def test_moe_drops_assignments_beyond_capacity_like_switch() -> None:
    layer = _moe_layer(capacity_factor=0.5)
    x = torch.randn(2, 32, 64)
    capacity = expert_capacity(64, 4, 2, 0.5)
    assert capacity == 16  # half of the 2 * 64 / 4 = 32 balanced slots
    out = layer(x)
    torch.testing.assert_close(out, _moe_reference(layer, x, capacity), atol=1e-5, rtol=1e-4)
    assert (out.abs().sum(-1) == 0).any()  # some token lost both its choices


def test_expert_capacity_is_gshard_formula_capped_at_tokens() -> None:
    assert expert_capacity(4096, 8, 2, 1.25) == math.ceil(1.25 * 2 * 4096 / 8) == 1280
    assert expert_capacity(10, 2, 2, 1.25) == 10
    assert expert_capacity(1, 64, 1, 1.0) == 1
