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
choice, token order within), an assignment's slot is its rank among those of its expert (a
stable sort by expert: ``routing.capacity_slots``), and assignments past slot C - 1 are dropped:
that expert adds nothing for that token (Switch). Each of the E * C slots gathers the row of the
token it holds (a zero row where it holds none; ``routing.dispatch_capacity``), the experts
run as three ``torch.bmm`` over (E, C, h), so each expert matmul costs exactly 2 * E * C * h * f
FLOPs, and outputs are gathered back by slot and summed with the routing weights. Every shape is static given the input's shape; nothing branches
on data.

How it traces: C depends on the input's shape, which ``torch.fx.symbolic_trace`` only knows as a
Proxy. ``expert_capacity`` is registered with ``torch.fx.wrap``, so the trace records it as one
``call_function`` node taking ``x.size(0)`` and the graph recomputes C with plain Python ints
whenever it runs (on meta, CPU or GPU). The cap at T only matters when capacity_factor * top_k > E;
it never drops a token since an expert can take each token at most once.

Dropless (``capacity_factor=None``; Megatron-Core's default, what DeepSeek-V3 and Qwen3-MoE
train with): every assignment is computed. The assignments are sorted by expert (stable: choice-
major order within an expert), each expert runs its SwiGLU on its own rows (``Experts.forward``
with ``counts``: every expert in three grouped GEMMs where ``models/grouped_gemm.py`` finds the
kernel, else one GEMM per expert), and the rows go back to their tokens. The number of rows per expert depends on the data, so the
trace (a ``torch.fx`` Proxy, or fake tensors in the dry run) records the balanced load instead:
the capacity form with ``capacity_factor = 1`` (``C = ceil(top_k * T / E)``), exactly the mean
rows an expert computes -- the cost model scales the busiest rank's share by its imbalance
factor (``costmodel/efficiency.py``).

