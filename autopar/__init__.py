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
from autopar.passes import ParallelProgram, device_mesh, parallelize
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
