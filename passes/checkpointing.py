"""Activation checkpointing of one block, as the plan says.

* ``full``: the block runs under non-reentrant ``torch.utils.checkpoint``; only its input is
  kept and the whole block is recomputed in the backward pass.
* ``selective`` (Korthikanti et al. 2022; Megatron-LM's ``--recompute-modules core_attn``):
  the block runs as is, but each unfused attention core in it -- the attention modules with an
  ``attention_core_runner`` hook (``CORE_HOOK``; the GPT family's eager attention) -- runs
  under non-reentrant ``torch.utils.checkpoint``: q.k^T, scale, mask, softmax, dropout and
  .v are recomputed in the backward from q, k and v (which the QKV projection's output holds
  anyway), and every other tensor is kept as autograd saves it. Under tensor + sequence
  parallelism what autograd keeps is what DTensor's redistributions produce (the
  reduce-scatter's sequence-split output, not the row-parallel linear's partial sums), and
  the column-parallel linears' all-gathered inputs are kept as this rank's shard and
  gathered again in the backward (``passes/regather.py``, as Megatron does), so every kept
  tensor is 1/t. An SAC policy over the whole block
  cannot do this: it keeps the outputs of every op it saves, and the partial sums before a
  reduce-scatter are one (the row-parallel GEMM's); recomputing that GEMM instead would rerun
  the linear. Fused attention keeps no internals: there ``selective`` runs the block as is.
* ``matmuls``: the block runs under non-reentrant checkpoint with a selective-checkpoint policy
  (``create_selective_checkpoint_contexts``) that saves the outputs of the matmuls (``mm``,
  ``addmm``: the linear layers) and of fused attention, and recomputes everything else (norms,
  activations, rotary embedding, the unfused attention core's products, softmax and dropout).
  The expensive work is not redone; what is recomputed is memory-bound.
* ``moe`` (Megatron-Core's ``--recompute-granularity selective --recompute-modules moe``):
  the block runs as is, but each mixture-of-experts layer in it -- the module its family gives
  (``ExpertLayer.module``; ``mark_moe_layers`` marks them when the program is built) -- runs
  under non-reentrant ``torch.utils.checkpoint``: its input is kept, and the router, the
  dispatch, the experts and the combine are recomputed in the backward, the dispatch and
  combine all-to-alls under expert parallelism and the gather of a split call's routing
  (``SplitCall``) included. The layer's forward is swapped for a checkpointed one (an instance
  ``forward``) only while the block runs, and put back as it was after (a class's forward, or
  an instance one a family set), so the module's hooks -- the fold's ``TokenShards`` slice and
  gather -- run outside the checkpoint as before, and no name changes. Under sequence
  parallelism the column-parallel linears' gathered inputs are kept as shards and gathered
  again in the backward, as under ``selective`` (``Checkpoint.regathers``).
* ``none``: the block runs as is.

Under FSDP2's mixed precision a block's floating inputs (the rotary tables, a mask) are cast to
the parameters' dtype by FSDP's pre-forward hook; torch 2.11's FSDP2 skips that cast when the
backward recomputes the block, so the recomputation would run on fp32 tables (q and k in fp32,
v in bf16: SDPA refuses them, and the saved tensors' metadata no longer match). ``run_block``
therefore casts them itself, inside the checkpointed function, to the dtype of ``x`` (what FSDP
casts them to: ``x`` arrives in it), so the forward and its recomputation see the same inputs on
every torch version (``_as_inputs_of``).

Non-reentrant checkpointing composes with DTensor, FSDP2 and pipelining
(../shared/design/FINDINGS.md); it is applied inside the stage's forward, not by wrapping the
blocks, so parameter names (and checkpoint files) do not change with the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from functools import partial

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from autopar.analysis.ops.registry import matmuls_aten_ops
from autopar.core.specs import Checkpoint
from autopar.models.expert_layers import ExpertLayer
from autopar.models.family import ATTENTION_CORE_HOOK
from autopar.passes.regather import regathered_saves

aten = torch.ops.aten

CORE_HOOK = ATTENTION_CORE_HOOK


def _recompute(core: Callable[..., torch.Tensor], *args: object, **kwargs: object
               ) -> torch.Tensor:
    return checkpoint(core, *args, use_reentrant=False, **kwargs)


def set_core_runners(block: nn.Module, policy: Checkpoint) -> None:
    """Point the block's attention-core hooks at the checkpointed runner under ``selective``,
    and clear them under any other policy (``full`` recomputes the whole block anyway)."""
    runner = _recompute if policy is Checkpoint.SELECTIVE else None
    for module in block.modules():
        if hasattr(module, CORE_HOOK):
            setattr(module, CORE_HOOK, runner)


SAVED_OPS = frozenset(getattr(aten, name).default for name in matmuls_aten_ops()
                      if hasattr(aten, name))
"""Ops whose outputs the ``matmuls`` policy keeps: the op registry's list
(``OpFamily.kept_by_matmuls_aten``), whose ``kept_by_matmuls`` prices the same."""


def _save_matmuls(ctx: object, op: object, *args: object, **kwargs: object) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def matmuls_context() -> tuple:
    return create_selective_checkpoint_contexts(_save_matmuls)


MOE_MARK = "_autopar_moe_layer"
"""The attribute ``mark_moe_layers`` sets on a MoE layer's module: ``moe`` checkpoints it."""


