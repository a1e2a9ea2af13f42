"""A rank's program made as fast under the fake process group as its one rank needs.

A dry-run role makes the program of one rank of a plan that may span 16,384 ranks (``run.py``).
Two of torch's set-up steps do work for every rank of the world, which on fake tensors costs
more than the role's own share, and whose results the role never reads:

* ``DeviceMesh`` makes every sub-group of each mesh dimension (``_init_one_process_group``
  calls ``new_group`` once per group, for groups the rank is in and for the others: about
  24,000 calls, some 0.8 s of CPU here, for llama3-405b's dp32 tp8 pp16 cp4 mesh), and keeps
  the name of the one group the rank is in. ``own_groups_only`` answers the others with no
  group: torch's ``new_group`` gives a rank outside ``ranks`` no group either
  (``GroupMember.NON_GROUP_MEMBER``), and the mesh reads a group's name only where the rank
  is in it. The groups the rank is in are made by torch as before.
* FSDP2 cuts each parameter into one chunk per shard rank (``_chunk_with_empty``: a
  ``torch.chunk`` into 128 views for a 128-way shard) and reads two of them: the rank's own
  and the first (its padded size). Each view of a fake tensor is a fake tensor made through
  the fake mode (about 12 ms a parameter here, 0.8 s a role). ``chunks_on_demand`` makes
  a chunk when it is read, as the same ``narrow`` of the same tensor ``torch.chunk`` makes.

Both are patches of torch's private names, held only while a dry-run role makes its program
(``run.py:_run_role``), checked to exist first: a torch without them makes the program its own
way, only slower. ``tests/unit/dryrun/test_fake_setup.py`` holds the chunks to
``torch.chunk``'s and a role's meshes to the ones torch makes without the patch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

import torch


@contextmanager
def own_groups_only(rank: int) -> Iterator[None]:
    """While held, a ``DeviceMesh`` made on this process makes only the process groups
    ``rank`` is in (module docstring)."""
    from torch.distributed import device_mesh

    made = getattr(device_mesh, "new_group", None)
    if made is None:  # a torch whose mesh makes its groups another way
        yield
        return

    def new_group(ranks=None, *args, **kwargs):
        if ranks is not None and rank not in ranks:
            return None  # the mesh keeps no group it is not in
        return made(ranks, *args, **kwargs)

    device_mesh.new_group = new_group
    try:
        yield
    finally:
        device_mesh.new_group = made


class _Chunks(Sequence):
    """``torch.chunk(tensor, num_chunks, dim)`` padded with empty tensors to ``num_chunks``
    (FSDP2's ``_chunk_with_empty``), each chunk made when it is read."""

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int) -> None:
        size = tensor.size(dim)
        self.tensor, self.dim, self.num_chunks = tensor, dim, num_chunks
        self.step = -(-size // num_chunks) if size else 0  # torch.chunk's chunk size
        self.made = -(-size // self.step) if self.step else 1  # how many torch.chunk gives
        self.size = size
        self._cache: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.num_chunks

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.num_chunks))]
        if i < 0:
            i += self.num_chunks
        if not 0 <= i < self.num_chunks:
            raise IndexError(i)
        if i not in self._cache:
            if i < self.made:
                start = i * self.step
                self._cache[i] = self.tensor.narrow(self.dim, start,
                                                    min(self.step, self.size - start))
            else:
                self._cache[i] = self[0].new_empty(0)
        return self._cache[i]


@contextmanager
def chunks_on_demand() -> Iterator[None]:
    """While held, FSDP2 makes a parameter's shard chunks when it reads them (module
    docstring)."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param
    except ImportError:
        yield
        return
    made = getattr(_fsdp_param, "_chunk_with_empty", None)
    if made is None:
        yield
        return
    def on_demand(tensor: torch.Tensor, num_chunks: int, dim: int) -> Sequence:
        if tensor.size(dim) == 0:  # torch's own answer for an empty dimension
            return made(tensor, num_chunks, dim)
        return _Chunks(tensor, num_chunks, dim)

    _fsdp_param._chunk_with_empty = on_demand
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = made


@contextmanager
def fake_setup(rank: int) -> Iterator[None]:
    """``own_groups_only(rank)`` and ``chunks_on_demand()`` together."""
    with ExitStack() as stack:
        stack.enter_context(own_groups_only(rank))
        stack.enter_context(chunks_on_demand())
        yield
