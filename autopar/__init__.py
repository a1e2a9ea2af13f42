"""autopar: automatic parallelism planner and compiler for training large models with PyTorch."""

from autopar import models
from autopar.api import estimate, optimize, plan_for, workload_of
from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.errors import AutoparError
from autopar.costmodel.estimate import Estimate
from autopar.costmodel.specs import (
    Checkpoint,
    ParallelConfig,
    Precision,
    Schedule,
    TrainSpec,
)
from autopar.graph import GraphIR
from autopar.plan import Plan, diff
from autopar.tracing import trace

__all__ = [
    "AutoparError",
    "Checkpoint",
    "ClusterSpec",
    "Estimate",
    "GraphIR",
    "ParallelProgram",
    "ParallelConfig",
    "Plan",
    "Precision",
    "Schedule",
    "TrainSpec",
    "device_mesh",
    "diff",
    "estimate",
    "models",
    "optimize",
    "parallelize",
    "plan_for",
    "trace",
    "workload_of",
]
__version__ = "0.1.0"

_EXECUTION = frozenset({"ParallelProgram", "device_mesh", "parallelize"})


def __getattr__(name: str) -> object:
    """The execution API (``autopar.passes``) on first use: it imports torch.distributed's
    pipelining and DTensor machinery and the Triton kernels, about 0.9 s that planning alone
    does not need."""
    if name in _EXECUTION:
        from autopar import passes

        return getattr(passes, name)
    raise AttributeError(f"module 'autopar' has no attribute {name!r}")
