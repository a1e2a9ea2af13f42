"""The plan a parity test runs: ``autopar.plan_for`` of the given ``ParallelConfig`` fields on a
one-node cluster of as many processes as the configuration's world size; shared by the parity
tests."""

from __future__ import annotations

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import process_cluster
from autopar.models.training import ModelSpec


def process_plan(spec: ModelSpec, fields: dict, batch: int, *, precision: str = "fp32",
                 seq_len: int = 32, fp8_recipe: str = "tensorwise",
                 grad_dtype: str = "fp32") -> autopar.Plan:
    """The plan of ``fields`` for ``spec`` with ``batch`` sequences of ``seq_len`` tokens."""
    config = ParallelConfig(**fields)
    train = TrainSpec(global_batch=batch, seq_len=seq_len, precision=precision,
                      fp8_recipe=fp8_recipe, grad_dtype=grad_dtype)
    return autopar.plan_for(spec.build("meta"), process_cluster(config.world_size), train,
                            config, name=spec.label)
