"""The ``hf-phi3`` family: transformers' ``Phi3ForCausalLM``, recognised by its layout.

A Phi-3 model is laid out and called as a Llama-style one (``model.embed_tokens``,
``model.layers``, ``model.norm``, ``model.rotary_emb``, ``lm_head``; its decoder layer takes the
same arguments), so its stages run the ``hf-llama`` family's parts; and its init is
transformers' ``_init_weights`` laws, drawn one parameter at a time as ``hf-llama``'s. What is
its own: q, k and v fused in one ``self_attn.qkv_proj`` and the MLP's gate and up in one
``mlp.gate_up_proj``, which a column split would cut across q/k/v (and gate/up) rather than by
heads -- tensor parallelism is refused with that reason. Context parallelism runs its attention
as ``hf-llama``'s (``hf_llama/context.py``).
"""

from __future__ import annotations

from torch import nn

from autopar.models.family import Family, register
from autopar.models.hf_llama.context import is_context_attention, use_context_attention
from autopar.models.hf_llama.init import hf_scheme
from autopar.models.hf_llama.parts import HF_LLAMA_PARTS, root_mismatch, submodule

BLOCK_LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
"""Phi-3's fused projections, every block has them as ``nn.Linear``."""


def mismatch(model: nn.Module) -> str | None:
    """``None`` for a model with Llama's layout and Phi-3's fused blocks, else what it lacks."""
    why = root_mismatch(model)
    if why is not None:
        return why
    for i, block in enumerate(model.get_submodule("model.layers")):
        lacking = [p for p in BLOCK_LINEARS if not isinstance(submodule(block, p), nn.Linear)]
        if lacking:
            return f"its block model.layers.{i} has no linear {', '.join(lacking)}"
    return None


FAMILY = register(Family(
    name="hf-phi3", parts=HF_LLAMA_PARTS, mismatch=mismatch, init=hf_scheme,
    context_attention=is_context_attention, use_context_attention=use_context_attention,
    tensor_parallel="Phi-3 fuses q, k and v in one qkv_proj and gate and up in one "
                    "gate_up_proj: a column split would cut across them, not by heads"))

__all__ = ["FAMILY", "BLOCK_LINEARS"]