The load-balancing loss (Switch, Fedus et al. 2021, eq. 4-6; GShard's aux loss): ``E * sum_i
f_i * P_i`` over the tokens of the call, ``f_i`` the fraction of tokens routing to expert ``i``
(over all ``top_k`` choices, before drops: transformers' ``load_balancing_loss_func`` for
Mixtral) and ``P_i`` the mean router probability (softmax over all experts, fp32), times
``router_aux_loss_coef``. It adds to the training loss's gradient without entering the loss
the caller computes from the logits (Megatron-Core's ``MoEAuxLossAutoScaler``): the layer's
output carries it, and its backward adds ``coef * aux_loss_grad_scale`` as the aux loss's
gradient -- the scale being what the caller multiplies the cross-entropy by before backward
(1 for ``loss.backward()`` of one call; ``passes/program.py`` sets 1/micro-batches, and the
fp16 loss scale, through ``set_aux_loss_grad_scale``). So a pipeline stage without the head
trains its routers too, and activation checkpointing recomputes the loss with the layer.

Expert parallelism replaces the local dispatch with ``MoELayer.dispatch`` (a callable
``passes/expert_parallel.py`` sets): the routing, the drop decisions and the aux loss stay
this module's, computed on the rank's own tokens, so the program's math is the one-process
model's on each rank's micro-batch.
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
from autopar.models.expert_layers import CallTokens, ExpertLayer
from autopar.models.grouped_gemm import grouped_mm_runs, padded_groups
from autopar.models.init import Constant, Law, Normal
from autopar.models.layers import (INIT_STD, check_bool, check_positive_float,
                                   check_positive_int)
from autopar.models.llama.model import DecoderConfig, DecoderLM, LlamaAttention
from autopar.models.moe.attention import SinkAttention
from autopar.models.routing import (assignment_counts, capacity_slots, combine_capacity,
                                    combine_dropless, dispatch_capacity, dropless_order,
                                    dropless_rows, expert_capacity, is_symbolic, kept_order,
                                    limit_groups, local_weight, scale_grad)

# leaves for torch.fx in this module's forward too (``autopar.models.routing``)
torch.fx.wrap("expert_capacity")
torch.fx.wrap("dropless_rows")
_local = local_weight


@dataclass(frozen=True, kw_only=True)
class MoEConfig(DecoderConfig):
    """Shape of a Mixtral-style MoE decoder: the Llama fields plus the expert layer."""

    family: ClassVar[str] = "moe"

    num_experts: int
    """Experts per MoE layer (E)."""
    top_k: int
    """Experts each token is routed to; at most ``num_experts``."""
    capacity_factor: float | None = 1.25
    """Slots per expert relative to a perfectly balanced load: C = ceil(cf * top_k * T / E);
    ``None``: dropless (every assignment computed)."""
    router_aux_loss_coef: float = 0.01
    """Weight of the load-balancing loss (Switch Transformer's alpha = 1e-2, Fedus et al.
    2021, section 2.2); 0 turns it off."""
    router_groups: int = 1
    """The experts in this many contiguous groups (DeepSeek-V3's ``n_group``: 8, one per node
    of its 8-node expert parallelism); with ``router_group_topk`` each token routes within
    its best groups (``models.routing.limit_groups``)."""
    router_group_topk: int | None = None
    """Groups a token may route to (DeepSeek-V3's ``topk_group``: 4, "each token is sent to
    at most 4 nodes", arXiv 2412.19437 sec. 2.1.2); ``None``: every group."""
    attention_sinks: bool = False
    """A learned logit per query head in every softmax's denominator (GPT-OSS;
    ``moe/attention.py``)."""
    sliding_window: int | None = None
    """Keys a query sees, itself included, on the sliding layers (``layer_window``); ``None``:
    every layer causal over the whole sequence."""
    sliding_window_pattern: int = 2
    """Layer ``i`` attends to the whole sequence where ``(i + 1) % pattern == 0``, and within
    ``sliding_window`` otherwise: transformers' ``layer_types`` rule (GPT-OSS: 2, the even
    layers sliding, the odd ones full)."""
    attention_bias: bool = False
    """Biases on q, k, v and o (GPT-OSS)."""
    expert_bias: bool = False
    """Biases on the router and on each expert's gate, up and down projections (GPT-OSS)."""
    swiglu_limit: float | None = None
    """GPT-OSS's clamped SwiGLU: ``g * sigmoid(alpha * g) * (u + 1)`` with the gate ``g``
    clamped at ``limit`` from above and the up ``u`` to ``[-limit, limit]`` (transformers'
    ``GptOssExperts._apply_gate``); ``None``: the plain SwiGLU ``silu(g) * u``."""
    swiglu_alpha: float = 1.702
    """The sigmoid's slope of the clamped SwiGLU (GPT-OSS: 1.702); unused without a limit."""

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
        if self.capacity_factor is not None:
            check_positive_float(self, "capacity_factor")
        check_positive_int(self, "router_groups")
        if self.num_experts % self.router_groups:
            raise AutoparError(
                f"router_groups={self.router_groups} does not divide the {self.num_experts} "
                "experts", where=f"{type(self).__name__}.router_groups",
                fix="choose a number of expert groups that divides num_experts")
        keep = self.router_group_topk
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int)
                                 or not 1 <= keep <= self.router_groups
                                 or keep * self.num_experts // self.router_groups < self.top_k):
            raise AutoparError(
                f"router_group_topk={keep!r}: a token keeps 1 to router_groups="
                f"{self.router_groups} groups, whose experts hold its top_k={self.top_k}",
                where=f"{type(self).__name__}.router_group_topk",
                fix="pass None (every group) or a number of groups holding top_k experts")
        coef = self.router_aux_loss_coef
        if isinstance(coef, bool) or not isinstance(coef, (int, float)) or not (
                math.isfinite(coef) and coef >= 0):
            raise AutoparError(f"router_aux_loss_coef must be a finite number >= 0, got {coef!r}",
                               where=f"{type(self).__name__}.router_aux_loss_coef",
                               fix="pass 0 (no load-balancing loss) or e.g. 0.01")
        for name in ("attention_sinks", "attention_bias", "expert_bias"):
            check_bool(self, name)
        if self.sliding_window is not None:
            check_positive_int(self, "sliding_window")
        check_positive_int(self, "sliding_window_pattern")
        if self.swiglu_limit is not None:
            check_positive_float(self, "swiglu_limit")
        check_positive_float(self, "swiglu_alpha")

    @property
    def plain_attention(self) -> bool:
        """Whether every layer's attention is the Llama one (no sinks, window or biases)."""
        return not (self.attention_sinks or self.sliding_window or self.attention_bias)

    def layer_window(self, layer: int) -> int | None:
        """The attention window of layer ``layer``: ``sliding_window`` on the sliding layers,
        ``None`` (the whole causal sequence) on the others (``sliding_window_pattern``)."""
        if self.sliding_window is None or (layer + 1) % self.sliding_window_pattern == 0:
            return None
        return self.sliding_window

    def num_params(self) -> int:
        """Exact parameter count of the built model (all experts, a tied head counted once)."""
        h, f, e = self.hidden_size, self.ffn_hidden_size, self.num_experts
        extra = 0
        if self.attention_bias:
            extra += (self.num_heads + 2 * self.num_kv_heads) * self.head_dim + h
        if self.attention_sinks:
            extra += self.num_heads
        if self.expert_bias:
            extra += e + e * (2 * f + h)
        return self._num_params(3 * e * h * f + h * e) + self.num_layers * extra


class Experts(nn.Module):
    """E SwiGLU experts as stacked weights; maps (E, C, h) to (E, C, h) with batched matmuls.

    With ``bias``, each projection adds its expert's bias (``b_gate``, ``b_up`` (E, f),
    ``b_down`` (E, h)); with ``limit``, the activation is GPT-OSS's clamped SwiGLU
    (``MoEConfig.swiglu_limit``)."""

    WEIGHTS = ("w_gate", "w_up", "w_down")
    BIASES = ("b_gate", "b_up", "b_down")
    ETP_DIMS = {"w_gate": 2, "w_up": 2, "w_down": 1, "b_gate": 1, "b_up": 1, "b_down": None}
    """The dim of each stacked weight expert tensor parallelism splits: the hidden width f
    (gate and up by columns, down by rows); ``b_down`` whole (``ExpertLayer.etp_dims``)."""

    def __init__(self, num_experts: int, hidden_size: int, ffn_hidden_size: int,
                 bias: bool = False, limit: float | None = None, alpha: float = 1.702) -> None:
        super().__init__()
        e, h, f = num_experts, hidden_size, ffn_hidden_size
        self.w_gate = nn.Parameter(torch.empty(e, h, f))
        self.w_up = nn.Parameter(torch.empty(e, h, f))
        self.w_down = nn.Parameter(torch.empty(e, f, h))
        self.bias = bias
        if bias:
            self.b_gate = nn.Parameter(torch.empty(e, f))
            self.b_up = nn.Parameter(torch.empty(e, f))
            self.b_down = nn.Parameter(torch.empty(e, h))
        self.limit = limit
        self.alpha = alpha

    @property
    def names(self) -> tuple[str, ...]:
        """The stacked parameters, first dim the expert (what expert parallelism splits)."""
        return self.WEIGHTS + (self.BIASES if self.bias else ())

    def _act(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if self.limit is None:
            return F.silu(gate) * up
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return gate * torch.sigmoid(self.alpha * gate) * (up + 1)

    def _ffn(self, x: torch.Tensor, params: list[torch.Tensor], mm, bias) -> torch.Tensor:
        """The experts' SwiGLU, ``params`` as ``names``: ``mm(x, w)`` multiplies by a stacked
        weight and ``bias(b)`` lays a stacked bias over the rows, each as the caller's layout
        of the experts' rows needs."""
        w_gate, w_up, w_down, *b = params
        gate, up = mm(x, w_gate), mm(x, w_up)
        if b:
            gate, up = gate + bias(b[0]), up + bias(b[1])
        out = mm(self._act(gate, up), w_down)
        return out + bias(b[2]) if b else out

    def _run(self, x: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        """(E, C, h) through every expert at once, ``params`` as ``names``."""
        w_gate, w_up, w_down, *b = params
        if not b and self.limit is None:  # the plain SwiGLU, in the order the trace records
            return torch.bmm(F.silu(torch.bmm(x, w_gate)) * torch.bmm(x, w_up), w_down)
        return self._ffn(x, params, torch.bmm, lambda t: t.unsqueeze(1))

    def forward(self, x: torch.Tensor, counts: list[int] | None = None,
                grad_scale: float | None = None, out_bias: bool = True) -> torch.Tensor:
        """(E, C, h) to (E, C, h); with ``counts``, expert ``i`` on its ``counts[i]``
        consecutive rows of ``x`` (rows, h) instead (dropless). ``grad_scale`` (expert
        parallelism) runs the local shards of DTensor parameters and scales their gradients
        by it; ``out_bias=False`` adds ``b_down`` as zero with its gradient (an etp rank's
        part of a sum one other rank adds the bias to: ``ExpertLayer.run``). A call through
        ``__call__`` in every case, so FSDP2 gathers the weights first."""
        if counts is None and grad_scale is None:  # the one-process, traced form
            return self._run(x, [getattr(self, n) for n in self.names])
        scale = 1.0 if grad_scale is None else grad_scale
        params = [_local(getattr(self, n), scale) for n in self.names]
        if self.bias and not out_bias:
            params[-1] = params[-1] - params[-1].detach()
        if counts is None:
            return self._run(x, params)
        if grouped_mm_runs(x, *params[:3]):  # every expert in three grouped GEMMs
            rows, offs, where, group = padded_groups(x, counts)
            out = self._ffn(rows, params, lambda a, w: torch._grouped_mm(a, w, offs=offs),
                            lambda t: t[group])
            return out if where is None else out.index_select(0, where)
        outs = [self._ffn(part, params, lambda a, w, i=i: a @ w[i], lambda t, i=i: t[i])
                for i, part in enumerate(torch.split(x, counts))]
        return torch.cat(outs) if outs else x


class Fp32Linear(nn.Linear):
    """A linear layer computed in fp32 whatever its input's and weight's dtype: the router
    (Megatron-LM's ``--moe-router-dtype fp32``, DeepSeek-V3's gating; in bf16 two experts'
    logits a rounding apart would send a token either way). A module of its own, so the
    trace and the plan see the router GEMM under ``router``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), self.weight.float(), bias)


def load_balancing_loss(logits: torch.Tensor, top_experts: torch.Tensor,
                        call: torch.Tensor | None = None) -> torch.Tensor:
    """Switch's aux loss of one call: ``E * sum_i f_i * P_i`` (see the module docstring).
    ``call``: the whole call's top-k experts (T, k) where this rank holds some of its tokens
    (``logits``): the fractions ``f_i`` are the call's, and the probabilities this rank's part
    of the call's mean, so the ranks' losses add up to the call's (and so do their gradients)."""
    every = top_experts if call is None else call
    num_tokens, e = every.size(0), logits.size(-1)
    counts = assignment_counts(every, e)  # (E,) assignments per expert
    probs = torch.softmax(logits.float(), dim=-1).sum(dim=0) / num_tokens  # (E,)
    return e * (counts.to(probs.dtype) / num_tokens * probs).sum()


class _AuxLossGrad(torch.autograd.Function):
    """Identity on the layer's output whose backward adds ``scale`` as the aux loss's gradient
    (Megatron-Core's ``MoEAuxLossAutoScaler``)."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        ctx.save_for_backward(aux)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


def set_aux_loss_grad_scale(module: nn.Module, scale: float) -> None:
    """What the caller multiplies the loss by before backward, for every MoE layer under
    ``module``: the load-balancing loss's gradient is scaled the same."""
    for m in module.modules():
        if hasattr(m, "aux_loss_grad_scale"):
            m.aux_loss_grad_scale = scale


class MoELayer(nn.Module):
    """Top-k routed SwiGLU experts, capacity-based or dropless (see the module docstring)."""

    def __init__(self, config: MoEConfig, ffn_hidden_size: int | None = None) -> None:
        super().__init__()
        self.num_experts = config.num_experts
        self.top_k = config.top_k
        cf = config.capacity_factor
        self.capacity_factor = None if cf is None else float(cf)
        self.aux_loss_coef = float(config.router_aux_loss_coef)
        self.aux_loss_grad_scale = 1.0
        self.dispatch = None
        """Expert parallelism's dispatch (``passes/expert_parallel.py``); ``None``: local."""
        self.router_groups = config.router_groups
        self.router_group_topk = config.router_group_topk
        """Group-limited routing (``models.routing.limit_groups``); read by the tracer."""
        self.call_tokens: CallTokens | None = None
        """The ranks holding the call's tokens with this one (context parallelism, the
        experts' fold over tp); ``None``: the call's tokens are all here."""
        bias = getattr(config, "expert_bias", False)
        self.router = Fp32Linear(config.hidden_size, config.num_experts, bias=bias)
        self.experts = Experts(config.num_experts, config.hidden_size,
                               ffn_hidden_size or config.ffn_hidden_size, bias=bias,
                               limit=getattr(config, "swiglu_limit", None),
                               alpha=getattr(config, "swiglu_alpha", 1.702))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        e, k = self.num_experts, self.top_k
        tokens = x.reshape(-1, h)  # (T, h)
        logits = self.router(tokens)
        routed = logits if self.router_group_topk is None else limit_groups(
            logits, self.router_groups, self.router_group_topk)
        top_logits, top_experts = torch.topk(routed, k, dim=-1)  # (T, k)
        weights = torch.softmax(top_logits, dim=-1).to(x.dtype)  # Mixtral: over the top k
        call = None
        if self.call_tokens is not None and not is_symbolic(tokens):
            # the call's routing over every rank holding its tokens: capacity and the aux loss
            # count the call's assignments (one all-gather of the top-k indices)
            call, mine = self.call_tokens.gather(top_experts.view(b, s, k))
            call = call.reshape(-1, k)
        if call is not None and self.capacity_factor is not None:
            combined = self._kept(tokens, top_experts, weights, call, mine)
        elif self.dispatch is not None:
            combined = self.dispatch(tokens, top_experts, weights)
        elif self.capacity_factor is None and not is_symbolic(tokens):
            order, counts = dropless_order(top_experts, e)
            rows = tokens.repeat(k, 1)[order]
            out = self.experts(rows, counts=counts.tolist())
            combined = combine_dropless(out, order, weights)
        else:
            if self.capacity_factor is None:  # traced: the balanced load (module docstring)
                capacity = dropless_rows(tokens.size(0), e, k)
            else:
                capacity = expert_capacity(tokens.size(0), e, k, self.capacity_factor)
            slot = capacity_slots(top_experts, e, capacity)
            expert_out = self.experts(dispatch_capacity(tokens, slot, e, capacity))
            combined = combine_capacity(expert_out, slot, weights)
        if self.aux_loss_coef and not isinstance(tokens, torch.fx.Proxy):
            aux = load_balancing_loss(logits, top_experts, call)
            share = 1.0 if call is None else self.call_tokens.grad_share
            combined = _AuxLossGrad.apply(combined, aux,
                                          self.aux_loss_coef * self.aux_loss_grad_scale * share)
        return combined.view(b, s, h)

    def _kept(self, tokens: torch.Tensor, top_experts: torch.Tensor, weights: torch.Tensor,
              call: torch.Tensor, mine: torch.Tensor) -> torch.Tensor:
        """The capacity form where other ranks hold some of the call's tokens: the slots are
        the call's (``call``: its (T, k) top-k experts; ``mine``: this rank's tokens in it), and
        this rank's kept assignments run as dropless rows (``kept_order``) -- locally, or
        through the dispatch's exchange -- so no rank computes another's slots."""
        e, k = self.num_experts, self.top_k
        capacity = expert_capacity(call.size(0), e, k, self.capacity_factor)
        slot = capacity_slots(call, e, capacity).view(k, -1)[:, mine].reshape(-1)
        order, counts = kept_order(top_experts, slot, e, capacity)
        kept = int(counts.sum())
        rows = tokens.repeat(k, 1)[order[:kept]]
        if self.dispatch is not None:
            out = self.dispatch.exchange(rows, counts)
        else:
            out = self.experts(rows, counts=counts.tolist())
        out = torch.cat((out, out.new_zeros(order.numel() - kept, out.size(-1))))
        return combine_dropless(out, order, weights)


def moe_layers(module: nn.Module) -> list[MoELayer]:
    """Every MoE layer under ``module`` (of any family built on ``MoELayer``)."""
    return [m for m in module.modules() if isinstance(m, MoELayer)]


def expert_layers(module: nn.Module) -> list[ExpertLayer]:
    """Every ``MoELayer`` under ``module`` as expert parallelism sees it
    (``Family.expert_layers`` of the families built on it)."""
    return [_expert_layer(layer) for layer in moe_layers(module)]


def _expert_layer(layer: MoELayer) -> ExpertLayer:
    def run(x: torch.Tensor, counts: list[int] | None, grad_scale: float,
            out_bias: bool = True) -> torch.Tensor:
        # through Experts.__call__, so FSDP2 gathers the weights first
        return layer.experts(x, counts=counts, grad_scale=grad_scale, out_bias=out_bias)

    def install(dispatch) -> None:
        layer.dispatch = dispatch

    def split_tokens(call: CallTokens | None) -> None:
        layer.call_tokens = call

    return ExpertLayer(experts=layer.experts, weights=layer.experts.names,
                       num_experts=layer.num_experts, top_k=layer.top_k,
                       capacity_factor=layer.capacity_factor, run=run, install=install,
                       module=layer, split_tokens=split_tokens,
                       etp_dims={n: Experts.ETP_DIMS[n] for n in layer.experts.names},
                       ffn_size=layer.experts.w_gate.shape[-1])


class MoEBlock(nn.Module):
    """Pre-norm block: ``x + attn(attn_norm(x))``, then ``x + moe(ffn_norm(x))``."""

    def __init__(self, config: MoEConfig, layer: int = 0) -> None:
        """``layer``: the block's index, which says its attention window (GPT-OSS's layers
        alternate sliding and full: ``MoEConfig.layer_window``)."""
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = (LlamaAttention(config) if config.plain_attention
                     else SinkAttention(config, config.layer_window(layer)))
        self.ffn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.moe = MoELayer(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.moe(self.ffn_norm(x))


class MoETransformer(DecoderLM):
    """Mixtral-style MoE decoder; ``forward(tokens, targets=None)``: logits, or the mean loss."""

    RESIDUAL = ("attn.o_proj.weight", "moe.experts.w_down")

    def __init__(self, config: MoEConfig) -> None:
        blocks = nn.ModuleList(MoEBlock(config, i) for i in range(config.num_layers))
        super().__init__(config, blocks)

    def _other_law(self, name: str) -> Law | None:
        """N(0, 0.02) for the stacked expert gate and up weights (plain parameters) and for
        the attention sinks (transformers' ``GptOssPreTrainedModel._init_weights``); the
        experts' stacked biases zero, as a linear layer's."""
        if name.endswith((".experts.w_gate", ".experts.w_up", ".attn.sinks")):
            return Normal(INIT_STD)
        if name.endswith(tuple(f".experts.{b}" for b in Experts.BIASES)):
            return Constant(0.0)
        return None
