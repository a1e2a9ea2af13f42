"""Llama-style decoder: RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP.

Follows the Llama 3 architecture (Grattafiori et al., "The Llama 3 Herd of Models", 2024, table 3;
the ``meta-llama/Meta-Llama-3-8B`` model card): pre-RMSNorm blocks, RoPE with base ``rope_theta``,
GQA with ``num_kv_heads`` key/value heads, ``down(silu(gate(x)) * up(x))``, no biases, an untied
head. RoPE uses the rotate-half form of Hugging Face ``transformers`` (equal to Meta's interleaved
complex form up to a fixed permutation of the q/k projection rows) because it is plain tensor ops
and traces with ``torch.fx``.

Module names are a contract: ``tok_emb``, ``layers[i].{attn_norm, attn.{q_proj, k_proj, v_proj,
o_proj}, ffn_norm, mlp.{gate_proj, up_proj, down_proj}}``, ``norm_f``, ``head``. The RoPE tables
are non-persistent buffers ``rope_cos``/``rope_sin`` of shape (seq_len, rope_dim) held once by the
model and passed to every block as ``layer(x, cos, sin)`` (torchtitan passes ``freqs_cis`` the
same way), so they are not copied per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from autopar.core.errors import AutoparError
from autopar.models.layers import (
    GPT2Init,
    check_bool,
    check_divides,
    check_positive_float,
    check_positive_int,
    lm_loss,
)


@dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    """Fields shared by the Llama and MoE families: a RoPE/GQA/RMSNorm decoder."""

    family: ClassVar[str] = ""
    gated: ClassVar[bool] = True
    """SwiGLU MLP, RMSNorm, RoPE, no biases (``autopar.models.shape``)."""

    num_layers: int
    """Transformer blocks."""
    hidden_size: int
    """Width of the residual stream (h)."""
    num_heads: int
    """Query heads; must divide ``hidden_size``."""
    num_kv_heads: int
    """Key/value heads (GQA groups); must divide ``num_heads``. Equal to it for plain MHA."""
    ffn_hidden_size: int
    """Hidden width of the SwiGLU MLP (of each expert, in the MoE family)."""
    vocab_size: int
    """Vocabulary size; the head's output width."""
    seq_len: int
    """Maximum sequence length: rows of the RoPE tables."""
    rope_theta: float = 500000.0
    """RoPE base frequency (500000 in Llama 3, 1e6 in Mixtral, 10000 in Llama 2)."""
    norm_eps: float = 1e-5
    """Epsilon of every RMSNorm."""
    tie_embeddings: bool = False
    """Share the head's weight with ``tok_emb`` (Llama 3 does not, Llama 3.2 1B/3B do)."""
    head_size: int | None = None
    """Width of each attention head; ``None``: ``hidden_size / num_heads`` (Qwen3 sets 128
    where that is 64: q and o then map ``hidden_size`` to and from ``num_heads * head_size``)."""

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                     "vocab_size", "seq_len"):
            check_positive_int(self, name)
        if self.head_size is None:
            check_divides(self, "num_heads", "hidden_size")
        else:
            check_positive_int(self, "head_size")
        check_divides(self, "num_kv_heads", "num_heads")
        if self.head_dim % 2 != 0:
            raise AutoparError(
                f"head_dim = hidden_size / num_heads = {self.head_dim} is odd; RoPE rotates pairs",
                where=f"{type(self).__name__}.num_heads",
                fix="choose num_heads so that hidden_size / num_heads is even",
            )
        check_positive_float(self, "rope_theta")
        check_positive_float(self, "norm_eps")
        check_bool(self, "tie_embeddings")

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def rope_dim(self) -> int:
        """Width of the rotated part of a q/k head: the columns of the RoPE tables (the whole
        head here; DeepSeek's MLA rotates a decoupled part of its own)."""
        return self.head_dim

    def _num_params(self, mlp_params: int) -> int:
        h = self.hidden_size
        attn = 2 * h * self.num_heads * self.head_dim + 2 * h * self.num_kv_heads * self.head_dim
        block = attn + mlp_params + 2 * h
        head = 0 if self.tie_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_layers * block + h + head


@dataclass(frozen=True, kw_only=True)
class LlamaConfig(DecoderConfig):
    """Shape of a Llama-style dense decoder (fields documented on ``DecoderConfig``)."""

    family: ClassVar[str] = "llama"

    def num_params(self) -> int:
        """Exact parameter count of the built model, a tied head counted once."""
        return self._num_params(3 * self.hidden_size * self.ffn_hidden_size)


