"""Megatron-style GPT: learned positions, pre-LayerNorm blocks, GELU MLP, tied head.

Shapes and parameter count follow Narayanan et al., "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM" (SC 2021), section 5.1:
``P = 12 l h^2 (1 + 13 / (12 h) + (V + s) / (12 l h))`` with ``ffn = 4h``; ``GPTConfig.num_params``
is that count plus the final LayerNorm (2h), which the paper leaves out.

Module names are a contract (tracing, the tensor-parallel analysis and the DTensor passes match
on them): ``tok_emb``, ``pos_emb``, ``emb_drop``, ``layers[i].{ln1, attn.{qkv, proj, resid_drop},
ln2, mlp.{fc1, act, fc2, drop}}``, ``norm_f``, ``head``; with eager attention also
``attn.attn_drop`` and the buffer ``attn.causal_mask``.

The fused ``qkv`` output is laid out head-major, ``(heads, 3, head_dim)``, as in Megatron-LM, so a
contiguous split of its output features over tensor-parallel ranks keeps whole heads with their
q, k and v; views use ``-1`` for the head count so the same code runs on a local shard.
"""

from __future__ import annotations

from collections.abc import Callable
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from autopar.core.errors import AutoparError
from autopar.models.layers import (
    GPT2Init,
    check_bool,
    check_divides,
    check_positive_int,
    coerce_choice,
    lm_loss,
)


