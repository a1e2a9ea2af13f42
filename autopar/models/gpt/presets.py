"""The ``gpt`` presets: Megatron-LM's GPT shapes, GPT-3 175B, and a tiny GPT for tests.

The full-size rows are table 1 of Narayanan et al., "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM" (SC 2021; vocabulary 51200, sequence 2048), plus
GPT-3 175B (Brown et al., 2020, table 2.1) in the same Megatron form.
"""

from __future__ import annotations

from types import MappingProxyType

from autopar.models.presets import Preset

_MEGATRON = "Narayanan et al. 2021 (Megatron-LM, SC'21), table 1"


def _gpt(name: str, layers: int, hidden: int, heads: int, source: str = _MEGATRON) -> Preset:
    fields = dict(num_layers=layers, hidden_size=hidden, num_heads=heads, vocab_size=51200,
                  seq_len=2048, dropout=0.0, attention="sdpa")
    return Preset(name, "gpt", MappingProxyType(fields),
                  f"GPT, {layers} layers, hidden {hidden}, {heads} heads; {source}")


PRESETS: tuple[Preset, ...] = (
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
    Preset("tiny-gpt", "gpt", MappingProxyType(dict(
        num_layers=2, hidden_size=64, num_heads=4, vocab_size=256, seq_len=32)),
        "Tiny GPT for tests and CPU verification (2 layers, hidden 64)", tiny=True),
)
"""By size, the tiny one last."""
