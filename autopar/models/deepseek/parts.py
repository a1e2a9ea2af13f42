"""Where a DeepSeek-V3-style decoder's pieces are for the passes: the Llama layout
(``llama/parts.py``) with the first-k dense layers run by the first pipeline stage after the
embedding, as the model does."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from autopar.models.llama.parts import DECODER_PARTS
from autopar.models.parts import stage_info

if TYPE_CHECKING:
    import torch
    from torch import nn


def _embed(root: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    x = root.tok_emb(tokens)
    # the blocks' RoPE rows (under context parallelism those of the rank's chunks), in x's
    # dtype: FSDP2's mixed precision casts a block's inputs, and the dense layers are no FSDP
    # unit of their own (the stage root is); the one-process bf16 copy casts buffers
    info = stage_info(root)  # the whole sequence's length, as the stage gives the blocks
    seq_len = tokens.size(1) if info is None else info.seq_len
    cos, sin = (t.to(x.dtype) for t in DECODER_PARTS.block_args(root, x, seq_len))
    for layer in root.dense_layers:
        x = layer(x, cos, sin)
    return x


DEEPSEEK_PARTS = replace(DECODER_PARTS, first=("tok_emb", "dense_layers"), embed=_embed,
                         embedding_in_shards=False)
"""Under sequence parallelism the embedding step -- the embedding and the dense layers, which
read the whole sequence's RoPE rows -- runs whole, and the first block's input is sliced to
the rank's shard (``ModelParts.embedding_in_shards``)."""
