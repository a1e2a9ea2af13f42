"""The ``deepseek`` family: the DeepSeek-V3-style decoder (``model.py``: fine-grained routed
experts, shared experts, the first k layers dense; multi-head latent attention, ``attention.py``,
or grouped-query attention), its presets (``presets.py``) and its layout for the passes
(``parts.py``), registered on import."""

from __future__ import annotations

from autopar.models.deepseek.attention import MLAttention
from autopar.models.deepseek.model import DeepSeekConfig, DeepSeekMoEBlock, DeepSeekV3
from autopar.models.deepseek.parts import DEEPSEEK_PARTS
from autopar.models.deepseek.presets import PRESETS
from autopar.models.family import Family, register
from autopar.models.llama import is_decoder_attention
from autopar.models.moe.model import expert_layers

def is_deepseek_attention(module) -> bool:
    """The blocks' attention, either kind, which takes a context-parallel hook
    (``Family.context_attention``)."""
    return is_decoder_attention(module) or isinstance(module, MLAttention)


FAMILY = register(Family(name="deepseek", parts=DEEPSEEK_PARTS, config_class=DeepSeekConfig,
                         model_class=DeepSeekV3, presets=PRESETS, init=DeepSeekV3.init_scheme,
                         context_attention=is_deepseek_attention,
                         expert_layers=expert_layers))

__all__ = ["DEEPSEEK_PARTS", "DeepSeekConfig", "DeepSeekMoEBlock", "DeepSeekV3", "FAMILY"]
