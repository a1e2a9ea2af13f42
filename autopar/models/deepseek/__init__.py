"""The ``deepseek`` family: the DeepSeek-V3-style decoder (``model.py``: fine-grained routed
experts, shared experts, the first k layers dense; grouped-query attention in place of MLA), its
presets (``presets.py``) and its layout for the passes (``parts.py``), registered on import."""

from __future__ import annotations

from autopar.models.deepseek.model import DeepSeekConfig, DeepSeekMoEBlock, DeepSeekV3
from autopar.models.deepseek.parts import DEEPSEEK_PARTS
from autopar.models.deepseek.presets import PRESETS
from autopar.models.family import Family, register
from autopar.models.llama import is_decoder_attention
from autopar.models.moe.model import expert_layers

FAMILY = register(Family(name="deepseek", parts=DEEPSEEK_PARTS, config_class=DeepSeekConfig,
                         model_class=DeepSeekV3, presets=PRESETS, init=DeepSeekV3.init_scheme,
                         context_attention=is_decoder_attention,
                         expert_layers=expert_layers))

__all__ = ["DEEPSEEK_PARTS", "DeepSeekConfig", "DeepSeekMoEBlock", "DeepSeekV3", "FAMILY"]
