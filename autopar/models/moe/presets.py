"""The ``moe`` presets: Mixtral 8x7B and a tiny MoE for tests.

Mixtral is Jiang et al., "Mixtral of Experts" (2024), table 1, with the config.json of the
Hugging Face model card.
"""

from __future__ import annotations

from types import MappingProxyType

from autopar.models.presets import Preset

PRESETS: tuple[Preset, ...] = (
    Preset("mixtral-8x7b", "moe", MappingProxyType(dict(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
        num_experts=8, top_k=2, vocab_size=32000, seq_len=4096, rope_theta=1e6)),
        "Mixtral 8x7B, 8 experts top-2, 32 layers, hidden 4096; Jiang et al. 2024, table 1; "
        "HF mistralai/Mixtral-8x7B-v0.1"),
    Preset("tiny-moe", "moe", MappingProxyType(dict(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=64,
        num_experts=4, top_k=2, vocab_size=256, seq_len=32)),
        "Tiny MoE (4 experts, top-2) for tests and CPU verification", tiny=True),
)
"""By size, the tiny one last."""
