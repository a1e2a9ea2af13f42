"""The ``llama`` family: the Llama 3-style dense decoder (``model.py``, whose ``DecoderLM`` the
``moe`` family shares), its presets (``presets.py``) and its layout for the passes
(``parts.py``), registered on import."""

from __future__ import annotations

from autopar.models.family import Family, register
from autopar.models.llama.model import (
    DecoderConfig,
    DecoderLM,
    Llama,
    LlamaAttention,
    LlamaBlock,
    LlamaConfig,
    SwiGLU,
    apply_rope,
    rope_tables,
    rotate_half,
)
from autopar.models.llama.parts import DECODER_PARTS
from autopar.models.llama.presets import PRESETS



def is_decoder_attention(module) -> bool:
    """The decoder's attention, which takes a context-parallel hook (``Family.context_attention``;
    the ``moe`` family's too)."""
    return isinstance(module, LlamaAttention)


FAMILY = register(Family(name="llama", parts=DECODER_PARTS, config_class=LlamaConfig,
                         model_class=Llama, presets=PRESETS, init=Llama.init_scheme,
                         context_attention=is_decoder_attention))

__all__ = ["DecoderConfig", "DecoderLM", "FAMILY", "Llama", "LlamaAttention", "LlamaBlock",
           "LlamaConfig", "SwiGLU", "apply_rope", "is_decoder_attention", "rope_tables",
           "rotate_half"]
