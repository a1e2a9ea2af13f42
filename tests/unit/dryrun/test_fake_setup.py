"""The dry run's set-up shortcuts give what torch's own set-up gives (``dryrun/fake_setup.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore

from autopar.dryrun.fake_setup import chunks_on_demand, own_groups_only


def _chunk_on_demand(tensor: torch.Tensor, num_chunks: int, dim: int):
    """FSDP2's ``_chunk_with_empty`` as it is while ``chunks_on_demand`` is held."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    with chunks_on_demand():
        return _fsdp_param._chunk_with_empty(tensor, num_chunks, dim)


@pytest.mark.parametrize("size, chunks", [(10, 4), (9, 4), (8, 8), (1, 128), (300, 128),
                                          (128, 128), (7, 3)])
@pytest.mark.parametrize("dim", [0, 1])
def test_chunks_are_torch_chunks_views_padded_with_empty(size, chunks, dim):
    shape = [size, 6] if dim == 0 else [6, size]
    t = torch.randn(*shape)
    want = list(torch.chunk(t, chunks, dim=dim))
    want += [want[0].new_empty(0)] * (chunks - len(want))
    got = _chunk_on_demand(t, chunks, dim)
    assert len(got) == chunks
    for i in (*range(chunks), -1):
        a, b = got[i], want[i]
        assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
        if b.numel():
            assert a.storage_offset() == b.storage_offset()
            assert a.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
            assert torch.equal(a, b)
    with pytest.raises(IndexError):
        got[chunks]


def test_empty_dimension_chunks_as_torch():
    t = torch.empty(0, 4)
    got = _chunk_on_demand(t, 4, 0)
    assert len(got) == 4 and all(c.numel() == 0 for c in got)


def _meshes(rank: int, world: int, patched: bool) -> list[list[list[int]]]:
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        if patched:
            with own_groups_only(rank):
                mesh = init_device_mesh("cpu", (4, 2, 8), mesh_dim_names=("pp", "dp", "tp"))
                flat = mesh["dp", "tp"]._flatten()
        else:
            mesh = init_device_mesh("cpu", (4, 2, 8), mesh_dim_names=("pp", "dp", "tp"))
            flat = mesh["dp", "tp"]._flatten()
        groups = [mesh.get_group(i) for i in range(3)] + [flat.get_group()]
        return [dist.get_process_group_ranks(g) for g in groups]
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("rank", [0, 13, 63])
def test_mesh_groups_of_the_rank_as_torch_makes_them(rank):
    assert _meshes(rank, 64, patched=True) == _meshes(rank, 64, patched=False)


def test_patches_are_undone():
    from torch.distributed import device_mesh
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    before = device_mesh.new_group, _fsdp_param._chunk_with_empty
    with own_groups_only(0), chunks_on_demand():
        assert (device_mesh.new_group, _fsdp_param._chunk_with_empty) != before
    assert (device_mesh.new_group, _fsdp_param._chunk_with_empty) == before
