"""DeepSeek-V3-style mixture-of-experts decoder: multi-head latent attention, fine-grained
routed experts, shared experts, the first k layers dense (DeepSeek-AI, "DeepSeek-V3 Technical
Report", arXiv 2412.19437, sections 2.1.1-2.1.2 and section 4.2's hyper-parameters;
DeepSeekMoE, Dai et al. 2024; MLA: "DeepSeek-V2", arXiv 2405.04434, section 2.1).

Layout: ``tok_emb``; ``dense_layers[0..k)`` -- Llama blocks (with this family's attention) and
the dense SwiGLU of ``ffn_hidden_size``; ``layers[0..L-k)`` -- blocks whose MLP is ``moe``
(``MoELayer``: the ``num_experts`` routed experts of hidden ``moe_ffn_hidden_size``,
top-``top_k``) plus ``shared_experts`` (one SwiGLU of hidden ``num_shared_experts *
moe_ffn_hidden_size``, every token: DeepSeekMoE's shared experts fused, as DeepSeek-V3's
reference code does); ``norm_f``; ``head``. Every block's ``attn`` is ``attention.MLAttention``
(``attention="mla"``, the default) or the Llama family's grouped-query attention
(``attention="gqa"``, kept for the plans and specs made before MLA). The dense layers are a
list of their own so ``layers`` stays the list of identical blocks that the tracer, the cost
model and the pipeline split count (``tracing_blocks.py``): the passes run the dense layers on
the first pipeline stage with the embedding (``parts.py``), and the cost model prices them
there (the workload's ``pre`` layer).

What differs from DeepSeek-V3, stated:

* **gating**: a softmax over the top-k logits (Mixtral's; ``models/moe``), where DeepSeek-V3
  uses sigmoid affinities normalised over the top k, with the auxiliary-loss-free bias
  balancing; the load-balancing loss here is Switch's over the tokens of a call, DeepSeek-V3's
  a sequence-wise one (both weighted by ``router_aux_loss_coef``).
* no multi-token prediction module. Node-limited routing is the routing's group limit
  (``router_groups``/``router_group_topk``, ``models.routing.limit_groups``: the preset's 8
  groups, 4 kept, as DeepSeek-V3's ``n_group``/``topk_group``), the groups chosen by their
  best expert's logit, where DeepSeek-V3 sums each group's two best sigmoid affinities.
* RoPE rotate-half on MLA's decoupled part, plain (no YaRN): ``attention.py``.
* dispatch: dropless (``capacity_factor=None``, DeepSeek-V3 drops no token, section 2.1.2)
  or with a capacity factor, as ``models/moe``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

import torch
from torch import nn

from autopar.core.errors import AutoparError
from autopar.models.deepseek.attention import MLAttention
from autopar.models.init import Law, Normal
from autopar.models.layers import INIT_STD, check_positive_int, coerce_choice
from autopar.models.llama.model import DecoderLM, LlamaAttention, LlamaBlock, SwiGLU
from autopar.models.moe.model import MoEConfig, MoELayer


class Attention(StrEnum):
    """The attention of every block."""

    MLA = "mla"
    """Multi-head latent attention (``attention.py``), DeepSeek-V2/V3's."""
    GQA = "gqa"
    """The Llama family's grouped-query attention of ``num_kv_heads`` heads of ``head_dim``
    (what this family ran before MLA; plans and specs made then name it)."""


