"""The ``moe`` presets: Mixtral 8x7B, Qwen3-MoE shapes and a tiny MoE for tests.

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
"""

from __future__ import annotations

from types import MappingProxyType

from autopar.models.presets import Preset

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
    Preset("tiny-moe", "moe", MappingProxyType(dict(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=64,
        num_experts=4, top_k=2, vocab_size=256, seq_len=32)),
        "Tiny MoE (4 experts, top-2) for tests and CPU verification", tiny=True),
)
"""By size, the tiny one last."""
