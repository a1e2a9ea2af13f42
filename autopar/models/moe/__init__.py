"""The ``moe`` family: the Mixtral-style mixture-of-experts decoder (``model.py``), GPT-OSS's
attention with sinks and a sliding window (``attention.py``), its presets (``presets.py``) and
the Llama layout for the passes (``llama/parts.py``: the blocks differ in their MLP and
attention only), registered on import."""

from __future__ import annotations

from autopar.models.family import Family, register
from autopar.models.llama import is_decoder_attention
from autopar.models.llama.parts import DECODER_PARTS
from autopar.models.moe.model import (Experts, MoEBlock, MoEConfig, MoELayer, MoETransformer,
                                       expert_capacity, expert_layers, moe_layers,
                                       set_aux_loss_grad_scale)
from autopar.models.moe.presets import PRESETS

FAMILY = register(Family(name="moe", parts=DECODER_PARTS, config_class=MoEConfig,
                         model_class=MoETransformer, presets=PRESETS,
                         init=MoETransformer.init_scheme,
                         context_attention=is_decoder_attention,
                         expert_layers=expert_layers))

__all__ = ["Experts", "FAMILY", "MoEBlock", "MoEConfig", "MoELayer", "MoETransformer",
           "expert_capacity", "moe_layers", "set_aux_loss_grad_scale"]
