"""``torch.distributed.checkpoint`` and the fused projections' sectioned shards.

A fused projection split section by section over tp (``passes/tensor_parallel.
SectionedColwiseParallel``: q, k and v each over the ranks) is a DTensor whose tp placement is
``_StridedShard(0, split_factor=s)``: a rank's rows are ``s`` blocks of the global tensor, not
one. DCP describes every rank's piece as one block (an offset and a size), so it saves such a
weight, and its Adam moments, as overlapping blocks and refuses the plan ("has overlapping
chunks"); it would read one into the wrong rows. Measured on tests/data/nanogpt.py under tp 2
x dp 2 ZeRO-3 (``tests/dist/test_export_generic.py``).

So those tensors cross DCP whole: ``for_save`` gathers each one (``full_tensor``, a collective
of its mesh; DCP then writes one copy of the replicated value), and ``for_load`` hands DCP an
empty whole tensor to fill, then copies this rank's slice of it (``materialize.local_slice``,
the tp placement's own split, then FSDP2's chunks) into the local shard. A checkpoint so holds
the model's own global tensor under any plan, and any plan reads it. The cost: one whole fused
weight (or moment) at a time on each rank of its mesh, while saving or loading.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import _StridedShard

from autopar.passes.materialize import local_slice


def is_sectioned(value: object) -> bool:
    """A DTensor split section by section over its last (tp) mesh dimension."""
    return isinstance(value, DTensor) and isinstance(value.placements[-1], _StridedShard)


def for_save(state: dict) -> dict:
    """``state`` (nested dicts of tensors and values) with each sectioned DTensor replaced by
    its whole tensor. Every rank of a tensor's mesh must call it, in the same key order (a
    state dict's own)."""
    return {k: for_save(v) if isinstance(v, dict)
            else v.full_tensor() if is_sectioned(v) else v for k, v in state.items()}


def for_load(state: dict) -> tuple[dict, Callable[[], None]]:
    """(``state`` with each sectioned DTensor replaced by an empty whole tensor for
    ``dcp.load`` to fill, the function that then copies this rank's slice of each into the
    DTensor's local shard and puts the DTensor back in its place in the returned dict)."""
    fills: list[tuple[dict, str, DTensor]] = []

    def walk(d: dict) -> dict:
        out = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = walk(v)
            elif is_sectioned(v):
                out[k] = torch.empty(v.shape, dtype=v.dtype, device=v.to_local().device)
                fills.append((out, k, v))
            else:
                out[k] = v
        return out

    @torch.no_grad()
    def fill() -> None:
        for where, key, shard in fills:
            shard.to_local().copy_(local_slice(where[key], shard))
            where[key] = shard

    return walk(state), fill
