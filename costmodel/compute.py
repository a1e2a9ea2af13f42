"""Time of one layer's work on one GPU: a roofline per op, per phase.

An op's time is the larger of its FLOPs over the achieved tensor-core rate and its bytes over the
achieved HBM bandwidth, plus a fixed per-kernel cost. Backward work per op kind:

* GEMM: an activation-gradient and a weight-gradient GEMM, each as many FLOPs as the forward;
* attention: twice the forward FLOPs at the backward efficiency (FlashAttention);
* memory-bound ops: twice the forward bytes (read the output gradient and the saved input,
  write the input gradient).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import ClusterSpec
from .efficiency import Efficiency
from .workload import LayerCost, OpCost, OpKind, Shard


@dataclass(frozen=True)
class Split:
    """How one GPU's share of a layer's work is cut from the whole micro-batch."""

    micro_batch: int
    tp: int
    cp: int
    sequence_parallel: bool
    act_bytes: float
    """Bytes per activation element in the precision policy."""
    compute_dtype: str
    """Key of the GPU's peak table ("bf16", "fp16", "tf32")."""

    def divisor(self, shard: Shard) -> float:
        if shard is Shard.TP or (shard is Shard.SEQ and self.sequence_parallel):
            return float(self.tp)
        return 1.0

    def scale(self, shard: Shard) -> float:
        """Fraction of one sequence's unsharded work that lands on this GPU, times micro-batch."""
        return self.micro_batch / (self.divisor(shard) * self.cp)


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds per phase for one micro-batch."""

    forward: float = 0.0
    backward_act: float = 0.0
    backward_weight: float = 0.0

    @property
    def backward(self) -> float:
        return self.backward_act + self.backward_weight

    def __add__(self, other: PhaseTimes) -> PhaseTimes:
        return PhaseTimes(
            self.forward + other.forward,
            self.backward_act + other.backward_act,
            self.backward_weight + other.backward_weight,
        )


def estimate_op_s(
    op: OpCost, split: Split, cluster: ClusterSpec, eff: Efficiency, *, expert_scale: float = 1.0
) -> PhaseTimes:
    """Forward and backward seconds of one op for one micro-batch on one GPU."""
    if op.kind is OpKind.FREE:
        return PhaseTimes()
    s = split.scale(op.shard) * (expert_scale if op.expert else 1.0)
    flop, nbytes = op.flop * s, op.bytes * s
    peak = cluster.gpu.peak(split.compute_dtype)
    hbm = cluster.gpu.hbm_bytes_per_s * eff.memory
    k = eff.kernel_overhead_s
    if op.kind is OpKind.MATMUL:
        fwd = max(flop / (peak * eff.matmul), nbytes / hbm) + k
        return PhaseTimes(fwd, fwd, fwd)
    if op.kind is OpKind.ATTENTION:
        fwd = max(flop / (peak * eff.attention_fwd), nbytes / hbm) + k
        bwd = max(2 * flop / (peak * eff.attention_bwd), 2 * nbytes / hbm) + k
        return PhaseTimes(fwd, bwd, 0.0)
    fwd = nbytes / hbm + k
    return PhaseTimes(fwd, 2 * nbytes / hbm + k, 0.0)


def estimate_layer_s(
    layer: LayerCost,
    split: Split,
    cluster: ClusterSpec,
    eff: Efficiency,
    *,
    only_attention_core: bool = False,
    expert_scale: float = 1.0,
) -> PhaseTimes:
    """Compute seconds of a layer (or of its attention core) for one micro-batch on one GPU."""
    total = PhaseTimes()
    for op in layer.ops:
        if only_attention_core and not op.attention_core:
            continue
        total = total + estimate_op_s(op, split, cluster, eff, expert_scale=expert_scale)
    return total