@dataclass(frozen=True, kw_only=True)
class DeepSeekConfig(MoEConfig):
    """The MoE fields plus DeepSeekMoE's: ``ffn_hidden_size`` is the dense layers' MLP width,
    ``moe_ffn_hidden_size`` each routed and shared expert's."""

    family: ClassVar[str] = "deepseek"

    moe_ffn_hidden_size: int
    """Hidden width of one routed (and one shared) expert."""
    num_shared_experts: int = 1
    """Experts every token goes through, besides its routed ones; 0 for none."""
    first_k_dense: int = 1
    """The first layers with a dense MLP instead of experts; fewer than ``num_layers``."""
    attention: Attention = Attention.MLA
    """``"mla"`` (multi-head latent attention, the fields below) or ``"gqa"``."""
    q_lora_rank: int | None = 1536
    """MLA: rank of the query compression (``q_a_proj``, DeepSeek-V2/V3: 1536); ``None``: one
    ``q_proj`` (DeepSeek-V2-Lite)."""
    kv_lora_rank: int = 512
    """MLA: rank of the joint key/value latent (``kv_a_proj_with_mqa``; 512)."""
    qk_nope_head_dim: int = 128
    """MLA: per-head query/key features without RoPE (128)."""
    qk_rope_head_dim: int = 64
    """MLA: per-head query features with RoPE, and the one rotated key part every head shares
    (64)."""
    v_head_dim: int = 128
    """MLA: per-head value features (128)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(self, "moe_ffn_hidden_size")
        coerce_choice(self, "attention", Attention)
        if self.attention is Attention.MLA:
            self._check_mla()
        for name in ("num_shared_experts", "first_k_dense"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise AutoparError(f"{name} must be an integer >= 0, got {value!r}",
                                   where=f"DeepSeekConfig.{name}", fix=f"pass {name} >= 0")
        if self.first_k_dense >= self.num_layers:
            raise AutoparError(
                f"first_k_dense={self.first_k_dense} leaves no MoE layer of {self.num_layers}",
                where="DeepSeekConfig.first_k_dense", fix="keep first_k_dense < num_layers")

    def _check_mla(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            check_positive_int(self, name)
        if self.q_lora_rank is not None:
            check_positive_int(self, "q_lora_rank")
        if self.qk_rope_head_dim % 2:
            raise AutoparError(f"qk_rope_head_dim={self.qk_rope_head_dim} is odd; RoPE rotates "
                               "pairs", where="DeepSeekConfig.qk_rope_head_dim",
                               fix="pass an even qk_rope_head_dim (DeepSeek-V3: 64)")
        if self.num_kv_heads != self.num_heads:
            raise AutoparError(
                f"num_kv_heads={self.num_kv_heads} differs from num_heads={self.num_heads}; "
                "MLA decompresses one key and value per query head",
                where="DeepSeekConfig.num_kv_heads",
                fix=f"pass num_kv_heads={self.num_heads}, or attention='gqa'")

    @property
    def rope_dim(self) -> int:
        """MLA rotates ``qk_rope_head_dim`` features of each q/k head; GQA the whole head."""
        return self.qk_rope_head_dim if self.attention is Attention.MLA else self.head_dim

    def attention_params(self) -> int:
        """Parameters of one block's attention."""
        h, heads = self.hidden_size, self.num_heads
        if self.attention is Attention.GQA:
            return 2 * h * heads * self.head_dim + 2 * h * self.num_kv_heads * self.head_dim
        qk = heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        lq = self.q_lora_rank
        q = h * qk if lq is None else h * lq + lq + lq * qk
        kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
              + self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim))
        return q + kv + heads * self.v_head_dim * h

    def num_params(self) -> int:
        """Exact parameter count of the built model."""
        h, e, f = self.hidden_size, self.num_experts, self.moe_ffn_hidden_size
        attn = self.attention_params()
        dense = attn + 3 * h * self.ffn_hidden_size + 2 * h
        moe = attn + 3 * e * h * f + h * e + 3 * h * f * self.num_shared_experts + 2 * h
        head = 0 if self.tie_embeddings else self.vocab_size * h
        k = self.first_k_dense
        return self.vocab_size * h + k * dense + (self.num_layers - k) * moe + h + head


def attention(config: DeepSeekConfig) -> nn.Module:
    """The attention module ``config.attention`` names."""
    return MLAttention(config) if config.attention is Attention.MLA else LlamaAttention(config)


class DeepSeekMoEBlock(nn.Module):
    """Pre-norm block: ``x + attn(attn_norm(x))``, then ``x + moe(h) + shared_experts(h)`` with
    ``h = ffn_norm(x)``."""

    def __init__(self, config: DeepSeekConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = attention(config)
        self.ffn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.moe = MoELayer(config, config.moe_ffn_hidden_size)
        shared = config.num_shared_experts * config.moe_ffn_hidden_size
        self.shared_experts = SwiGLU(config.hidden_size, shared) if shared else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        h = self.ffn_norm(x)
        out = self.moe(h)
        if self.shared_experts is not None:
            out = out + self.shared_experts(h)
        return x + out


class DeepSeekV3(DecoderLM):
    """DeepSeek-V3-style decoder (module docstring); ``forward(tokens, targets=None)``."""

    RESIDUAL = ("attn.o_proj.weight", "moe.experts.w_down", "shared_experts.down_proj.weight")
    DENSE_RESIDUAL = ("attn.o_proj.weight", "mlp.down_proj.weight")

    def __init__(self, config: DeepSeekConfig) -> None:
        k = config.first_k_dense
        blocks = nn.ModuleList(DeepSeekMoEBlock(config) for _ in range(config.num_layers - k))
        super().__init__(config, blocks)
        self.dense_layers = nn.ModuleList(LlamaBlock(config, attention(config)) for _ in range(k))

    def stacks(self) -> tuple[nn.ModuleList, ...]:
        """The first k dense layers, then the MoE blocks."""
        return (self.dense_layers, self.layers)

    def _residual_names(self) -> set[str]:
        dense = {f"dense_layers.{i}.{w}" for i in range(len(self.dense_layers))
                 for w in self.DENSE_RESIDUAL}
        return super()._residual_names() | dense

    def _other_law(self, name: str) -> Law | None:
        """N(0, 0.02) for the stacked routed-expert gate and up weights."""
        if name.endswith((".experts.w_gate", ".experts.w_up")):
            return Normal(INIT_STD)
        return None
