"""The ``llama`` presets: Llama 3 8B, 70B and 405B, and a tiny Llama for tests.

The full-size rows are table 3 of Grattafiori et al., "The Llama 3 Herd of Models" (2024) and
the config.json of the Hugging Face model cards.
"""

from __future__ import annotations

from types import MappingProxyType

from autopar.models.presets import Preset

_LLAMA3 = "Grattafiori et al. 2024 (The Llama 3 Herd of Models), table 3; HF model card"


def _llama(
    name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, source: str
) -> Preset:
    fields = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=kv,
                  ffn_hidden_size=ffn, vocab_size=128256, seq_len=8192, rope_theta=500000.0)
    return Preset(name, "llama", MappingProxyType(fields),
                  f"Llama 3, {layers} layers, hidden {hidden}, GQA {heads}/{kv} heads; {source}")


PRESETS: tuple[Preset, ...] = (
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, f"{_LLAMA3} meta-llama/Meta-Llama-3-8B"),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, f"{_LLAMA3} meta-llama/Meta-Llama-3-70B"),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, f"{_LLAMA3} meta-llama/Llama-3.1-405B"),
    Preset("tiny-llama", "llama", MappingProxyType(dict(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=128,
        vocab_size=256, seq_len=32)),
        "Tiny Llama (GQA 4/2 heads) for tests and CPU verification", tiny=True),
)
"""By size, the tiny one last."""
