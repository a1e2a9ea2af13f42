"""``Estimate``: the predicted memory and time of one training step under one configuration."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .specs import ParallelConfig


@dataclass(frozen=True)
class StageMemory:
    """Peak bytes on the most loaded GPU of one pipeline stage, by kind."""

    stage: int
    blocks: int
    breakdown: dict[str, float]

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

    @property
    def fits(self) -> bool:
        """Peak memory fits in usable HBM."""
        return self.peak_memory_bytes <= self.usable_memory_bytes

    def summary(self) -> str:
        """The configuration on one line: ``dp8 tp8 pp4 zero1 mb1x64 interleaved(v2) sp
        ckpt:full`` (per-block checkpointing as counts, ``ckpt:4full+20none``)."""
        c = self.config
        if isinstance(c.checkpoint, tuple):
            counts: dict[str, int] = {}
            for p in c.checkpoint:
                counts[str(p)] = counts.get(str(p), 0) + 1
            ckpt = "+".join(f"{n}{k}" for k, n in counts.items())
        else:
            ckpt = str(c.checkpoint)
        parts = [f"dp{c.dp}", f"tp{c.tp}", f"pp{c.pp}"]
        parts += [f"cp{c.cp}"] if c.cp > 1 else []
        parts += [f"ep{c.ep}"] if c.ep > 1 else []
        parts += [f"zero{c.zero}", f"mb{c.micro_batch}x{self.num_microbatches}"]
        if c.pp > 1:
            parts.append(str(c.schedule) + (f"(v{c.virtual_stages})" if c.virtual_stages > 1
                                            else ""))
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
