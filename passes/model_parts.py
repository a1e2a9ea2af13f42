"""Where a model's pieces are and how a pipeline stage calls them.

The passes split a model into stages and run each stage's blocks one by one (to checkpoint them
as planned), so they need to know, per model family, the modules before the blocks, the block
list, the modules after it, and how each is called. ``parts_of(model)`` gives that for the
built-in ``gpt`` and ``llama``/``moe`` families and for a Hugging Face ``LlamaForCausalLM``
(anything with ``model.embed_tokens``, ``model.layers``, ``model.norm``, ``lm_head`` and a
``model.rotary_emb``); another model raises ``AutoparError`` saying what is missing.

Every function takes the *stage root*: a module that holds the model's submodules under their
original names (see ``passes/stage.py``), so ``root.tok_emb`` is the model's ``tok_emb``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ParallelStyle, PrepareModuleOutput

from autopar.core.errors import AutoparError
from autopar.models.gpt import GPT
from autopar.models.llama import DecoderLM


@dataclass(frozen=True)
class ModelParts:
    """One family's layout and calling convention."""

    family: str
    blocks: str
    """Path of the ``nn.ModuleList`` of repeated blocks (``layers``, ``model.layers``)."""
    first: tuple[str, ...]
    """Modules the first stage runs before the blocks."""
    last: tuple[str, ...]
    """Modules the last stage runs after the blocks (final norm, head)."""
    head: str
    """The module whose output is the logits."""
    embedding: str
    """The token embedding (its whole output is sliced to sequence shards under sequence
    parallelism when the plan keeps the table whole)."""
    embed: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    """(root, tokens) -> the first block's input."""
    block_args: Callable[[nn.Module, torch.Tensor, int], tuple]
    """(root, activations, seq_len) -> the extra arguments every block takes."""
    call_block: Callable[[nn.Module, torch.Tensor, tuple], torch.Tensor]
    """(block, x, extra) -> the block's output."""
    finish: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    """(root, last block's output) -> logits."""
    shared: tuple[str, ...] = ()
    """Modules every stage keeps (rotary tables)."""
    sequence_parallel_styles: Callable[[], dict[str, ParallelStyle]] = field(
        default=lambda: {})
    """The family's own extra styles under sequence parallelism."""


def _gpt_embed(root: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(tokens.shape[1], device=tokens.device)
    return root.emb_drop(root.tok_emb(tokens) + root.pos_emb(positions))


def _gpt_sp() -> dict[str, ParallelStyle]:
    # The token embedding hands the blocks sequence shards (b, s/tp, h); the position table's
    # output (s, h) is added to it, so it is split the same way, along its dim 0.
    return {"pos_emb": PrepareModuleOutput(output_layouts=Replicate(),
                                           desired_output_layouts=Shard(0))}


def _call(block: nn.Module, x: torch.Tensor, extra: tuple) -> torch.Tensor:
    return block(x, *extra)


def _head(root: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return root.head(root.norm_f(x))


def _rope(root: nn.Module, x: torch.Tensor, s: int) -> tuple:
    return root.rope_cos.narrow(0, 0, s), root.rope_sin.narrow(0, 0, s)


GPT_PARTS = ModelParts(
    family="gpt", blocks="layers", first=("tok_emb", "pos_emb", "emb_drop"),
    last=("norm_f", "head"), head="head", embedding="tok_emb", embed=_gpt_embed,
    block_args=lambda r, x, s: (), call_block=_call, finish=_head,
    sequence_parallel_styles=_gpt_sp)

DECODER_PARTS = ModelParts(
    family="llama", blocks="layers", first=("tok_emb",), last=("norm_f", "head"), head="head",
    embedding="tok_emb", embed=lambda root, tokens: root.tok_emb(tokens), block_args=_rope,
    call_block=_call, finish=_head)


def _hf_block_args(root: nn.Module, x: torch.Tensor, s: int) -> tuple:
    positions = torch.arange(s, device=x.device).unsqueeze(0)
    cos, sin = root.model.rotary_emb(x, position_ids=positions)
    mask = None
    if getattr(root.config, "_attn_implementation", "sdpa") != "sdpa":
        # eager attention gets no causal mask when none is passed: build the additive one
        mask = torch.full((s, s), float("-inf"), device=x.device, dtype=cos.dtype).triu(1)
        mask = mask[None, None]
    return (cos, sin), positions, mask


def _hf_call(block: nn.Module, x: torch.Tensor, extra: tuple) -> torch.Tensor:
    (cos, sin), positions, mask = extra
    out = block(x, attention_mask=mask, position_ids=positions, position_embeddings=(cos, sin))
    return out[0] if isinstance(out, tuple) else out


HF_LLAMA_PARTS = ModelParts(
    family="transformers-llama", blocks="model.layers", first=("model.embed_tokens",),
    last=("model.norm", "lm_head"), head="lm_head", embedding="model.embed_tokens",
    embed=lambda root, tokens: root.model.embed_tokens(tokens), block_args=_hf_block_args,
    call_block=_hf_call, finish=lambda root, x: root.lm_head(root.model.norm(x)),
    shared=("model.rotary_emb",))


def _has(model: nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


def parts_of(model: nn.Module) -> ModelParts:
    """The parts of ``model``; ``AutoparError`` for a layout the passes do not know."""
    if isinstance(model, GPT):
        return GPT_PARTS
    if isinstance(model, DecoderLM):
        return DECODER_PARTS
    needed = ("model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb", "lm_head")
    missing = [p for p in needed if not _has(model, p)]
    if not missing:
        return HF_LLAMA_PARTS
    raise AutoparError(
        f"the execution passes do not know how to split a {type(model).__name__} into pipeline "
        f"stages (it has no {', '.join(missing)})",
        where="autopar.parallelize(model=...)",
        fix="use a built-in model (autopar.models.build) or a transformers Llama-style causal "
            "LM; planning and estimates work for any model")
