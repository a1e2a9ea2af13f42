"""Keep a sequence-parallel all-gather's output for the backward as its shard, and gather it
again there: what Megatron-LM does with the input of a column-parallel linear under sequence
parallelism (Korthikanti et al. 2022, section 4.2.2: "we store the sequence-parallel input and
perform an extra all-gather in the backward"), so that every tensor a layer keeps is 1/t.

DTensor's ``ColwiseParallel`` multiplies the all-gathered (``Replicate``) input, and autograd
saves what it multiplies: the whole gathered activation on every tp rank. Under
``regathered_saves`` a saved tensor that is (a view of) the output of a DTensor redistribution
to ``Replicate`` over one mesh dimension -- the gather ``PrepareBlockInput`` runs in front of
a block's column-parallel linears -- is packed as a copy of this rank's ``Shard(0)`` rows (the
split is local, no collective) and unpacked by redistributing it back to ``Replicate`` (an
all-gather in the backward). Savers of views of one gathered tensor share one shard and one
gather. Weights,
sharded tensors and plain tensors are saved as they are, or as the saved-tensor hooks around
the block save them.

``passes/checkpointing.py`` applies it under the policies that regather
(``Checkpoint.regathers``: ``selective`` and ``moe``); the cost model prices the kept shard
(``costmodel.memory.saved_bytes``) and the backward all-gather (``costmodel.step.tp_comm_s``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.multiprocessing.reductions import StorageWeakRef

_VIEWS = frozenset({"ViewBackward0", "UnsafeViewBackward0", "AsStridedBackward0",
                    "TransposeBackward0", "TBackward0", "ReshapeAliasBackward0",
                    "ExpandBackward0"})
"""Autograd nodes of views, walked through to the op that made the storage."""


def _gathered(t: torch.Tensor) -> bool:
    """Whether ``t`` is (a view of) a DTensor redistributed to ``Replicate`` on a 1-D mesh,
    with the rows to split it by."""
    if not isinstance(t, DTensor) or t.device_mesh.ndim != 1 or t.ndim < 1:
        return False
    if not isinstance(t.placements[0], Replicate) or t.shape[0] < t.device_mesh.size():
        return False
    node = t.grad_fn
    while node is not None and node.name() in _VIEWS:
        node = node.next_functions[0][0] if node.next_functions else None
    return node is not None and node.name() == "RedistributeBackward"


@dataclass
class _Shard:
    """One rank's rows of a gathered activation, and how to gather them again: once for all
    its savers (the q, k and v projections read one gathered input), the whole tensor held
    from the first of their backwards to the last."""

    rows: DTensor
    shape: torch.Size
    stride: tuple[int, ...]
    savers: int = 0
    whole: torch.Tensor | None = None

    def gather(self) -> torch.Tensor:
        whole = self.whole
        if whole is None:
            whole = self.rows.redistribute(self.rows.device_mesh, [Replicate()])
            if whole.stride() != self.stride:
                whole = whole.as_strided(self.shape, self.stride)
        self.savers -= 1
        self.whole = whole if self.savers > 0 else None
        return whole


@contextmanager
def regathered_saves() -> Iterator[None]:
    """Within the block: gathered activations saved as shards, gathered again when the
    backward reads them (see the module docstring)."""
    # keyed by the storage (its StorageImpl, which fake tensors have too); an entry whose
    # storage has been freed is stale (a later tensor may reuse the address)
    shards: dict[tuple, tuple[StorageWeakRef, _Shard]] = {}

    # hooks do not nest: hand what is not ours to the hooks around the block, if any
    # (torch keeps them on a stack; _top_saved_tensors_default_hooks reads its top)
    outer = torch._C._autograd._top_saved_tensors_default_hooks(True)
    outer_pack, outer_unpack = outer if outer is not None else (None, None)

    def pack(t: torch.Tensor) -> object:
        if not _gathered(t):
            return t if outer_pack is None else outer_pack(t)
        local = t.to_local()
        storage = local.untyped_storage()
        key = (storage._cdata, local.storage_offset(), tuple(t.shape), t.stride())
        if key not in shards or shards[key][0].expired():
            with torch.no_grad():
                rows = t.detach().contiguous().redistribute(t.device_mesh, [Shard(0)])
                # a copy: the split is a view that would keep the whole gathered storage
                rows = DTensor.from_local(rows.to_local().clone(), t.device_mesh, [Shard(0)],
                                          run_check=False, shape=t.shape,
                                          stride=t.detach().contiguous().stride())
            shards[key] = (StorageWeakRef(storage), _Shard(rows, t.shape, t.stride()))
        shard = shards[key][1]
        shard.savers += 1
        return shard

    def unpack(saved: object) -> torch.Tensor:
        if isinstance(saved, _Shard):
            with torch.no_grad():
                return saved.gather()
        return saved if outer_unpack is None else outer_unpack(saved)  # type: ignore

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