def mark_moe_layers(layers: Sequence[ExpertLayer]) -> None:
    """Mark the modules of ``layers`` (a stage's ``Family.expert_layers``) as the ones the
    ``moe`` policy checkpoints; a layer without a module is refused that policy by the
    admissibility check (``moe_problem``)."""
    for layer in layers:
        if layer.module is not None:
            layer.module.__dict__[MOE_MARK] = True


@contextmanager
def moe_layers_checkpointed(block: nn.Module) -> Iterator[None]:
    """While the block runs, each marked MoE layer in it runs its forward under non-reentrant
    checkpoint; after it, the forward is what it was (the checkpoint's recomputation calls
    the forward it was given)."""
    swapped = []
    for module in block.modules():
        if module.__dict__.get(MOE_MARK):
            own = module.__dict__.get("forward")  # an instance forward a family set, or none
            module.__dict__["forward"] = partial(_recompute, module.forward)
            swapped.append((module, own))
    try:
        yield
    finally:
        for module, own in swapped:
            if own is None:
                del module.__dict__["forward"]
            else:
                module.__dict__["forward"] = own


def _cast(t: object, *, dtype: torch.dtype) -> object:
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype:
        return t.to(dtype)
    return t


def _as_inputs_of(call: Callable[[nn.Module, torch.Tensor, tuple], torch.Tensor],
                  block: nn.Module, x: torch.Tensor, extra: tuple) -> torch.Tensor:
    """``call(block, x, extra)`` with the floating tensors of ``extra`` in ``x``'s dtype when
    ``block`` is an FSDP2 module: the cast its mixed-precision hook makes in the forward, made
    here too so that a recomputation sees it (see the module docstring)."""
    if isinstance(block, FSDPModule) and isinstance(x, torch.Tensor) and x.is_floating_point():
        # any structure a family passes (a tuple, a generic decoder's per-block arguments)
        extra = tree_map(partial(_cast, dtype=x.dtype), extra)
    return call(block, x, extra)


def run_block(call: Callable[[nn.Module, torch.Tensor, tuple], torch.Tensor], block: nn.Module,
              x: torch.Tensor, extra: tuple, policy: Checkpoint) -> torch.Tensor:
    """``call(block, x, extra)`` under ``policy``."""
    set_core_runners(block, policy)
    if policy in (Checkpoint.NONE, Checkpoint.SELECTIVE, Checkpoint.MOE):
        # the block runs as is; selective's cores and moe's layers checkpoint themselves
        with (regathered_saves() if policy.regathers else nullcontext()), \
                (moe_layers_checkpointed(block) if policy is Checkpoint.MOE else nullcontext()):
            return call(block, x, extra)
    context = matmuls_context if policy is Checkpoint.MATMULS else None
    kwargs = {"context_fn": context} if context is not None else {}
    return checkpoint(partial(_as_inputs_of, call, block), x, extra, use_reentrant=False,
                      **kwargs)