class Attention(StrEnum):
    """How the attention core is computed."""

    SDPA = "sdpa"
    """``F.scaled_dot_product_attention``: fused, the s x s scores are never stored."""
    EAGER = "eager"
    """Matmul, mask, softmax, dropout, matmul as separate ops (Megatron-LM 2021), so activation
    memory matches Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
    Models" (2022), which counts the 5 a s^2 b bytes of scores, softmax and dropout mask."""


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Shape of a Megatron-style GPT."""

    family: ClassVar[str] = "gpt"
    gated: ClassVar[bool] = False
    """GELU MLP, LayerNorm, learned positions, biases (``autopar.models.shape``)."""

    num_layers: int
    """Transformer blocks (l)."""
    hidden_size: int
    """Width of the residual stream (h)."""
    num_heads: int
    """Attention heads (a); must divide ``hidden_size``."""
    vocab_size: int
    """Vocabulary size (V); the head's output width."""
    seq_len: int
    """Maximum sequence length (s): rows of ``pos_emb`` and of the eager causal mask."""
    ffn_hidden_size: int | None = None
    """Hidden width of the MLP; ``None`` means 4 * hidden_size (GPT-2, Megatron-LM)."""
    dropout: float = 0.0
    """Dropout probability after embeddings, on attention probabilities and on residuals."""
    attention: Attention = Attention.SDPA
    """Attention core: ``"sdpa"`` (fused) or ``"eager"`` (separate ops); see ``Attention``."""
    tie_embeddings: bool = True
    """Share the head's weight with ``tok_emb`` (GPT-2, Megatron-LM)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "vocab_size", "seq_len"):
            check_positive_int(self, name)
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        check_positive_int(self, "ffn_hidden_size")
        check_divides(self, "num_heads", "hidden_size")
        dropout = self.dropout
        is_number = isinstance(dropout, (int, float)) and not isinstance(dropout, bool)
        if not is_number or not 0 <= dropout < 1:
            raise AutoparError(
                f"dropout must be a probability in [0, 1), got {dropout!r}",
                where="GPTConfig.dropout",
                fix="pass dropout=0.0 to switch it off, or a value below 1",
            )
        coerce_choice(self, "attention", Attention)
        check_bool(self, "tie_embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def num_params(self) -> int:
        """Exact parameter count of the built model, a tied head counted once."""
        h, f = self.hidden_size, self.ffn_hidden_size
        assert f is not None  # set in __post_init__
        block = (3 * h * h + 3 * h) + (h * h + h) + (2 * h * f + f + h) + 2 * (2 * h)
        embeddings = (self.vocab_size + self.seq_len) * h
        head = 0 if self.tie_embeddings else self.vocab_size * h
        return embeddings + self.num_layers * block + 2 * h + head


class GPTAttention(nn.Module):
    """Causal multi-head self-attention with a fused, biased ``qkv`` projection."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.head_dim = config.head_dim
        self.dropout = float(config.dropout)
        self.eager = config.attention == Attention.EAGER
        self.qkv = nn.Linear(h, 3 * h, bias=True)
        self.proj = nn.Linear(h, h, bias=True)
        self.resid_drop = nn.Dropout(config.dropout)
        if self.eager:
            self.scale = 1.0 / math.sqrt(self.head_dim)
            self.attn_drop = nn.Dropout(config.dropout)
            # True above the diagonal: the future positions that masked_fill sets to -inf.
            mask = torch.ones(config.seq_len, config.seq_len, dtype=torch.bool).triu(1)
            self.register_buffer("causal_mask", mask, persistent=False)
        self.context_parallel: nn.Module | None = None
        """Set by ``passes/context_parallel.py`` under cp > 1 (fused attention only): attention
        of this rank's queries against the whole sequence's keys and values."""
        self.attention_core_runner: Callable[..., torch.Tensor] | None = None
        """Set by ``passes/checkpointing.py`` under the ``selective`` policy (eager attention):
        ``runner(core, q, k, v)`` runs ``core`` so that its scores, probabilities and dropout
        mask are recomputed in the backward (Korthikanti et al. 2022)."""

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The eager attention core: q.k^T, scale, causal mask, softmax, dropout, .v."""
        s = q.shape[-2]
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        # causal_mask[:s, :s], written with narrow so that torch.fx traces it (s is a Proxy).
        mask = self.causal_mask.narrow(0, 0, s).narrow(1, 0, s)
        scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = self.attn_drop(probs)
        return torch.matmul(probs, v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # (b, s, heads, 3, head_dim) -> three (b, heads, s, head_dim) views, no copies.
        q, k, v = self.qkv(x).view(b, s, -1, 3, self.head_dim).unbind(dim=3)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.eager and self.attention_core_runner is not None:
            out = self.attention_core_runner(self.core, q, k, v)
        elif self.eager:
            out = self.core(q, k, v)
        elif self.context_parallel is not None:
            out = self.context_parallel(q, k, v,
                                        dropout_p=self.dropout if self.training else 0.0)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
            )
        out = out.transpose(1, 2).reshape(b, s, -1)
        return self.resid_drop(self.proj(out))


class GPTMLP(nn.Module):
    """``drop(fc2(gelu_tanh(fc1(x))))``, as in GPT-2 and Megatron-LM."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        f = config.ffn_hidden_size
        assert f is not None  # set in GPTConfig.__post_init__
        self.fc1 = nn.Linear(config.hidden_size, f, bias=True)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(f, config.hidden_size, bias=True)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class GPTBlock(nn.Module):
    """Pre-norm block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.hidden_size)
        self.attn = GPTAttention(config)
        self.ln2 = nn.LayerNorm(config.hidden_size)
        self.mlp = GPTMLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(GPT2Init):
    """Megatron-style GPT; ``forward(tokens, targets=None)`` gives logits, or the mean loss.
    Its init is GPT-2's (``layers.GPT2Init``); the eager causal masks are computed."""

    RESIDUAL = ("attn.proj.weight", "mlp.fc2.weight")

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.hidden_size)
        self.pos_emb = nn.Embedding(config.seq_len, config.hidden_size)
        self.emb_drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList(GPTBlock(config) for _ in range(config.num_layers))
        self.norm_f = nn.LayerNorm(config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def _buffer(self, name: str) -> torch.Tensor:
        if name.endswith("attn.causal_mask"):
            s = self.config.seq_len
            return torch.ones(s, s, dtype=torch.bool).triu(1)
        return super()._buffer(name)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        _, s = tokens.shape
        positions = torch.arange(s, device=tokens.device)
        x = self.emb_drop(self.tok_emb(tokens) + self.pos_emb(positions))
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm_f(x))
        if targets is None:
            return logits
        return lm_loss(logits, targets)
