"""Mixtral-style mixture-of-experts decoder with static-shape, capacity-based dispatch.

The block is the Llama block (``llama/model.py``) with the MLP replaced by ``moe``: a bias-free
``router`` (h -> E) computed in fp32 whatever the model's precision (Megatron-LM's
``--moe-router-dtype fp32``, DeepSeek-V3's gating: in bf16, two experts' logits within a rounding
of each other would send a token either way), top-k routing with a softmax over the k chosen
logits (Jiang et al., "Mixtral of Experts", 2024, eq. 1-2), and ``experts`` holding stacked SwiGLU weights
``w_gate`` (E, h, f), ``w_up`` (E, h, f), ``w_down`` (E, f, h).

Dispatch (GShard, Lepikhin et al. 2020, section 2.2; Switch, Fedus et al. 2021, section 2.2):
every expert gets ``C = min(T, ceil(capacity_factor * top_k * T / E))`` slots for the T = batch *
seq tokens of the call. Assignments are ranked choice-major (all first choices before any second
choice, token order within), an assignment's slot is its rank among those of its expert (one-hot
+ cumsum), and assignments past slot C - 1 are dropped: that expert adds nothing for that token
(Switch). The kept tokens are scattered with ``index_add`` into an (E * C + 1, h) buffer whose last
row collects the dropped ones, the experts run as three ``torch.bmm`` over (E, C, h), so each
expert matmul costs exactly 2 * E * C * h * f FLOPs, and outputs are gathered back by slot and
summed with the routing weights. Every shape is static given the input's shape; nothing branches
on data.

How it traces: C depends on the input's shape, which ``torch.fx.symbolic_trace`` only knows as a
Proxy. ``expert_capacity`` is registered with ``torch.fx.wrap``, so the trace records it as one
``call_function`` node taking ``x.size(0)`` and the graph recomputes C with plain Python ints
whenever it runs (on meta, CPU or GPU). The cap at T only matters when capacity_factor * top_k > E;
it never drops a token since an expert can take each token at most once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from autopar.core.errors import AutoparError
from autopar.models.init import Law, Normal
from autopar.models.layers import INIT_STD, check_positive_float, check_positive_int
from autopar.models.llama.model import DecoderConfig, DecoderLM, LlamaAttention


@dataclass(frozen=True, kw_only=True)
class MoEConfig(DecoderConfig):
    """Shape of a Mixtral-style MoE decoder: the Llama fields plus the expert layer."""

    family: ClassVar[str] = "moe"

    num_experts: int
    """Experts per MoE layer (E)."""
    top_k: int
    """Experts each token is routed to; at most ``num_experts``."""
    capacity_factor: float = 1.25
    """Slots per expert relative to a perfectly balanced load: C = ceil(cf * top_k * T / E)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(self, "num_experts")
        check_positive_int(self, "top_k")
        if self.top_k > self.num_experts:
            raise AutoparError(
                f"top_k={self.top_k} is larger than num_experts={self.num_experts}",
                where="MoEConfig.top_k",
                fix="route each token to at most num_experts experts",
            )
        check_positive_float(self, "capacity_factor")

    def num_params(self) -> int:
        """Exact parameter count of the built model (all experts, a tied head counted once)."""
        h, f, e = self.hidden_size, self.ffn_hidden_size, self.num_experts
        return self._num_params(3 * e * h * f + h * e)


def expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ``min(T, ceil(capacity_factor * top_k * T / E))``, at least 1."""
    return max(1, min(num_tokens, math.ceil(capacity_factor * top_k * num_tokens / num_experts)))


# A leaf for torch.fx: traced as one call taking the (Proxy) token count, run with real ints.
torch.fx.wrap("expert_capacity")


class Experts(nn.Module):
    """E SwiGLU experts as stacked weights; maps (E, C, h) to (E, C, h) with batched matmuls."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int) -> None:
        super().__init__()
        e, h, f = num_experts, hidden_size, ffn_hidden_size
        self.w_gate = nn.Parameter(torch.empty(e, h, f))
        self.w_up = nn.Parameter(torch.empty(e, h, f))
        self.w_down = nn.Parameter(torch.empty(e, f, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = F.silu(torch.bmm(x, self.w_gate)) * torch.bmm(x, self.w_up)
        return torch.bmm(hidden, self.w_down)


class Fp32Linear(nn.Linear):
    """A linear layer computed in fp32 whatever its input's and weight's dtype: the router
    (Megatron-LM's ``--moe-router-dtype fp32``, DeepSeek-V3's gating; in bf16 two experts'
    logits a rounding apart would send a token either way). A module of its own, so the
    trace and the plan see the router GEMM under ``router``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias)


class MoELayer(nn.Module):
    """Top-k routed SwiGLU experts with capacity-based dispatch (see the module docstring)."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.top_k = config.top_k
        self.capacity_factor = float(config.capacity_factor)
        self.router = Fp32Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, config.hidden_size, config.ffn_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        e, k = self.num_experts, self.top_k
        tokens = x.reshape(-1, h)  # (T, h)
        num_tokens = tokens.size(0)
        logits = self.router(tokens)
        top_logits, top_experts = torch.topk(logits, k, dim=-1)  # (T, k)
        weights = torch.softmax(top_logits, dim=-1).to(x.dtype)  # Mixtral: over the top k
        capacity = expert_capacity(num_tokens, e, k, self.capacity_factor)

        # Choice-major order: row j * T + t is token t's j-th choice.
        expert_of = top_experts.t().reshape(-1)  # (k T,)
        onehot = F.one_hot(expert_of, e)  # (k T, E) int64
        slot_in_expert = (torch.cumsum(onehot, dim=0) * onehot).sum(dim=-1) - 1  # (k T,)
        kept = slot_in_expert < capacity
        dropped_row = e * capacity  # the extra last row of the dispatch buffer
        slot = torch.where(kept, expert_of * capacity + slot_in_expert, dropped_row)

        dispatched = tokens.new_zeros(dropped_row + 1, h).index_add(0, slot, tokens.repeat(k, 1))
        expert_out = self.experts(dispatched[:dropped_row].view(e, capacity, h))  # (E, C, h)
        gathered = torch.cat((expert_out.reshape(-1, h), expert_out.new_zeros(1, h)))[slot]
        combined = (gathered.view(k, num_tokens, h) * weights.t().unsqueeze(-1)).sum(dim=0)
        return combined.view(b, s, h)


class MoEBlock(nn.Module):
    """Pre-norm block: ``x + attn(attn_norm(x))``, then ``x + moe(ffn_norm(x))``."""

    def __init__(self, config: MoEConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = LlamaAttention(config)
        self.ffn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.moe = MoELayer(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.moe(self.ffn_norm(x))


class MoETransformer(DecoderLM):
    """Mixtral-style MoE decoder; ``forward(tokens, targets=None)``: logits, or the mean loss."""

    RESIDUAL = ("attn.o_proj.weight", "moe.experts.w_down")

    def __init__(self, config: MoEConfig) -> None:
        blocks = nn.ModuleList(MoEBlock(config) for _ in range(config.num_layers))
        super().__init__(config, blocks)

    def _other_law(self, name: str) -> Law | None:
        """N(0, 0.02) for the stacked expert gate and up weights (plain parameters)."""
        if name.endswith((".experts.w_gate", ".experts.w_up")):
            return Normal(INIT_STD)
        return None
