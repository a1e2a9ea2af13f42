"""The ``hf-gpt2`` family: transformers' ``GPT2LMHeadModel``, recognised by its layout.

What is GPT-2's own, which a traced description cannot read (transformers' forward does not
trace with ``torch.fx``): the learned positions ``transformer.wpe`` added to the token
embedding before the dropout, the blocks called as ``block(x, None, mask)`` (the mask only for
eager attention, which builds none itself; SDPA attention is causal without one), and the head
``lm_head`` (tied to ``transformer.wte``) after ``transformer.ln_f``. Under context
parallelism the learned positions are the global ones of the rank's chunks
(``models.parts.token_positions``) and the attention runs autopar's context-parallel function
through transformers' attention interface (``hf_llama/context.py``), with no mask passed.

Not run: tensor parallelism (its projections are transformers' ``Conv1D``, whose weight is
(in, out), not ``nn.Linear`` layers the engine's column and row styles split; and q, k and v
are one fused ``c_attn``). No per-parameter
init scheme (``Conv1D`` weights and the residual projections' 1/sqrt(2 L) scaling are
transformers' ``_init_weights``): a sharded build builds the model whole once on the CPU.
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.models.family import Family, register
from autopar.models.hf_llama.context import (CONTEXT_ATTENTION, is_context_attention,
                                              use_context_attention)
from autopar.models.parts import ModelParts, causal_mask, stage_config, stage_seq_len, token_positions

LAYOUT = ("transformer.wte", "transformer.wpe", "transformer.drop", "transformer.h",
          "transformer.ln_f", "lm_head")
BLOCK_CHILDREN = ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj")


def mismatch(model: nn.Module) -> str | None:
    """``None`` for a model with GPT-2's modules, else what it lacks."""
    missing = [p for p in LAYOUT if not _has(model, p)]
    if missing:
        return f"it has no {', '.join(missing)}"
    if getattr(getattr(model, "config", None), "add_cross_attention", False):
        return "its blocks cross-attend to an encoder's states"
    for i, block in enumerate(model.get_submodule("transformer.h")):
        lacking = [p for p in BLOCK_CHILDREN if not _has(block, p)]
        if lacking:
            return f"its block transformer.h.{i} has no {', '.join(lacking)}"
    return None


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _embed(root: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    positions = token_positions(root, stage_seq_len(root), tokens.device)
    if positions is None:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
    t = root.transformer
    return t.drop(t.wte(tokens) + t.wpe(positions)[None])


def _block_args(root: nn.Module, x: torch.Tensor, seq_len: int) -> tuple:
    if getattr(stage_config(root), "_attn_implementation", "sdpa") in ("sdpa", CONTEXT_ATTENTION):
        return (None,)
    return (causal_mask(seq_len, None, x),)


def _call_block(block: nn.Module, x: torch.Tensor, extra: tuple) -> torch.Tensor:
    (mask,) = extra
    out = block(x, None, mask)
    return out[0] if isinstance(out, tuple) else out


def _finish(root: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return root.lm_head(root.transformer.ln_f(x))


HF_GPT2_PARTS = ModelParts(
    blocks="transformer.h", first=("transformer.wte", "transformer.wpe", "transformer.drop"),
    last=("transformer.ln_f", "lm_head"), head="lm_head", embedding="transformer.wte",
    embed=_embed, finish=_finish, block_args=_block_args, call_block=_call_block)

FAMILY = register(Family(
    name="hf-gpt2", parts=HF_GPT2_PARTS, mismatch=mismatch,
    context_attention=is_context_attention, use_context_attention=use_context_attention,
    tensor_parallel="GPT-2's projections are transformers Conv1D layers with (in, out) weights "
                    "and one fused c_attn, not the nn.Linear q/k/v the column and row styles "
                    "split"))

__all__ = ["FAMILY", "HF_GPT2_PARTS", "LAYOUT"]
