"""Activation checkpointing of one block, as the plan says.

* ``full``: the block runs under non-reentrant ``torch.utils.checkpoint``; only its input is
  kept and the whole block is recomputed in the backward pass.
* ``selective``: the same, with a selective-checkpoint policy
  (``create_selective_checkpoint_contexts``) that saves the outputs of the matmuls (``mm``,
  ``addmm``: the linear layers) and of fused attention, and recomputes everything else (norms,
  activations, rotary embedding, the unfused attention core's products, softmax and dropout).
  The expensive work is not redone; what is recomputed is memory-bound.
* ``none``: the block runs as is.

Non-reentrant checkpointing composes with DTensor, FSDP2 and pipelining
(../shared/design/FINDINGS.md); it is applied inside the stage's forward, not by wrapping the
blocks, so parameter names (and checkpoint files) do not change with the policy.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from autopar.core.specs import Checkpoint

aten = torch.ops.aten

SAVED_OPS = frozenset(op for op in (
    aten.mm.default,
    aten.addmm.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None) and
    aten._scaled_dot_product_flash_attention_for_cpu.default,
) if op is not None)
"""Ops whose outputs the selective policy keeps."""


def _save_matmuls(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context() -> tuple:
    return create_selective_checkpoint_contexts(_save_matmuls)


def run_block(call: Callable[[nn.Module, torch.Tensor, tuple], torch.Tensor], block: nn.Module,
              x: torch.Tensor, extra: tuple, policy: Checkpoint) -> torch.Tensor:
    """``call(block, x, extra)`` under ``policy``."""
    if policy is Checkpoint.NONE:
        return call(block, x, extra)
    context = selective_context if policy is Checkpoint.SELECTIVE else None
    kwargs = {"context_fn": context} if context is not None else {}
    return checkpoint(partial(call, block), x, extra, use_reentrant=False, **kwargs)
