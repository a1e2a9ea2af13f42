"""``Estimate``: the predicted memory and time of one training step under one configuration."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from .specs import Checkpoint, ParallelConfig, Schedule


def block_ranges(blocks: Sequence[int]) -> str:
    """Block indices as runs: ``0-3, 8, 10-11`` (ascending, each run once)."""
    runs: list[list[int]] = []
    for b in sorted(blocks):
        if runs and b == runs[-1][1] + 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def checkpoint_text(checkpoint: Checkpoint | str | Sequence[Checkpoint | str]) -> str:
    """A checkpoint policy in words, complete and compact: one policy by its name (``full``);
    a per-block list by policy, first used first, with its blocks and their count
    (``full: blocks 0-3 (4); selective: blocks 4-79 (76)``). The one wording of the report's
    config row, ``Estimate.summary`` and the plan's "What runs" table."""
    if isinstance(checkpoint, str):
        return str(checkpoint)
    policies = [str(p) for p in checkpoint]
    if len(set(policies)) == 1:
        return policies[0]
    where: dict[str, list[int]] = {}
    for i, p in enumerate(policies):
        where.setdefault(p, []).append(i)
    return "; ".join(f"{p}: {'block' if len(b) == 1 else 'blocks'} {block_ranges(b)} ({len(b)})"
                     for p, b in where.items())


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes on the most loaded GPU of one pipeline stage, by kind."""

    stage: int
    blocks: int
    breakdown: dict[str, float]
    moment: str = ""
    """When in the step the peak is (``costmodel/peak.py``: "backward start", "end of
    backward", "optimizer"); empty where the model prices no moment (offload)."""

    @property
    def peak_bytes(self) -> float:
        return sum(self.breakdown.values())


@dataclass(frozen=True)
class Estimate:
    """Predicted cost of one optimizer step. Seconds, bytes and FLOPs (SI units)."""

    config: ParallelConfig
    step_time_s: float
    """One optimizer step for the global batch."""
    tokens_per_s: float
    """Whole cluster."""
    model_flops_per_step: float
    """Forward and backward FLOPs of the model (3x the forward matmul and attention FLOPs), no
    recompute: 6*N*tokens plus attention."""
    hardware_flops_per_step: float
    """What the GPUs execute: model FLOPs plus the recomputed forward."""
    mfu: float
    """model_flops_per_step / (step_time_s * GPUs * peak FLOP/s)."""
    hfu: float
    """hardware_flops_per_step / (step_time_s * GPUs * peak FLOP/s)."""
    peak_memory_bytes: float
    """The most loaded GPU."""
    memory_breakdown: dict[str, float]
    """Bytes on the most loaded GPU: params, grads, optimizer, activations, buffers."""
    time_breakdown: dict[str, float]
    """Seconds per step: compute, recompute, exposed communication by kind (comm_tp, comm_dp,
    comm_pp, comm_cp, comm_ep), bubble, optimizer, offload. Sums to step_time_s."""
    usable_memory_bytes: float
    """HBM the program may use on one GPU."""
    num_microbatches: int
    stage_memory: tuple[StageMemory, ...] = ()
    """Per pipeline stage, first to last."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """What the estimate assumed or could not cost (ops without sharding rules, ...)."""
    host_memory_bytes: float = 0.0
    """CPU memory of one node holding the offloaded optimizer states of its GPUs (the most
    loaded stage's, times the GPUs per node); 0 without offload."""
    usable_host_memory_bytes: float = 0.0
    """The node's CPU memory (``ClusterSpec.host_memory_bytes``), all of it."""
    measured: dict[str, float] = field(default_factory=dict)
    """With a measured profile (``ClusterSpec.profile``): per priced term ("gemm", "attention",
    "memory-bound", "optimizer", "all-reduce", ...), the fraction of its lookups the profile
    answered (1.0: all measured; 0.0: all analytical, e.g. outside the measured sizes). Empty
    when priced without a profile."""

    @property
    def fits(self) -> bool:
        """Peak memory fits in usable HBM, and offloaded states in the node's host memory."""
        return (self.peak_memory_bytes <= self.usable_memory_bytes
                and self.host_memory_bytes <= self.usable_host_memory_bytes)

    def summary(self) -> str:
        """The configuration on one line: ``dp8 tp8 pp4 zero1 mb1x64 interleaved(v2) sp
        ckpt:full`` (per-block checkpointing in ``checkpoint_text``'s words, in parentheses:
        ``ckpt:(full: blocks 0-3 (4); none: blocks 4-23 (20))``; not brackets, which rich
        would read as markup in a table cell)."""
        c = self.config
        ckpt = checkpoint_text(c.checkpoint)
        if " " in ckpt:
            ckpt = f"({ckpt})"
        parts = [f"dp{c.dp}", f"tp{c.tp}", f"pp{c.pp}"]
        parts += [f"cp{c.cp}"] if c.cp > 1 else []
        parts += [f"ep{c.ep}"] if c.ep > 1 else []
        parts += [f"etp{c.etp}"] if c.etp > 1 else []
        parts += [f"zero{c.zero}", f"mb{c.micro_batch}x{self.num_microbatches}"]
        if c.pp > 1 or c.virtual_stages > 1:
            # interleaved shows its chunks even at one (v1: 1F1B's order, see the report)
            parts.append(str(c.schedule) + (f"(v{c.virtual_stages})"
                                            if c.virtual_stages > 1
                                            or c.schedule is Schedule.INTERLEAVED else ""))
        parts += ["sp"] if c.sequence_parallel else []
        parts.append(f"ckpt:{ckpt}")
        parts += ["offload"] if c.offload else []
        return " ".join(parts)

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["config"] = self.config.to_dict()
        out["stage_memory"] = [asdict(sm) for sm in self.stage_memory]
        out["notes"] = list(self.notes)
        out["fits"] = self.fits
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Estimate:
        d = dict(data)
        d.pop("fits", None)
        d["config"] = ParallelConfig.from_dict(d["config"])
        d["stage_memory"] = tuple(StageMemory(**sm) for sm in d.get("stage_memory", ()))
        d["notes"] = tuple(d.get("notes", ()))
        return cls(**d)
