"""Context parallelism: the sequence split over the ``cp`` ranks, attention over all of it.

Load balancing (causal attention does more work late in the sequence): the sequence is cut
into ``2 * cp`` equal chunks and cp rank ``i`` holds chunks ``i`` and ``2cp - 1 - i``
(Megatron-LM's and torchtitan's order), so every rank holds as many early as late queries.
``sequence_shard`` is the one place a (batch, seq) tensor becomes a rank's share: the program's
step (``passes/program.py``) cuts the tokens and the targets with it, and nothing else does.

Attention (``apply_context_parallel``): each attention module the model's family names
(``Family.context_attention``) gets a ``GatheredKVAttention`` as its ``context_parallel``
submodule, which its forward calls instead of causal SDPA (a transformers model's, once its
family has set its attention implementation to autopar's: ``Family.use_context_attention``;
a generic model's blocks, through a function mode over their SDPA calls:
``models/generic/context.py``). The rank's queries stay local; its K
and V are all-gathered over the cp group with autograd (``_functional_collectives``'
``all_gather_single``: the backward reduce-scatters -- sums -- dK and dV back to their
owners), put back into sequence order, and each of the rank's two query chunks attends to the
keys up to its own end, causal aligned lower-right (``lower_right_attention``: no mask tensor,
the GPU's fused causal kernel; a sliding window adds the band's mask). That is the variant found
to match one process on CPU (``torch.distributed.tensor.experimental.context_parallel`` does not
run there: ../shared/design/FINDINGS.md); ring attention, which overlaps the exchange with
compute, is not built. The cost model prices this variant (``costmodel/step.py:_cp_comm_s``,
``costmodel/memory.py:gathered_kv_bytes``).

Positions: the stage's blocks are told the global positions of its tokens
(``StageModule.positions``; RoPE tables and GPT's learned positions read them through
``models.parts.token_positions``).

The loss of a rank is the mean over its tokens; every cp rank holds as many, so the mean of the
ranks' means is the sequence's, and the gradients, averaged by FSDP over dp x cp
(``passes/mesh.py:data_parallel_mesh``), are the one-process gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed._functional_collectives import wait_tensor

try:  # torch >= 2.12 names it so; 2.11 (the GPU machines' image) has only the older name
    from torch.distributed._functional_collectives import all_gather_single_autograd
except ImportError:  # pragma: no cover - exercised on torch 2.11 only
    from torch.distributed._functional_collectives import (
        all_gather_tensor_autograd as all_gather_single_autograd)
from torch.nn.attention.bias import causal_lower_right
from torch.utils._python_dispatch import _disable_current_modes

from autopar.core.errors import AutoparError
from autopar.core.plan import Plan
from autopar.models.family import Family


def chunk_positions(seq_len: int, cp: int, rank: int,
                    device: torch.device | str | None = None) -> torch.Tensor:
    """The global positions of cp rank ``rank``'s tokens: chunks ``rank`` and ``2cp-1-rank`` of
    ``2 * cp`` (a 1-D int64 tensor of ``seq_len / cp`` positions)."""
    c = seq_len // (2 * cp)
    first = torch.arange(c, device=device) + rank * c
    return torch.cat((first, first + (2 * cp - 1 - 2 * rank) * c))


def sequence_shard(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """cp rank ``rank``'s share of ``x`` along its sequence dimension ``dim``: chunks ``rank``
    and ``2cp-1-rank`` of ``2 * cp``, in that order; ``x`` itself when ``cp`` is 1."""
    if cp == 1:
        return x
    seq_len = x.shape[dim]
    if seq_len % (2 * cp):
        raise AutoparError(f"a sequence of {seq_len} tokens does not cut into 2*cp = {2 * cp} "
                           "equal chunks", where="the batch's sequence length",
                           fix=f"use a sequence length that is a multiple of {2 * cp}")
    c = seq_len // (2 * cp)
    return torch.cat((x.narrow(dim, rank * c, c), x.narrow(dim, (2 * cp - 1 - rank) * c, c)),
                     dim)


class GatheredKVAttention(nn.Module):
    """Causal attention of this rank's queries against the whole sequence's keys and values,
    all-gathered over the cp group (see the module docstring). No parameters."""

    def __init__(self, group: ProcessGroup, cp: int, rank: int) -> None:
        super().__init__()
        self.group, self.cp, self.rank = group, cp, rank

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                dropout_p: float = 0.0, enable_gqa: bool = False, scale: float | None = None,
                window: int | None = None) -> torch.Tensor:
        """q, k, v: (batch, heads, local seq, head_dim), this rank's chunks; ``scale`` as SDPA's
        (``None``: 1/sqrt(head_dim)); ``window``: a query sees only the ``window`` latest keys,
        itself included (transformers' sliding window), ``None``: every earlier key."""
        seq_len = q.shape[2] * self.cp
        k, v = self._gather(k, v, seq_len)
        c = seq_len // (2 * self.cp)
        outs = []
        for half, chunk in enumerate((self.rank, 2 * self.cp - 1 - self.rank)):
            # the chunk's queries see the keys up to their chunk's end, lower-right causal
            end = (chunk + 1) * c
            start = 0 if window is None else max(0, chunk * c - window + 1)
            outs.append(lower_right_attention(
                q.narrow(2, half * c, c), k.narrow(2, start, end - start),
                v.narrow(2, start, end - start), dropout_p=dropout_p, scale=scale,
                enable_gqa=enable_gqa, window=window))
        return torch.cat(outs, dim=2)

    def _gather(self, k: torch.Tensor, v: torch.Tensor, seq_len: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(b, h, local, d) K and V of every cp rank -> each (b, h, seq_len, d) in sequence
        order: one all-gather of both (the one the cost model prices), its backward one
        reduce-scatter."""
        # sequence first: the gather concatenates the ranks' shares on dim 0; K and V side by
        # side on the last dim, whose head sizes may differ (MLA: 192 and 128)
        both = torch.cat((k, v), dim=-1).permute(2, 0, 1, 3).contiguous()
        gathered = wait_tensor(all_gather_single_autograd(both, 0, self.group))
        held = torch.cat([chunk_positions(seq_len, self.cp, r, k.device)
                          for r in range(self.cp)])
        ordered = gathered.index_select(0, held.argsort()).permute(1, 2, 0, 3)
        return ordered.split((k.size(-1), v.size(-1)), dim=-1)


def lower_right_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                          dropout_p: float = 0.0, scale: float | None = None,
                          enable_gqa: bool = False, window: int | None = None) -> torch.Tensor:
    """Causal SDPA of queries that are the last ``q.size(2)`` positions of the keys' span: query
    ``i`` sees keys up to ``k.size(2) - q.size(2) + i`` (the causal mask aligned lower-right),
    and with ``window`` only its ``window`` latest keys.

    Without a window no mask tensor is made: ``torch.nn.attention.bias.causal_lower_right`` is
    dispatched by SDPA to the fused causal kernel on the GPU (FlashAttention's bottom-right
    alignment) and materialised only on the CPU's math path. A window needs the explicit band
    of (queries x keys). The dry run swaps this function for what the GPU's fused kernel keeps
    (``autopar/dryrun/gpu_kernels.py``)."""
    lq, lk = q.size(2), k.size(2)
    if window is None:
        if lq == lk:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True,
                                                  scale=scale, enable_gqa=enable_gqa)
        # the bias is a tensor subclass holding only the two lengths; a dispatch mode active
        # while it is made (the fake tensor mode, CommDebugMode) would take its empty storage
        # for its own and refuse the subclass, so it is made outside them
        with _disable_current_modes():
            bias = causal_lower_right(lq, lk)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p,
                                              scale=scale, enable_gqa=enable_gqa)
    behind = (torch.arange(lq, device=q.device)[:, None] + (lk - lq)
              - torch.arange(lk, device=q.device)[None, :])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=(behind >= 0) & (behind < window),
                                          dropout_p=dropout_p, scale=scale,
                                          enable_gqa=enable_gqa)


def context_attention(model: nn.Module, family: Family) -> list[nn.Module]:
    """The attention modules of ``model`` that take a context-parallel hook (``family``'s
    ``context_attention``); ``AutoparError`` where there are none (the admissibility check,
    ``ModelFacts.context_attention``, refuses such a plan before any process starts)."""
    attention = [m for m in model.modules() if family.context_attention(m)]
    if not attention:
        raise AutoparError(
            f"context parallelism needs attention modules that take a context-parallel "
            f"attention; the {family.name} family names none", where="plan.config.cp",
            fix="re-plan with cp=1 (autopar plan --cp 1), or give the family's attention a "
                "`context_parallel` hook and name it in its Family.context_attention")
    return attention


def apply_context_parallel(model: nn.Module, family: Family, plan: Plan,
                           group: ProcessGroup, rank: int) -> int:
    """Give every attention module of ``model`` that ``family`` names its
    ``GatheredKVAttention`` over ``group`` (this rank is cp rank ``rank``); returns how many.
    Runs before the fusions, whose graphs then keep the call (a submodule is a leaf to them)."""
    cp = plan.config.cp
    attention = context_attention(model, family)
    for module in attention:
        module.context_parallel = GatheredKVAttention(group, cp, rank)
    if family.use_context_attention is not None:
        family.use_context_attention(model)
    return len(attention)
