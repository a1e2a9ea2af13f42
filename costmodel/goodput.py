"""Days and dollars: a plan's step time turned into the whole run's, with checkpoints and
failures priced (``autopar plan --tokens``).

**The run.** ``tokens`` at the plan's tokens per step is ``steps``; at its step time that is the
*ideal* wall time, with no checkpoint and no failure.

**Checkpoints** (``torch.distributed.checkpoint``, as the exported ``train.py`` saves): every
rank writes its shard of the model and optimizer states, the bytes ``dtype_bytes`` prices per
parameter (AdamW with fp32 master weights: 4 + 8 = 12 bytes). An asynchronous save
(``dcp.async_save``) blocks training only while each GPU's shard is staged to host memory
(``Reliability.host_copy_bytes_per_s`` per GPU); the write to storage then runs beside
training, at the storage's aggregate bandwidth, and must end before the next save starts.
A restart relaunches the job (``Reliability.relaunch_s``) and reads the last checkpoint at the
storage's bandwidth.

**Failures.** Interruptions arrive at ``Reliability.failure_rate_per_gpu_hour`` per GPU-hour
(independent, so the job's mean time between interruptions is ``M = 1 / (rate x GPUs)``). Each
costs the restart and the work since the last checkpoint, on average half an interval. With a
save every ``tau`` seconds, a unit of useful work takes ``1 + delta / tau + (tau / 2 + R) / M``
of wall time (Young 1974, first order; ``delta`` the blocking time of a save, ``R`` the
restart), which ``tau = sqrt(2 delta M)`` minimises (Young's interval; Daly 2006 refines it for
``delta`` near ``M``, far from these runs), rounded to whole steps (a save runs between two)
and bounded below by the time the asynchronous write takes. Goodput is the useful share of
wall time, its inverse.

The cluster gives the rates (``ClusterSpec.failure_rate_per_gpu_hour``,
``checkpoint_bytes_per_s``, ``relaunch_s``, ``host_link``; a cluster file sets them). The
default failure rate is Llama 3 405B's pre-training: 419 unexpected interruptions in a 54-day
snapshot on 16,384 H100 GPUs (Grattafiori et al., "The Llama 3 Herd of Models", 2024, section
3.3.4, table 5), 1.97e-5 per GPU-hour. Checking that run against this default is a
consistency check, not a validation: set your cluster's own rate where you know it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from autopar.core.errors import AutoparError
from autopar.core.specs import TrainSpec
from .cluster import (DEFAULT_CHECKPOINT_BYTES_PER_S, DEFAULT_FAILURE_RATE_PER_GPU_HOUR,
                      DEFAULT_RELAUNCH_S, ClusterSpec)
from .memory import dtype_bytes

LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16384
"""Grattafiori et al. 2024, section 3.3.4: 419 unexpected interruptions during a 54-day
snapshot of Llama 3 405B pre-training on 16,384 H100s (466 with the 47 planned ones); the
default rate (``cluster.DEFAULT_FAILURE_RATE_PER_GPU_HOUR``) is theirs."""


@dataclass(frozen=True)
class Reliability:
    """What failures and checkpoints cost on a cluster (``of``: the cluster's fields). Seconds,
    bytes, SI."""

    failure_rate_per_gpu_hour: float = DEFAULT_FAILURE_RATE_PER_GPU_HOUR
    """Unexpected interruptions per GPU-hour (``ClusterSpec.failure_rate_per_gpu_hour``)."""
    storage_bytes_per_s: float = DEFAULT_CHECKPOINT_BYTES_PER_S
    """Aggregate checkpoint write and read bandwidth (``ClusterSpec.checkpoint_bytes_per_s``)."""
    host_copy_bytes_per_s: float = 64e9
    """One GPU's copy to pinned host memory, the staging an asynchronous save blocks on (the
    cluster's ``host_link``; 64e9: PCIe Gen5 x16 one way, NVIDIA H100 datasheet)."""
    relaunch_s: float = DEFAULT_RELAUNCH_S
    """Seconds to restart the job before the checkpoint is read (``ClusterSpec.relaunch_s``,
    an assumption by default)."""

    @classmethod
    def of(cls, cluster: ClusterSpec) -> Reliability:
        """The cluster's: its failure rate, checkpoint storage, relaunch and host link."""
        return cls(failure_rate_per_gpu_hour=cluster.failure_rate_per_gpu_hour,
                   storage_bytes_per_s=cluster.checkpoint_bytes_per_s,
                   host_copy_bytes_per_s=cluster.host_link.bytes_per_s,
                   relaunch_s=cluster.relaunch_s)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (isinstance(value, (int, float)) and value >= 0 and math.isfinite(value)):
                raise AutoparError(f"{name}={value!r} must be a finite number >= 0",
                                   where=name, fix="give a non-negative number")
        if self.storage_bytes_per_s <= 0 or self.host_copy_bytes_per_s <= 0:
            raise AutoparError("checkpoint bandwidths must be positive",
                               where="storage_bytes_per_s, host_copy_bytes_per_s",
                               fix="give the storage's and the host link's bandwidth in B/s")


@dataclass(frozen=True)
class Goodput:
    """The whole run (``goodput_of``); the plan's JSON carries it as ``goodput``."""

    tokens: float
    steps: float
    gpus: int
    step_s: float
    ideal_s: float
    """Wall time with no checkpoint and no failure."""
    checkpoint_bytes: float
    checkpoint_blocking_s: float
    checkpoint_write_s: float
    load_s: float
    restart_s: float
    """Relaunch and load: what an interruption costs besides the lost work."""
    mtbi_s: float
    """The job's mean time between interruptions."""
    interval_s: float
    """Seconds between checkpoints (Young's interval in whole steps, at least the write
    time)."""

    @property
    def interval_steps(self) -> int:
        return max(1, round(self.interval_s / self.step_s)) if self.step_s > 0 else 1
    goodput: float
    """Useful share of the wall time."""
    wall_s: float
    interruptions: float
    """Expected over the whole run."""
    gpu_hours: float
    cost: float | None
    """``gpu_hours`` times the price given, or ``None``."""

    @property
    def wall_days(self) -> float:
        return self.wall_s / 86400.0

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens / (self.wall_s * self.gpus)

    def interruptions_in(self, days: float) -> float:
        return days * 86400.0 / self.mtbi_s

    def to_dict(self) -> dict[str, float | int | None]:
        return {**asdict(self), "wall_days": self.wall_days,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu}


def _whole_steps(tau: float, write: float, step_s: float, cost) -> float:
    """The checkpoint interval: a save happens between steps, so a whole number of them,
    at least one and at least the asynchronous write; of the two whole numbers about Young's
    ``tau``, the one of lower ``cost``."""
    if step_s <= 0:
        return max(tau, write)
    k = max(1, math.ceil(write / step_s), math.floor(tau / step_s))
    return min((k * step_s, (k + 1) * step_s), key=cost)


def checkpoint_bytes(params: float, train: TrainSpec) -> float:
    """Bytes a DCP checkpoint of the plan holds: the master weights and the optimizer's
    moments of every parameter (``memory.dtype_bytes``)."""
    master, _, moments = dtype_bytes(train.precision, train.optimizer)
    return params * (master + moments)


def goodput_of(*, tokens: float, tokens_per_step: float, step_s: float, gpus: int,
               params: float, train: TrainSpec, reliability: Reliability = Reliability(),
               gpu_hour_cost: float | None = None) -> Goodput:
    """The run of ``tokens`` under a plan of ``step_s`` per step of ``tokens_per_step`` on
    ``gpus`` GPUs, a model of ``params`` parameters (module docstring)."""
    if not tokens > 0 or not math.isfinite(tokens):
        raise AutoparError(f"tokens={tokens!r} must be a positive number", where="--tokens",
                           fix="give the tokens to train, e.g. --tokens 15e12")
    if gpu_hour_cost is not None and gpu_hour_cost < 0:
        raise AutoparError(f"gpu_hour_cost={gpu_hour_cost!r} is negative",
                           where="--gpu-hour-cost", fix="give the price of one GPU-hour")
    r = reliability
    steps = tokens / tokens_per_step
    ideal = steps * step_s
    size = checkpoint_bytes(params, train)
    blocking = size / gpus / r.host_copy_bytes_per_s
    write = size / r.storage_bytes_per_s
    load = size / r.storage_bytes_per_s
    restart = r.relaunch_s + load
    rate = r.failure_rate_per_gpu_hour * gpus / 3600.0
    mtbi = math.inf if rate == 0 else 1.0 / rate
    if math.isinf(mtbi):
        interval = max(write, ideal)
        overhead = blocking / interval if interval > 0 else 0.0
    else:
        def cost(tau: float) -> float:
            return blocking / tau + (tau / 2.0 + restart) / mtbi

        interval = _whole_steps(math.sqrt(2.0 * blocking * mtbi), write, step_s, cost)
        overhead = cost(interval)
    good = 1.0 / (1.0 + overhead)
    wall = ideal / good
    gpu_hours = wall * gpus / 3600.0
    return Goodput(tokens=tokens, steps=steps, gpus=gpus, step_s=step_s, ideal_s=ideal,
                   checkpoint_bytes=size, checkpoint_blocking_s=blocking,
                   checkpoint_write_s=write, load_s=load, restart_s=restart, mtbi_s=mtbi,
                   interval_s=interval, goodput=good, wall_s=wall,
                   interruptions=0.0 if math.isinf(mtbi) else wall / mtbi,
                   gpu_hours=gpu_hours,
                   cost=None if gpu_hour_cost is None else gpu_hours * gpu_hour_cost)
