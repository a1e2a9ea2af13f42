"""Passes that apply a ``Plan`` on torch.distributed: pipeline split, tensor/sequence
parallelism (DTensor), activation checkpointing, data parallelism and mixed precision (FSDP2),
schedules (``torch.distributed.pipelining``); ``parallelize`` runs them in order."""

from autopar.passes.mesh import device_mesh
from autopar.passes.program import ParallelProgram, parallelize

__all__ = ["ParallelProgram", "device_mesh", "parallelize"]
