"""The ``gpt`` family: Megatron-style GPT (``model.py``), its presets (``presets.py``) and its
layout for the passes (``parts.py``), registered on import."""

from __future__ import annotations

from autopar.models.family import Family, register
from autopar.models.gpt.model import GPT, GPTMLP, Attention, GPTAttention, GPTBlock, GPTConfig
from autopar.models.gpt.parts import GPT_PARTS
from autopar.models.gpt.presets import PRESETS

FAMILY = register(Family(name="gpt", parts=GPT_PARTS, config_class=GPTConfig, model_class=GPT,
                         presets=PRESETS, init=GPT.init_scheme))

__all__ = ["Attention", "FAMILY", "GPT", "GPTAttention", "GPTBlock", "GPTConfig", "GPTMLP"]
