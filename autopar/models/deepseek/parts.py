"""Where a DeepSeek-V3-style decoder's pieces are for the passes: the Llama layout
(``llama/parts.py``) with the first-k dense layers run by the first pipeline stage after the
embedding, as the model does."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from autopar.models.llama.parts import DECODER_PARTS

if TYPE_CHECKING:
    import torch
    from torch import nn


def _embed(root: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    x = root.tok_emb(tokens)
    s = tokens.size(1)
    # in x's dtype: FSDP2's mixed precision casts a block's inputs, and the dense layers are
    # no FSDP unit of their own (the stage root is); the one-process bf16 copy casts buffers
    cos = root.rope_cos.narrow(0, 0, s).to(x.dtype)
    sin = root.rope_sin.narrow(0, 0, s).to(x.dtype)
    for layer in root.dense_layers:
        x = layer(x, cos, sin)
    return x


DEEPSEEK_PARTS = replace(DECODER_PARTS, first=("tok_emb", "dense_layers"), embed=_embed)