def rope_tables(
    seq_len: int, head_dim: int, theta: float, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (seq_len, head_dim) in fp32, for the rotate-half RoPE of ``apply_rope``.

    Frequency i of head_dim/2 is ``theta ** (-2 i / head_dim)`` (Su et al., RoFormer, 2021).
    """
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim
    )
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_in_dtype(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The RoPE tables in the dtype of the activations ``x`` they rotate, as transformers'
    rotary embedding hands them: tables kept in fp32 where the parameters are not (DeepSpeed
    casts the parameters only, as FSDP's ``MixedPrecisionPolicy`` does) would promote q and k
    past v. The blocks' callers (``DecoderLM.forward``, ``parts.py``'s ``block_args``) hand
    them so; a trace (``torch.fx`` Proxy) records no cast."""
    if isinstance(x, torch.fx.Proxy) or cos.dtype == x.dtype:
        return cos, sin
    return cos.to(x.dtype), sin.to(x.dtype)


def rotary_qkv(attention: nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(b, heads, s, head_dim) queries, keys and values of ``attention``'s ``q_proj``,
    ``k_proj`` and ``v_proj`` over ``x`` (b, s, h), RoPE on q and k. -1 heads: the same code
    runs on a tensor-parallel shard holding a subset of heads."""
    b, s, _ = x.shape
    d = attention.head_dim
    q = attention.q_proj(x).view(b, s, -1, d).transpose(1, 2)
    k = attention.k_proj(x).view(b, s, -1, d).transpose(1, 2)
    v = attention.v_proj(x).view(b, s, -1, d).transpose(1, 2)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (batch, heads, seq, head_dim) by the (seq, head_dim) tables."""
    return x * cos + rotate_half(x) * sin


class LlamaAttention(nn.Module):
    """Causal grouped-query attention with RoPE on q and k; no biases."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.head_dim = d
        self.gqa = config.num_kv_heads != config.num_heads
        self.q_proj = nn.Linear(h, config.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=False)
        self.context_parallel: nn.Module | None = None
        """Set by ``passes/context_parallel.py`` under cp > 1: attention of this rank's queries
        against the whole sequence's keys and values, in place of causal SDPA."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = rotary_qkv(self, x, cos, sin)
        # enable_gqa broadcasts each kv head over its group of query heads (torch >= 2.5; checked
        # on CPU and meta in tests/unit/models/test_models.py), so k and v are never repeated in memory.
        if self.context_parallel is not None:
            out = self.context_parallel(q, k, v, enable_gqa=self.gqa)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.gqa)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` (Shazeer, "GLU Variants", 2020)."""

    def __init__(self, hidden_size: int, ffn_hidden_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, ffn_hidden_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, ffn_hidden_size, bias=False)
        self.down_proj = nn.Linear(ffn_hidden_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    """Pre-norm block: ``x + attn(attn_norm(x))``, then ``x + mlp(ffn_norm(x))``."""

    def __init__(self, config: DecoderConfig, attn: nn.Module | None = None) -> None:
        """``attn``: another attention taking ``(x, cos, sin)`` (DeepSeek's MLA in its dense
        layers); ``None``: ``LlamaAttention``."""
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = LlamaAttention(config) if attn is None else attn
        self.ffn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.ffn_hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.ffn_norm(x))


class DecoderLM(GPT2Init):
    """Embedding, blocks taking ``(x, cos, sin)``, final RMSNorm and head; Llama and MoE share it.

    Subclasses build ``self.layers`` and name their residual-writing weights for the init
    (``RESIDUAL``, ``layers.GPT2Init``); the RoPE tables are computed.
    """

    config: DecoderConfig

    def __init__(self, config: DecoderConfig, layers: nn.ModuleList) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = layers
        self.norm_f = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        shape = (config.seq_len, config.rope_dim)
        self.register_buffer("rope_cos", torch.empty(shape), persistent=False)
        self.register_buffer("rope_sin", torch.empty(shape), persistent=False)

    def _buffer(self, name: str) -> torch.Tensor:
        if name in ("rope_cos", "rope_sin"):
            c = self.config
            cos, sin = rope_tables(c.seq_len, c.rope_dim, c.rope_theta)
            return cos if name == "rope_cos" else sin
        return super()._buffer(name)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        _, s = tokens.shape
        x = self.tok_emb(tokens)
        # narrow, not [:s]: under torch.fx.symbolic_trace s is a Proxy, which a slice object would
        # hide from the tracer (buffers are not proxied by the default Tracer).
        cos, sin = rope_in_dtype(x, self.rope_cos.narrow(0, 0, s),
                                 self.rope_sin.narrow(0, 0, s))
        for stack in self.stacks():
            for layer in stack:
                x = layer(x, cos, sin)
        logits = self.head(self.norm_f(x))
        if targets is None:
            return logits
        return lm_loss(logits, targets)

    def stacks(self) -> tuple[nn.ModuleList, ...]:
        """The lists of blocks the forward runs, in order: ``self.layers``, the repeated blocks
        the passes cut into stages; a family with blocks of another kind before them (dense
        layers ahead of the MoE ones) names them first."""
        return (self.layers,)


class Llama(DecoderLM):
    """Llama-style dense decoder; ``forward(tokens, targets=None)``: logits, or the mean loss."""

    RESIDUAL = ("attn.o_proj.weight", "mlp.down_proj.weight")

    def __init__(self, config: LlamaConfig) -> None:
        blocks = nn.ModuleList(LlamaBlock(config) for _ in range(config.num_layers))
        super().__init__(config, blocks)

