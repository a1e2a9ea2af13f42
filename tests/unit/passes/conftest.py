"""Fixtures of the passes' unit tests."""

import pytest
import torch.distributed as dist


@pytest.fixture
def one_rank():
    """A process group of this one process on gloo (FSDP2 and DTensor need one), torn down
    after the test."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
