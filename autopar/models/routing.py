"""The routing of a mixture-of-experts layer, whatever family wrote it: capacity and dropless
slots, dispatch and combine, the gradient scale of a replicated expert weight, and the one test
of a router loss that spans every layer.

The zoo's ``MoELayer`` (``models/moe``), a generic decoder's expert list
(``models/generic/experts.py``), transformers' experts (``models/hf_moe``), expert parallelism
(``passes/expert_parallel.py``) and the workload's reading of a traced dropless layer
(``analysis/workload.py``) all use these; none reaches into another family's folder for them.

``expert_capacity`` and ``dropless_rows`` are leaves for torch.fx (``torch.fx.wrap``): traced as
one call taking the (Proxy) token count. ``fx.wrap`` patches the globals of the module that calls
it, so each module calling them in a traced forward wraps them again by name.
"""

from __future__ import annotations

import math
import sys
from types import ModuleType

import torch
import torch.fx


def expert_capacity(num_tokens: int, num_experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert: ``min(T, ceil(capacity_factor * top_k * T / E))``, at least 1."""
    return max(1, min(num_tokens, math.ceil(capacity_factor * top_k * num_tokens / num_experts)))


# A leaf for torch.fx: traced as one call taking the (Proxy) token count, run with real ints.
torch.fx.wrap("expert_capacity")


def dropless_rows(num_tokens: int, num_experts: int, top_k: int) -> int:
    """A dropless expert's mean rows, ``ceil(top_k * T / E)``: the slots the trace records
    for a dropless layer (its node tells the workload the layer is dropless)."""
    return expert_capacity(num_tokens, num_experts, top_k, 1.0)


torch.fx.wrap("dropless_rows")
DROPLESS_MARK = "dropless_rows"
"""The name of the traced call that marks a dropless MoE layer (``autopar.analysis.workload``)."""


def limit_groups(logits: torch.Tensor, groups: int, keep: int) -> torch.Tensor:
    """Group-limited routing (DeepSeek-V2's device-limited and DeepSeek-V3's node-limited
    routing, the ``n_group``/``topk_group`` of their configs; Megatron-Core's
    ``--moe-router-num-groups``/``--moe-router-group-topk``): the E experts in ``groups``
    contiguous groups -- laid out so, under expert parallelism a group is the experts of one
    node or device --, each token keeps the ``keep`` groups holding its highest-scoring
    expert and chooses its top-k among their experts only: (T, E) logits with every other
    group's at ``-inf``. So a token's experts sit on at most ``keep`` groups."""
    t, e = logits.shape
    per = e // groups
    best = logits.view(t, groups, per).amax(dim=-1)  # (T, G)
    chosen = torch.topk(best, keep, dim=-1).indices
    allowed = torch.zeros_like(best, dtype=torch.bool).scatter(1, chosen, True)
    return logits.masked_fill(~allowed.repeat_interleave(per, dim=1), float("-inf"))


def capacity_slots(top_experts: torch.Tensor, num_experts: int, capacity: int) -> torch.Tensor:
    """Each assignment's row in the (E * C + 1, h) dispatch buffer, choice-major (row j * T + t
    is token t's j-th choice); a dropped assignment gets the last row, E * C.

    An assignment's slot is its rank among its expert's assignments in that order: the
    assignments sorted by expert (stable, so the order within an expert is kept), each one's
    place in the sorted list less its expert's first place (``searchsorted``). Every shape is
    static, so it traces and runs on fake tensors. Not the one-hot (kT, E) and its cumsum along
    the kT rows: on CUDA a scan along an outer dimension is one thread per column walking every
    row in turn (ATen's ``tensor_kernel_scan_outer_dim``), E threads for kT = 65536 rows."""
    expert_of = top_experts.t().reshape(-1)  # (k T,)
    order = torch.argsort(expert_of, stable=True)
    by_expert = expert_of[order]
    first = torch.searchsorted(by_expert, torch.arange(num_experts, device=expert_of.device))
    rank = torch.arange(expert_of.numel(), device=expert_of.device) - first[by_expert]
    slot_in_expert = torch.empty_like(rank).scatter_(0, order, rank)  # (k T,)
    kept = slot_in_expert < capacity
    return torch.where(kept, expert_of * capacity + slot_in_expert, num_experts * capacity)


def assignment_counts(top_experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """(E,) int64: the assignments of each expert among ``top_experts`` (any shape). A
    ``scatter_add`` into E counters: a static shape (``bincount``'s depends on the data, which
    fake tensors cannot give) and no (kT, E) one-hot."""
    every = top_experts.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.int64, device=every.device).scatter_add_(
        0, every, torch.ones_like(every))


def dispatch_capacity(tokens: torch.Tensor, slot: torch.Tensor, num_experts: int,
                      capacity: int) -> torch.Tensor:
    """The (E, C, h) buffer of every expert's slots (empty slots zero): each slot gathers the
    row of the token it holds from the tokens and a zero row (``source``: the token of each
    slot, T where the slot is empty; the dropped assignments all land on the extra slot E * C,
    which is not read). A gather's backward needs only its indices; an ``index_add`` of the
    k-fold repeated tokens would keep that (kT, h) source for its backward (torch's formula
    reads the source's shape through it): 448 MiB a layer and micro-batch of DeepSeek-V3's
    4096 tokens, found by the dry run's account."""
    h = tokens.size(-1)
    num_tokens = tokens.size(0)
    rows = num_experts * capacity
    which = torch.arange(slot.size(0), device=slot.device) % num_tokens  # choice-major
    source = slot.new_full((rows + 1,), num_tokens).scatter(0, slot, which)
    padded = torch.cat((tokens, tokens.new_zeros(1, h)))
    return padded[source[:rows]].view(num_experts, capacity, h)


def combine_capacity(expert_out: torch.Tensor, slot: torch.Tensor, weights: torch.Tensor
                     ) -> torch.Tensor:
    """Each token's kept experts' outputs (rows of the (E, C, h) ``expert_out``) summed with
    the routing weights (T, k); a dropped assignment adds nothing."""
    h = expert_out.size(-1)
    num_tokens, k = weights.shape
    gathered = torch.cat((expert_out.reshape(-1, h), expert_out.new_zeros(1, h)))[slot]
    return (gathered.view(k, num_tokens, h) * weights.t().unsqueeze(-1)).sum(dim=0)


def dropless_order(top_experts: torch.Tensor, num_experts: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, counts): the choice-major assignments sorted by expert (stable) and the
    assignments of each expert (E,)."""
    expert_of = top_experts.t().reshape(-1)
    order = torch.argsort(expert_of, stable=True)
    return order, torch.bincount(expert_of, minlength=num_experts)


def combine_dropless(out_sorted: torch.Tensor, order: torch.Tensor, weights: torch.Tensor
                     ) -> torch.Tensor:
    """Rows sorted by expert back to their tokens, summed with the routing weights (T, k)."""
    num_tokens, k = weights.shape
    out = torch.empty_like(out_sorted).index_copy(0, order, out_sorted)
    return (out.view(k, num_tokens, -1) * weights.t().unsqueeze(-1)).sum(dim=0)


def kept_order(top_experts: torch.Tensor, slot: torch.Tensor, num_experts: int, capacity: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """A capacity layer's kept assignments as dropless rows: (order, counts) as
    ``dropless_order`` gives them, the kept assignments (``slot`` below ``E * C``) sorted by
    expert first, the dropped ones after them; ``counts`` (E,) counts the kept ones only. The
    experts' outputs of the kept rows, followed by zeros for the dropped, combine as the
    capacity form's (``combine_dropless``)."""
    expert_of = top_experts.t().reshape(-1)
    marked = torch.where(slot < num_experts * capacity, expert_of, num_experts)
    order = torch.argsort(marked, stable=True)
    return order, torch.bincount(marked, minlength=num_experts + 1)[:num_experts]


class _ScaleGrad(torch.autograd.Function):
    """Identity whose backward multiplies the gradient by ``scale``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.scale, None


def scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` in the forward, its gradient multiplied by ``scale`` in the backward."""
    return x if scale == 1.0 else _ScaleGrad.apply(x, scale)


def dtensor_module(t: object) -> ModuleType | None:
    """``torch.distributed.tensor`` where ``t`` is one of its DTensors, else None. The module
    is looked up, not imported: a process that never imported it holds no DTensor, and the
    planner's command line, which builds models but runs none sharded, spares its import."""
    module = sys.modules.get("torch.distributed.tensor")
    return module if module is not None and isinstance(t, module.DTensor) else None


def local_weight(w: torch.Tensor, grad_scale: float = 1.0) -> torch.Tensor:
    """A parameter's local tensor (expert parallelism makes the stacked weights DTensors),
    its gradient scaled by ``grad_scale``."""
    return scale_grad(w.to_local() if dtensor_module(w) is not None else w, grad_scale)



def is_symbolic(x: torch.Tensor) -> bool:
    """Whether ``x`` has no data to branch on: a ``torch.fx`` Proxy or a fake tensor."""
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, (torch.fx.Proxy, FakeTensor)) or x.is_meta


def router_loss_reason(config: object) -> str | None:
    """Why a model of ``config`` trains on a loss no pipeline stage and no context-parallel
    rank holds alone: with ``output_router_logits`` set (and a coefficient), the counts ``A``
    and rows ``N`` are every layer's over every token of a micro-batch's forward, needed
    before any layer's backward; ``None`` when unset. The one test of that setting, for the
    pp rule (``admissibility``'s ``cross_stage_loss``) and for cp (``router_loss_problem``)."""
    coef = getattr(config, "router_aux_loss_coef", 0.0)
    if getattr(config, "output_router_logits", False) is True and coef:
        return (f"output_router_logits: the load-balancing loss (coefficient {coef:g}) counts "
                "the routing of every layer and every token of a micro-batch's forward before "
                "any layer's backward")
    return None
