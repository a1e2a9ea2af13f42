"""``ExpertLayer``: one mixture-of-experts layer as expert parallelism sees it, whatever the
family that wrote it.

Expert parallelism (``passes/expert_parallel.py``) needs the same few things of every MoE layer:
the module holding the experts' stacked weights (``Shard(0)`` over the ep ranks, and FSDP2's
unit over the expert data-parallel ranks), their names, the number of experts, the top-k, the
capacity (``None``: dropless), how to run the local experts on rows grouped by expert, and how
to make the layer route through the all-to-all dispatch. A family says where its MoE layers are
with ``Family.expert_layers`` (module -> ``ExpertLayer`` list): the zoo's ``MoELayer``
(``models/moe``, ``models/deepseek``), transformers' stacked-weights experts (``models/hf_moe``)
and a generic decoder's list of expert modules (``models/generic/experts.py``) go through the
one dispatch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

Dispatch = Callable[["torch.Tensor", "torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""(tokens (T, h), top-k expert indices (T, k), top-k weights (T, k)) -> the layer's combined
expert output (T, h): what a layer calls in place of its local experts."""


class CallTokens(Protocol):
    """The tokens of one call of a MoE layer when several ranks hold them (context parallelism,
    and tp under the experts' fold): what a layer that decides over the whole call -- its
    capacity slots, its load-balancing loss -- needs of the others (``passes/expert_parallel.py``
    makes it)."""

    grad_share: float
    """What this rank's gradients are scaled by against its share of the one-process
    micro-batch's (cp: each cp rank's loss is the mean over its own chunks, and the data-parallel
    reduction averages over the cp ranks): a loss the layer adds computes its share times this."""

    def gather(self, local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (b, s_local, ...) per-token values -> the call's (b, s, ...) in the
        one-process token order, and the (b * s_local,) flat indices of this rank's tokens in
        its (b * s) tokens."""
        ...


@dataclass(frozen=True)
class ExpertLayer:
    """One MoE layer of a model, for expert parallelism."""

    experts: nn.Module
    """The module whose ``weights`` are the experts' stacked parameters (first dim: expert)."""
    weights: tuple[str, ...]
    """Its stacked parameters' names, each (E, ...): split ``Shard(0)`` over the ep ranks."""
    num_experts: int
    top_k: int
    capacity_factor: float | None
    """Slots per expert as a factor of the mean load; ``None``: dropless (every assignment)."""
    run: Callable[..., torch.Tensor]
    """(x, counts, grad_scale[, out_bias]) -> the local experts' outputs: ``x`` (E_local, C, h)
    with ``counts`` ``None``, else rows grouped by expert, ``counts[i]`` rows for local expert
    i; the weights' local shards are used and their gradients scaled by ``grad_scale``. Under
    expert tensor parallelism (``etp_dims``) the output is this rank's part of a sum over the
    etp ranks, and ``out_bias=False`` (every etp rank but the first) adds the output's bias as
    zero with its gradient (each etp rank computes the same rows, so each gets the whole
    bias gradient)."""
    install: Callable[[Dispatch | None], None]
    """Make the layer call the dispatch in place of its local experts (``None``: local again);
    the dispatch is ``passes/expert_parallel.ExpertDispatch``, whose ``exchange`` a layer that
    routes by its own code calls with its rows grouped by expert."""
    shard: Callable[[DeviceMesh], list[nn.Module]] | None = None
    """(the ep mesh) -> split the experts over it, returning the modules FSDP2 wraps over the
    expert data-parallel ranks (a list of expert modules: each rank keeps its own);
    ``None``: the stacked ``weights`` become DTensors ``Shard(0)`` and ``experts`` is the unit."""
    module: nn.Module | None = None
    """The MoE layer the block calls on its (b, s, h) hidden states -- router, experts and any
    gate or shared expert inside it, which it calls on (b * s, h) tokens -- so that under the
    experts' fold it runs on the rank's own sequence shard (``passes/expert_parallel.py``:
    ``apply_token_shards``); ``None``: the family cannot run it so (the fold is refused)."""
    etp_dims: Mapping[str, int | None] | None = None
    """Expert tensor parallelism (``ParallelConfig.etp``): for each of ``weights``, the dim the
    etp ranks split -- the hidden (ffn) width: a column-split projection's output, a row-split
    one's input, their biases' -- or ``None`` for a weight each etp rank holds whole (the
    output projection's bias); ``None``: the layer cannot split its experts (etp > 1 refused,
    ``ModelFacts.etp_refused``)."""
    ffn_size: int | None = None
    """The experts' hidden width, which etp divides (with ``etp_dims``)."""
    split_tokens: Callable[[CallTokens | None], None] | None = None
    """Hand the layer the ranks holding one call's tokens (``None``: all here), for a layer
    whose routing or loss spans the call's tokens (capacity slots, the load-balancing loss);
    ``None``: the layer routes every token on its own and needs none (``Family.token_routing``)."""


def no_expert_layers(module: nn.Module) -> list[ExpertLayer]:
    """A family without mixture-of-experts layers."""
    return []
