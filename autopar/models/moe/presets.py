"""The ``moe`` presets: Mixtral 8x7B, Qwen3-MoE and GPT-OSS shapes and tiny MoEs for tests.

Mixtral is Jiang et al., "Mixtral of Experts" (2024), table 1, with the config.json of the
Hugging Face model card.

Qwen3-30B-A3B and Qwen3-235B-A22B are Qwen Team, "Qwen3 Technical Report" (arXiv 2505.09388),
table 2 (layers, query/key-value heads, 128 experts with 8 activated, no shared experts), with
the config.json of the Hugging Face model cards Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B
(hidden 2048 / 4096, moe_intermediate_size 768 / 1536, head_dim 128, vocabulary 151936,
rope_theta 1e6, router_aux_loss_coef 0.001, untied head). Qwen3-MoE routes softmax top-k with
the top-k weights renormalised, as this family does, and trains dropless (``capacity_factor``
None here). Not modelled: Qwen3's RMSNorm on q and k per head (QK-norm: 2 x 128 weights per
layer). Sequence length 4096: the report's first two pre-training stages.

GPT-OSS-120B and -20B are OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv 2508.10925),
section 2.1 and table 1 (36 / 24 layers, 128 / 32 experts with 4 activated, 116.83 B / 20.91 B
parameters in all), with the config.json of the Hugging Face model cards openai/gpt-oss-120b
and openai/gpt-oss-20b and transformers' ``GptOssConfig``/``modeling_gpt_oss.py`` (5.x):
hidden 2880, 64 query and 8 key/value heads of head_dim 64, intermediate_size 2880 per expert,
vocabulary 201088, rope_theta 150000, rms_norm_eps 1e-5, initial_context_length 4096, untied
head; ``attention_bias`` true (q/k/v/o), a bias on the router and on every expert projection;
the attention sinks (a learned logit per head, 64 per layer); ``sliding_window`` 128 on the
even layers and full causal attention on the odd ones (``layer_types``: ``sliding_attention``
where ``(i + 1) % 2``); the clamped SwiGLU ``g * sigmoid(1.702 g) * (u + 1)``, ``swiglu_limit``
7.0, ``swiglu_alpha`` 1.702. All of these are modelled (``moe/attention.py``, ``Experts``).
Not modelled: YaRN's scaling of RoPE (factor 32, for contexts past the 4096 positions trained
here), priced and run as plain RoPE -- the same FLOPs. The router's auxiliary-loss weight is
this family's 0.01 (config.json's 0.9 is transformers' inference default, no published training
value). Dropless dispatch is assumed (the model card does not say). The presets count
116,829,156,672 (120B) and 20,914,757,184 (20B) parameters, the model card's 116.83 B and
20.91 B (Megatron-Bridge's GPT-OSS card: 117 B and 21 B).
"""

from __future__ import annotations

from types import MappingProxyType

from autopar.models.presets import Preset

GPT_OSS = dict(hidden_size=2880, num_heads=64, num_kv_heads=8, head_size=64, ffn_hidden_size=2880,
               top_k=4, vocab_size=201088, seq_len=4096, rope_theta=150000.0, norm_eps=1e-5,
               capacity_factor=None, attention_sinks=True, sliding_window=128,
               sliding_window_pattern=2, attention_bias=True, expert_bias=True, swiglu_limit=7.0,
               swiglu_alpha=1.702)
"""What GPT-OSS-120B and -20B share (both config.json files)."""

PRESETS: tuple[Preset, ...] = (
    Preset("qwen3-30b-a3b", "moe", MappingProxyType(dict(
        num_layers=48, hidden_size=2048, num_heads=32, num_kv_heads=4, head_size=128,
        ffn_hidden_size=768, num_experts=128, top_k=8, vocab_size=151936, seq_len=4096,
        rope_theta=1e6, norm_eps=1e-6, capacity_factor=None, router_aux_loss_coef=0.001)),
        "Qwen3-30B-A3B, 128 experts top-8, 48 layers, hidden 2048, GQA 32/4 (no QK-norm); "
        "arXiv 2505.09388 table 2; HF Qwen/Qwen3-30B-A3B"),
    Preset("mixtral-8x7b", "moe", MappingProxyType(dict(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
        num_experts=8, top_k=2, vocab_size=32000, seq_len=4096, rope_theta=1e6)),
        "Mixtral 8x7B, 8 experts top-2, 32 layers, hidden 4096; Jiang et al. 2024, table 1; "
        "HF mistralai/Mixtral-8x7B-v0.1"),
    Preset("qwen3-235b-a22b", "moe", MappingProxyType(dict(
        num_layers=94, hidden_size=4096, num_heads=64, num_kv_heads=4, head_size=128,
        ffn_hidden_size=1536, num_experts=128, top_k=8, vocab_size=151936, seq_len=4096,
        rope_theta=1e6, norm_eps=1e-6, capacity_factor=None, router_aux_loss_coef=0.001)),
        "Qwen3-235B-A22B, 128 experts top-8, 94 layers, hidden 4096, GQA 64/4 (no QK-norm); "
        "arXiv 2505.09388 table 2; HF Qwen/Qwen3-235B-A22B"),
    Preset("gpt-oss-120b", "moe", MappingProxyType(dict(
        num_layers=36, num_experts=128, **GPT_OSS)),
        "GPT-OSS-120B, 128 experts top-4, 36 layers, hidden 2880, GQA 64/8 x 64, sinks, "
        "128-token window on even layers, biases, clamped SwiGLU; arXiv 2508.10925; "
        "HF openai/gpt-oss-120b"),
    Preset("gpt-oss-20b", "moe", MappingProxyType(dict(
        num_layers=24, num_experts=32, **GPT_OSS)),
        "GPT-OSS-20B, 32 experts top-4, 24 layers, hidden 2880, GQA 64/8 x 64, sinks, "
        "128-token window on even layers, biases, clamped SwiGLU; arXiv 2508.10925; "
        "HF openai/gpt-oss-20b"),
    Preset("tiny-moe", "moe", MappingProxyType(dict(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=64,
        num_experts=4, top_k=2, vocab_size=256, seq_len=32)),
        "Tiny MoE (4 experts, top-2) for tests and CPU verification", tiny=True),
    Preset("tiny-gpt-oss", "moe", MappingProxyType(dict(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_size=16,
        ffn_hidden_size=64, num_experts=4, top_k=2, vocab_size=256, seq_len=32,
        capacity_factor=None, attention_sinks=True, sliding_window=8, sliding_window_pattern=2,
        attention_bias=True, expert_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702)),
        "Tiny GPT-OSS (sinks, an 8-token window on layer 0, biases, clamped SwiGLU; 4 "
        "experts top-2, dropless) for tests and CPU verification", tiny=True),
)
"""By size, the tiny one last."""
