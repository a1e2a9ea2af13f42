"""The ``hf-moe`` family's init: ``hf_llama``'s laws (``hf_llama/init.py``) plus transformers'
own for the MoE modules (the ``_init_weights`` of Qwen2-MoE, Qwen3-MoE and Mixtral in 5.x):
the stacked experts' ``gate_up_proj``/``down_proj`` and the router's ``weight`` are
N(0, ``initializer_range``)."""

from __future__ import annotations

from torch import nn

from autopar.models.hf_llama.init import hf_scheme
from autopar.models.hf_moe.parts import EXPERT_WEIGHTS
from autopar.models.init import InitScheme, Law, Normal


def _moe_law(attr: str, module: nn.Module, std: float) -> Law | None:
    if attr in EXPERT_WEIGHTS and getattr(module, attr).dim() == 3:
        return Normal(std)
    if attr == "weight" and hasattr(module, "top_k") and getattr(module, attr).dim() == 2:
        return Normal(std)  # the router
    return None


def moe_scheme(model: nn.Module) -> InitScheme:
    """The init scheme of a transformers MoE decoder (on meta or allocated)."""
    return hf_scheme(model, other=_moe_law)
