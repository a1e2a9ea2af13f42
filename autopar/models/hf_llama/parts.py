"""Where a transformers Llama-style causal LM's pieces are for the passes (``ModelParts``).

The layout of ``LlamaForCausalLM`` and the architectures written like it (Mistral, Qwen2, Qwen3,
Gemma):
``model.embed_tokens``, the blocks ``model.layers``, ``model.norm``, ``lm_head``, and the rotary
embedding ``model.rotary_emb``, which every stage keeps and calls to make the (cos, sin) the
blocks take by keyword; each block holds separate q/k/v/o projections, one dense gated MLP and
two norms (``BLOCK_CHILDREN``, ``BLOCK_LINEARS``). ``mismatch`` recognises a model by that
layout, not by its class; what runs inside a block (Gemma's (1 + w) norms, Qwen2's biases)
is the model's own code. A sliding attention window (Mistral, Qwen2) is masked as the model
does. Under context parallelism the rotary tables are of the global positions of the rank's
chunks (``models.parts.token_positions``) and the blocks get no mask: their attention runs
autopar's context-parallel function (``context.py``), which masks causally -- and by the
window -- by global position.
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.models.hf_llama.context import (CONTEXT_ATTENTION, attention_window,
                                              runs_context_attention)
from autopar.models.parts import ModelParts, causal_mask, stage_config, token_positions

LAYOUT = ("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head")
"""The submodules a model of this family has."""

BLOCK_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
"""The ``nn.Linear`` layers every block has: separate q/k/v projections (attention reads its
local heads from their width) and one dense gated MLP. Fused projections (Phi-3's
``qkv_proj``, ``gate_up_proj``) or experts (Mixtral, Qwen2-MoE) are another layout."""

BLOCK_CHILDREN = frozenset({"self_attn", "mlp", "input_layernorm", "post_attention_layernorm"})
"""A block's children: one pre-norm before attention and one before the MLP (Gemma 2's extra
norms around the MLP are another layout, which the sequence-parallel styles do not cover)."""


SCALINGS = {"final_logit_softcapping": ("soft-caps the logits", None),
            "logits_scaling": ("divides the logits by a factor", 1),
            "logit_scale": ("scales the logits", 1),
            "embedding_multiplier": ("scales the embeddings", 1)}
"""Config fields with which a transformers forward changes the embeddings or the logits
outside the modules of ``LAYOUT`` (Gemma 2's soft cap, Granite's multipliers, Cohere's logit
scale), each with what it does and its value that changes nothing."""


def root_mismatch(model: nn.Module) -> str | None:
    """What ``model`` lacks of ``LAYOUT``, or an embedding or logits its forward scales or
    soft-caps outside those modules (``SCALINGS``, which a pipeline stage's embedding step and
    head, calling the modules, would not); ``None`` where neither: the check every
    transformers family laid out like Llama (``hf_moe``, ``hf_phi3``) starts with. Such a
    model is the generic family's, read off its forward."""
    missing = [path for path in LAYOUT if submodule(model, path) is None]
    if missing:
        return f"it has no {', '.join(missing)}"
    config = getattr(model, "config", None)
    for name, (what, neutral) in SCALINGS.items():
        value = getattr(config, name, None)
        if value is not None and value != neutral:
            return (f"its forward {what} ({name}={value}), which a pipeline stage calling "
                    "its modules would not")
    return None


def mismatch(model: nn.Module) -> str | None:
    """``None`` for a model with every module of ``LAYOUT`` and blocks of ``BLOCK_LINEARS``,
    else what it lacks."""
    why = root_mismatch(model)
    if why is not None:
        return why
    for i, block in enumerate(model.get_submodule("model.layers")):
        lacking = [path for path in BLOCK_LINEARS
                   if not isinstance(submodule(block, path), nn.Linear)]
        if lacking:
            return (f"its block model.layers.{i} has no linear {', '.join(lacking)} "
                    f"(fused projections or experts are not Llama's layout)")
        children = {name for name, _ in block.named_children()}
        if children != BLOCK_CHILDREN:
            return (f"its block model.layers.{i} holds {', '.join(sorted(children))}, not "
                    f"Llama's {', '.join(sorted(BLOCK_CHILDREN))}")
    return None


def submodule(module: nn.Module, path: str) -> nn.Module | None:
    """The submodule of ``module`` at ``path``; ``None`` where it has none."""
    try:
        return module.get_submodule(path)
    except AttributeError:
        return None



def sliding_window(root_config: object, block: nn.Module) -> int | None:
    """The attention window of ``block`` (``context.attention_window`` of its ``self_attn``);
    ``None``: full."""
    return attention_window(root_config, getattr(block, "self_attn", None))


def _block_args(root: nn.Module, x: torch.Tensor, seq_len: int) -> tuple:
    # context parallelism: the global positions of the rank's chunks, for RoPE
    positions = token_positions(root, seq_len, x.device)
    if positions is None:
        positions = torch.arange(seq_len, device=x.device)
    positions = positions.unsqueeze(0)
    cos, sin = root.model.rotary_emb(x, position_ids=positions)
    mask = None
    if getattr(stage_config(root), "_attn_implementation", "sdpa") not in ("sdpa", CONTEXT_ATTENTION):
        # eager attention gets no causal mask when none is passed: build the additive one
        mask = causal_mask(seq_len, None, cos)
    return (cos, sin), positions, mask, stage_config(root)


def _call_block(block: nn.Module, x: torch.Tensor, extra: tuple) -> torch.Tensor:
    (cos, sin), positions, mask, config = extra
    seq_len = positions.shape[-1]
    window = sliding_window(config, block)
    if window is not None and window < seq_len and not runs_context_attention(config):
        # the model's forward masks this layer to its window; a stage calls the block itself
        # (context-parallel attention masks the window by global position itself)
        mask = causal_mask(seq_len, window, cos)
    out = block(x, attention_mask=mask, position_ids=positions, position_embeddings=(cos, sin))
    return out[0] if isinstance(out, tuple) else out


def _embed(root: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return root.model.embed_tokens(tokens)


def _finish(root: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return root.lm_head(root.model.norm(x))


HF_LLAMA_PARTS = ModelParts(
    blocks="model.layers", first=("model.embed_tokens",), last=("model.norm", "lm_head"),
    head="lm_head", embedding="model.embed_tokens", embed=_embed, finish=_finish,
    block_args=_block_args, call_block=_call_block, shared=("model.rotary_emb",))
