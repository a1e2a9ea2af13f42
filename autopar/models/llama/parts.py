"""Where a Llama-style decoder's pieces are for the passes (``ModelParts``); the ``moe`` family
shares it.

Before the blocks: ``tok_emb``; every block is called ``layers[i](x, cos, sin)`` with the first
``seq_len`` rows of the model's RoPE tables (the root's buffers ``rope_cos``/``rope_sin``, which
every stage keeps; under context parallelism the rows of the positions the rank holds; in the
activations' dtype, ``model.rope_in_dtype``);
after them ``norm_f`` and ``head``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autopar.models.llama.model import rope_in_dtype
from autopar.models.parts import ModelParts, token_positions

if TYPE_CHECKING:
    import torch
    from torch import nn


def _embed(root: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return root.tok_emb(tokens)


def _rope(root: nn.Module, x: torch.Tensor, seq_len: int) -> tuple:
    positions = token_positions(root, seq_len, x.device)
    if positions is None:
        return rope_in_dtype(x, root.rope_cos.narrow(0, 0, seq_len),
                             root.rope_sin.narrow(0, 0, seq_len))
    # context parallelism: the rows of the rank's chunks of the sequence
    return rope_in_dtype(x, root.rope_cos.index_select(0, positions),
                         root.rope_sin.index_select(0, positions))


def _finish(root: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return root.head(root.norm_f(x))


DECODER_PARTS = ModelParts(
    blocks="layers", first=("tok_emb",), last=("norm_f", "head"), head="head",
    embedding="tok_emb", embed=_embed, finish=_finish, block_args=_rope)
