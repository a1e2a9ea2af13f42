"""A one-stage program of a model no family describes: the model itself, run whole.

A pp = 1 plan needs no split, so a model whose layout no family knows (a forward that is not a
chain of its blocks: ``admissibility.ModelFacts.unsplittable``) still runs data parallelism,
ZeRO and activation checkpointing: the program's one stage is the model, called as the
reference calls it (``feed.logits_of``), its parameters under the model's own names. Its
repeated blocks (``models.blocks.find_block_group``) are FSDP2 units and are checkpointed as
the plan says: each block's class gets a subclass whose ``__call__`` runs the module's own call
(its hooks, FSDP2's included, and its forward) under ``torch.utils.checkpoint`` -- the model's
forward calls the blocks itself, so the stage cannot wrap the calls as ``StageModule`` does,
and a wrapper module would change the parameter names (and checkpoint keys).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from torch import nn

from autopar.core.specs import Checkpoint
from autopar.models.blocks import find_block_group
from autopar.passes.checkpointing import run_block


def whole_model_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, in order; none where it has no block group."""
    group = find_block_group(model)
    return [] if group is None else [model.get_submodule(p) for p in group.instances]


def _module_call(module: nn.Module, args: tuple, kwargs: dict) -> object:
    return nn.Module.__call__(module, *args, **kwargs)


@cache
def _checkpointed(cls: type[nn.Module], policy: Checkpoint) -> type[nn.Module]:
    def __call__(self, *args, **kwargs):  # noqa: N807 - the module's call, checkpointed
        # the stage's rules (passes/checkpointing.py): full and matmuls checkpoint the call,
        # selective checkpoints the attention cores that take the hook (none where no family
        # describes the model: it runs whole, as the planner prices it)
        return run_block(_module_call, self, args, kwargs, policy)

    return type(f"Checkpointed{cls.__name__}", (cls,), {"__call__": __call__})


def checkpoint_blocks(blocks: Sequence[nn.Module], policies: Sequence[Checkpoint]) -> None:
    """Run each of ``blocks`` under its policy whenever the model calls it (in place)."""
    for block, policy in zip(blocks, policies, strict=True):
        if policy is not Checkpoint.NONE:
            block.__class__ = _checkpointed(type(block), policy)
