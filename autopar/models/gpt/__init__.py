"""The ``gpt`` family: Megatron-style GPT (``model.py``), its presets (``presets.py``) and its
layout for the passes (``parts.py``), registered on import."""

from __future__ import annotations

from autopar.models.family import Family, register
from autopar.models.gpt.model import GPT, GPTMLP, Attention, GPTAttention, GPTBlock, GPTConfig
from autopar.models.gpt.parts import GPT_PARTS
from autopar.models.gpt.presets import PRESETS



def is_fused_attention(module) -> bool:
    """A GPT attention on SDPA, which takes a context-parallel hook (``Family.context_attention``;
    the eager one computes its scores itself and does not)."""
    return isinstance(module, GPTAttention) and not module.eager


FAMILY = register(Family(name="gpt", parts=GPT_PARTS, config_class=GPTConfig, model_class=GPT,
                         presets=PRESETS, init=GPT.init_scheme,
                         context_attention=is_fused_attention))

__all__ = ["Attention", "FAMILY", "GPT", "GPTAttention", "GPTBlock", "GPTConfig", "GPTMLP"]
