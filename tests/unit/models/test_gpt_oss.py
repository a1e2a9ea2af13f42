"""GPT-OSS in the ``moe`` family: its parameter counts, its attention against transformers',
its clamped SwiGLU, and the window's FLOPs (the alternating layers priced at their mean)."""

from __future__ import annotations

import pytest
import torch

from autopar import models
from autopar.analysis.ops.attention import window_fraction
from autopar.analysis.tracing import trace
from autopar.analysis.workload import build_workload
from autopar.models.moe.attention import sink_attention


@pytest.mark.parametrize("name, count", [("gpt-oss-120b", 116.83e9), ("gpt-oss-20b", 20.91e9)])
def test_gpt_oss_presets_count_the_model_cards_parameters(name: str, count: float) -> None:
    """arXiv 2508.10925 table 1: 116.83 B and 20.91 B parameters in all (Megatron-Bridge's
    GPT-OSS card: 117 B and 21 B); to the card's last digit."""
    model = models.build(name, device="meta")
    total = sum(p.numel() for p in model.parameters())
    assert total == model.config.num_params()
    assert round(total / 1e9, 2) == pytest.approx(count / 1e9)


def test_gpt_oss_layers_alternate_sliding_and_full_as_layer_types_says() -> None:
    """transformers' ``GptOssConfig.layer_types``: sliding where ``(i + 1) % 2``."""
    model = models.build("gpt-oss-20b", device="meta")
    assert [layer.attn.window for layer in model.layers[:4]] == [128, None, 128, None]


def _hf_attention(window: int | None):
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_oss import modeling_gpt_oss as hf

    config = transformers.GptOssConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_hidden_layers=2, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
        vocab_size=256, sliding_window=window, max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0})
    config._attn_implementation = "eager"
    return hf, config


@pytest.mark.parametrize("window", [None, 5])
def test_sink_attention_equals_transformers_eager_gpt_oss_attention(window) -> None:
    hf, config = _hf_attention(window)
    torch.manual_seed(0)
    b, heads, kv, s, d = 2, 4, 2, 12, 16
    q, k, v = torch.randn(b, heads, s, d), torch.randn(b, kv, s, d), torch.randn(b, kv, s, d)
    sinks = torch.randn(heads)
    i, j = torch.arange(s).unsqueeze(1), torch.arange(s).unsqueeze(0)
    visible = (j <= i) & ((i - j < window) if window else True)
    mask = torch.zeros(s, s).masked_fill(~visible, float("-inf"))

    class Holder(torch.nn.Module):
        num_key_value_groups = heads // kv
        training = False

    holder = Holder()
    holder.sinks = torch.nn.Parameter(sinks)
    want, _ = hf.eager_attention_forward(holder, q, k, v, mask, scaling=d ** -0.5)
    got = sink_attention(q, k, v, sinks, window or 0, d ** -0.5)
    torch.testing.assert_close(got.transpose(1, 2), want, rtol=1e-5, atol=1e-6)


def test_clamped_swiglu_is_transformers_gate() -> None:
    hf, config = _hf_attention(None)
    model = models.build("tiny-gpt-oss", device="cpu")
    experts = model.layers[0].moe.experts
    gate_up = torch.randn(7, 2 * 64) * 6
    reference = hf.GptOssExperts(config)._apply_gate(gate_up)
    torch.testing.assert_close(experts._act(gate_up[..., ::2], gate_up[..., 1::2]), reference)


def test_window_band_fraction_of_the_causal_triangle() -> None:
    """s = 4096, w = 128: the band's w*s - w(w-1)/2 pairs over the triangle's s(s+1)/2."""
    assert window_fraction(4096, 128) == pytest.approx(
        (128 * 4096 - 128 * 127 / 2) / (4096 * 4097 / 2))
    assert 1 / window_fraction(4096, 128) == pytest.approx(16.25, abs=0.01)
    assert window_fraction(4096, 0) == window_fraction(4096, 4096) == 1.0


def test_sliding_layers_cost_their_window_and_the_block_the_mean_of_both_kinds() -> None:
    """gpt-oss-20b at 4096: a full layer's core is 4*h*s^2*d (the full product, as Megatron
    counts causal attention) plus the sinks' 2*h*s; a sliding layer's 1/16.25 of it; the
    priced block the mean of the two."""
    model = models.build("gpt-oss-20b", device="meta")
    graph = trace(model, seq_len=4096)
    core = [sum(n.fwd_flop for n in graph.block_nodes(i) if n.op == "sdpa") / graph.batch
            for i in (0, 1)]
    full = 4.0 * 64 * 4096 * 4096 * 64
    sinks = 2.0 * 64 * 4096
    assert core[1] == pytest.approx(full + sinks)
    assert core[0] == pytest.approx(full * window_fraction(4096, 128) + sinks)
    work = build_workload(graph)
    priced = sum(o.flop for o in work.block.ops if o.op == "sdpa")
    assert priced == pytest.approx((core[0] + core[1]) / 2)
    assert any("mean" in note for note in work.notes)
