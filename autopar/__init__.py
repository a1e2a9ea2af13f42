"""autopar: automatic parallelism planner and compiler for training large models with PyTorch."""

from autopar.costmodel.errors import AutoparError
from autopar.costmodel.specs import (
    Checkpoint,
    ParallelConfig,
    Precision,
    Schedule,
    TrainSpec,
)

__all__ = [
    "AutoparError",
    "Checkpoint",
    "ParallelConfig",
    "Precision",
    "Schedule",
    "TrainSpec",
]
__version__ = "0.1.0"
