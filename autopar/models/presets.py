"""The built-in zoo: preset shapes, each with the paper or model card it comes from.

GPT rows are Table 1 of Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (SC 2021; vocabulary 51200, sequence 2048), plus GPT-3 175B (Brown
et al., 2020, table 2.1) in the same Megatron form. Llama 3 rows are table 3 of Grattafiori et al.,
"The Llama 3 Herd of Models" (2024) and the config.json of the Hugging Face model cards. Mixtral
is Jiang et al., "Mixtral of Experts" (2024), table 1. The tiny rows are for tests: a training
step on CPU takes milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class Preset:
    """One zoo entry: a family, the config fields it sets, and where the numbers come from."""

    name: str
    """Preset name, e.g. ``"gpt-175b"``."""
    family: str
    """``"gpt"``, ``"llama"`` or ``"moe"``."""
    fields: Mapping[str, object] = field(default_factory=dict)
    """Config fields the preset sets; ``build`` overrides win over these."""
    description: str = ""
    """One line: what the model is and its source."""


_MEGATRON = "Narayanan et al. 2021 (Megatron-LM, SC'21), table 1"


def _gpt(name: str, layers: int, hidden: int, heads: int, source: str = _MEGATRON) -> Preset:
    fields = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=51200,
                  seq_len=2048, dropout=0.0, attention="sdpa")
    return Preset(name, "gpt", MappingProxyType(fields),
                  f"GPT, {layers} layers, hidden {hidden}, {heads} heads; {source}")


def _llama(
    name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, source: str
) -> Preset:
    fields = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
                  ffn_hidden_size=ffn, vocab_size=128256, seq_len=8192, rope_theta=500000.0)
    return Preset(name, "llama", MappingProxyType(fields),
                  f"Llama 3, {layers} layers, hidden {hidden}, GQA {heads}/{kv} heads; {source}")


_LLAMA3 = "Grattafiori et al. 2024 (The Llama 3 Herd of Models), table 3; HF model card"

PRESETS: Mapping[str, Preset] = MappingProxyType({p.name: p for p in (
    _gpt("gpt-1.7b", 24, 2304, 24),
    _gpt("gpt-3.6b", 30, 3072, 32),
    _gpt("gpt-7.5b", 36, 4096, 32),
    _gpt("gpt-18b", 40, 6144, 48),
    _gpt("gpt-39b", 48, 8192, 64),
    _gpt("gpt-76b", 60, 10240, 80),
    _gpt("gpt-145b", 80, 12288, 96),
    _gpt("gpt-175b", 96, 12288, 96, "GPT-3 175B, Brown et al. 2020, table 2.1, Megatron form"),
    _gpt("gpt-310b", 96, 16384, 128),
    _gpt("gpt-530b", 105, 20480, 128),
    _gpt("gpt-1t", 128, 25600, 160),
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, f"{_LLAMA3} meta-llama/Meta-Llama-3-8B"),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, f"{_LLAMA3} meta-llama/Meta-Llama-3-70B"),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, f"{_LLAMA3} meta-llama/Llama-3.1-405B"),
    Preset("mixtral-8x7b", "moe", MappingProxyType(dict(
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
        num_experts=8, top_k=2, vocab_size=32000, seq_len=4096, rope_theta=1e6)),
        "Mixtral 8x7B, 8 experts top-2, 32 layers, hidden 4096; Jiang et al. 2024, table 1; "
        "HF mistralai/Mixtral-8x7B-v0.1"),
    Preset("tiny-gpt", "gpt", MappingProxyType(dict(
        num_layers=2, hidden_size=64, num_heads=4, vocab_size=256, seq_len=32)),
        "Tiny GPT for tests and CPU verification (2 layers, hidden 64)"),
    Preset("tiny-llama", "llama", MappingProxyType(dict(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=128,
        vocab_size=256, seq_len=32)),
        "Tiny Llama (GQA 4/2 heads) for tests and CPU verification"),
    Preset("tiny-moe", "moe", MappingProxyType(dict(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=64,
        num_experts=4, top_k=2, vocab_size=256, seq_len=32)),
        "Tiny MoE (4 experts, top-2) for tests and CPU verification"),
)})
"""Every preset, in the order ``autopar.models.names()`` lists them."""
