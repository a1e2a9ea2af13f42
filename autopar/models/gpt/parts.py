"""Where a GPT's pieces are for the passes (``ModelParts``).

Before the blocks: ``tok_emb`` plus the learned positions ``pos_emb``, then ``emb_drop``; the
blocks ``layers[i](x)`` take the activations only; after them ``norm_f`` and the (tied) ``head``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from autopar.models.parts import ModelParts, stage_seq_len, token_positions

if TYPE_CHECKING:
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle


def _embed(root: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    # context parallelism: the rank holds chunks of the stage's sequence of root.seq_len tokens
    positions = token_positions(root, stage_seq_len(root), tokens.device)
    if positions is None:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
    return root.emb_drop(root.tok_emb(tokens) + root.pos_emb(positions))


def _finish(root: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return root.head(root.norm_f(x))


def _sequence_parallel_styles() -> dict[str, ParallelStyle]:
    # The token embedding hands the blocks sequence shards (b, s/tp, h); the position table's
    # output (s, h) is added to it, so it is split the same way, along its dim 0.
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleOutput

    return {"pos_emb": PrepareModuleOutput(output_layouts=Replicate(),
                                           desired_output_layouts=Shard(0))}


GPT_PARTS = ModelParts(
    blocks="layers", first=("tok_emb", "pos_emb", "emb_drop"), last=("norm_f", "head"),
    head="head", embedding="tok_emb", embed=_embed, finish=_finish,
    sequence_parallel_styles=_sequence_parallel_styles)
