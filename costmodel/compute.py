"""Time of one layer's work on one GPU: a roofline per op, per phase.

An op's time is the larger of its FLOPs over the achieved tensor-core rate and its bytes over the
achieved HBM bandwidth, plus a fixed per-kernel cost. Backward work per op kind:

* GEMM: an activation-gradient and a weight-gradient GEMM, each as many FLOPs as the forward;
* attention: twice the forward FLOPs at the backward efficiency (FlashAttention);
* memory-bound ops: twice the forward bytes (read the output gradient and the saved input,
  write the input gradient), or the op's own ``backward_bytes`` (the fused loss, whose forward
  computed the gradients: its backward only scales them).

A linear layer's GEMMs are priced at their shape on this GPU when the split knows the sequence
length (``Split.seq_len``): tokens = micro-batch x seq_len / cp rows, the weight's feature widths
(the wider one divided by tp) as columns and depth. The rate is then
``Efficiency.matmul_mainloop`` times ``gemm_efficiency`` (tile and wave quantisation, split-K,
the epilogue), and the weight is read (and its gradient accumulated) once per micro-batch, not
once per token. A GEMM whose shape is unknown keeps the whole-run rate ``Efficiency.matmul``.

With a measured profile (``ClusterSpec.profile``, ``costmodel/profile.py``) a linear layer's
GEMMs, attention and memory-bound ops take the measured time wherever their size lies inside the
measured range (the measurement includes the launch cost); everything else stays analytical.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

from autopar.core.specs import Checkpoint
from .cluster import ClusterSpec
from .efficiency import Efficiency
from .profile import note
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
    seq_len: int | None = None
    """Tokens of one whole sequence (the workload's traced ``seq_len``). With it a linear layer's
    GEMMs are priced at their shape on this GPU (``linear_gemms``); ``None`` prices every GEMM
    at the whole-run rate ``Efficiency.matmul``."""
    ep: int = 1
    """Expert-parallel degree: the experts a GPU holds, and so the rows each of them gets."""
    etp: int = 1
    """Expert tensor-parallel degree: each expert's width split, its rows gathered from the
    etp ranks (``grouped_gemms``)."""
    fp8: bool = False
    """The plan trains in ``fp8``: the linears marked ``OpCost.fp8`` run their GEMMs at the
    GPU's FP8 peak, with their casts (``fp8_cast_s``)."""
    fp8_fused_casts: bool = False
    """The casts as Transformer Engine runs them (``core.specs.FP8_FUSED_CASTS``)."""
    fp8_compiled_casts: bool = False
    """The casts as torch.compile runs torchao's (``core.specs.FP8_COMPILED_CASTS``)."""
    mcore_activations: bool = False
    """Activations as Megatron-Core keeps them (``core.specs.MCORE_ACTIVATIONS``)."""

    def divisor(self, shard: Shard) -> float:
        if shard is Shard.TP or (shard is Shard.SEQ and self.sequence_parallel):
            return float(self.tp)
        return 1.0

    def scale(self, shard: Shard) -> float:
        """Fraction of one sequence's unsharded work that lands on this GPU, times micro-batch."""
        return self._scales[shard]

    @cached_property
    def _scales(self) -> dict[Shard, float]:
        """``scale`` of each shard, worked out once: the memory model asks it of every saved
        tensor of every layer it sizes."""
        return {shard: self.micro_batch / (self.divisor(shard) * self.cp) for shard in Shard}


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds per phase for one micro-batch."""

    forward: float = 0.0
    backward_act: float = 0.0
    backward_weight: float = 0.0
    forward_unsaved: float = 0.0
    """Of ``forward``, what runs again in the backward even where a policy saves the op's
    output (``reruns``): an eager FP8 linear's input and weight casts, which the matmuls
    policy does not keep -- it saves the GEMM's output, not its FP8 operands."""

    @property
    def backward(self) -> float:
        return self.backward_act + self.backward_weight

    def __add__(self, other: PhaseTimes) -> PhaseTimes:
        return PhaseTimes(
            self.forward + other.forward,
            self.backward_act + other.backward_act,
            self.backward_weight + other.backward_weight,
            self.forward_unsaved + other.forward_unsaved,
        )


@dataclass(frozen=True)
class Gemm:
    """One GEMM on one GPU: an output of ``rows`` x ``cols`` elements, each a dot product of
    length ``depth``."""

    rows: float
    cols: float
    depth: float
    bytes: float
    """Bytes the GEMM reads and writes in HBM (operands, output, accumulated output)."""
    out_bytes: float
    """Bytes per output element its epilogue moves: the write, plus the read of an output it
    accumulates into."""

    @property
    def flop(self) -> float:
        return 2.0 * self.rows * self.cols * self.depth


def epilogue_depth(out_bytes: float, peak_flop_per_s: float, hbm_bytes_per_s: float) -> float:
    """The reduction length whose main loop takes as long as writing the output tile.

    A thread block computes its tile (``2*tm*tn*depth`` FLOPs at the SM's share of the rate),
    then writes it (``tm*tn*out_bytes`` bytes, with every SM of the wave writing at once, so at
    its share of HBM bandwidth): the write is not overlapped with that tile's main loop. The
    ratio of the two is ``out_bytes * peak / (2 * bandwidth)``, free of the tile size and SM
    count: half the machine balance (ridge point) per output byte. With bf16 outputs and the
    achieved rates of ``Efficiency``: ~145 on A100, ~280 on H100 -- a GEMM reducing over 288 (a
    tp=8 split of a 2304-wide layer) runs at ~2/3 of its main-loop rate on A100, one reducing
    over 8192 at 98 %.
    """
    return out_bytes * peak_flop_per_s / (2.0 * hbm_bytes_per_s)


@dataclass(frozen=True)
class GroupedGemm:
    """``groups`` GEMMs of one shape run as one kernel (a grouped GEMM: every local expert's
    rows at once), each ``rows`` x ``cols`` reducing ``depth``."""

    groups: int
    gemm: Gemm

    @property
    def flop(self) -> float:
        return self.groups * self.gemm.flop


@lru_cache(maxsize=65536)
def _gemm_efficiency(rows: float, cols: float, depth: float, sms: int | None,
                     tiles: tuple[tuple[int, int], ...], k_out: float, k_partial: float,
                     groups: int = 1) -> float:
    useful = groups * rows * cols * depth
    best = 0.0
    for tm, tn in tiles:
        n_tiles = groups * math.ceil(rows / tm) * math.ceil(cols / tn)
        # a grouped GEMM's tiles of every group share the waves; no split-K across groups
        max_split = max(1, sms // n_tiles) if sms and groups == 1 else 1
        for split in range(1, max_split + 1):
            slots = (math.ceil(n_tiles * split / sms) * sms) if sms else n_tiles * split
            per_block = math.ceil(depth / split) + (k_out if split == 1 else k_partial)
            best = max(best, useful / (slots * tm * tn * per_block))
    return best


def gemm_efficiency(gemm: Gemm, cluster: ClusterSpec, eff: Efficiency, compute_dtype: str,
                    groups: int = 1) -> float:
    """Fraction of the main-loop rate (``Efficiency.matmul_mainloop``) a GEMM of this shape
    reaches on this GPU, the best over the tiles ``Efficiency.gemm_tiles`` and split-K.

    NVIDIA's "Matrix Multiplication Background User's Guide" (DU-09799-001, 2023, ch. 3)
    describes the two losses of a tiled GEMM: *tile quantisation* (a dimension that is not a
    multiple of the tile pads the last tiles) and *wave quantisation* (tiles run in waves of one
    per SM -- 108 on A100, ``GPUSpec.sm_count`` -- and the last wave may be mostly idle). So a GEMM of
    ``n`` tiles occupies ``ceil(n / SMs) * SMs`` tile slots, each for ``depth`` steps of its main
    loop plus ``epilogue_depth`` for writing the tile. A GEMM with fewer tiles than SMs may be
    split along its depth (split-K, as cuBLAS does for such shapes): ``s`` blocks per tile, each
    reducing ``depth / s`` and writing fp32 partial sums. Large GEMMs come out at 0.9-1.0 (a
    16384-cube: 0.99 on A100); 256 tokens (a 2048-token sequence split 8 ways by cp) through a
    2304-wide layer at 0.73 on A100 and 0.47 on H100; 2048 tokens through a 2304-wide layer
    split 8 ways by tp (a reduction of 288) at 0.59 on A100.

    ``groups`` GEMMs of the shape run as one grouped kernel (``GroupedGemm``): their tiles fill
    the same waves, so 32 experts of 256 rows lose no more to wave quantisation than one GEMM
    of 8192 rows would, and none is split along its depth.
    """
    peak = cluster.gpu.peak(compute_dtype) * eff.matmul_mainloop
    hbm = cluster.gpu.hbm_bytes_per_s * eff.memory
    return _gemm_efficiency(
        float(gemm.rows), float(gemm.cols), float(gemm.depth), cluster.gpu.sm_count,
        eff.gemm_tiles, epilogue_depth(gemm.out_bytes, peak, hbm),
        epilogue_depth(4.0, peak, hbm), groups,
    )


def linear_gemms(op: OpCost, split: Split) -> tuple[Gemm, Gemm, Gemm] | None:
    """The (forward-or-input-gradient, the other one, weight-gradient) GEMMs of a linear layer
    for one micro-batch on one GPU, or ``None`` when the shape cannot be known (no sequence
    length, or no recorded weight: ``OpCost.weight_shape``).

    With the weight's wider width ``D`` split by tp (``D' = D/tp``, true of Megatron's column
    and row splits of QKV, MLP and head; a square weight's split is either) and ``d`` the
    other, a column split runs ``M x D'`` reducing ``d`` forward and ``M x d`` reducing ``D'``
    for the input gradient, a row split the same two the other way round, and both the weight
    gradient ``D' x d`` reducing over the ``M`` tokens. The weight (``D'*d`` elements) is read
    once per GEMM, not scaled by tokens, and the weight-gradient GEMM accumulates into the
    gradient buffer (read and written, as a GEMM with beta = 1 does: Megatron's
    gradient-accumulation fusion, PyTorch's ``.grad +=``).

    The widths are the weight's own, not solved back from the op's FLOPs and bytes (as they
    were until 2026-11-24): that solve read the bias as extra width, and it is ill-conditioned
    for a square weight -- GPT-530B's attention projection (20480 x 20480, split 8 ways) came
    out 2617 x 20032 instead of 2560 x 20480, its QKV 7686 wide instead of 7680, one more
    column of 128-wide tiles (``gemm_efficiency`` 0.88 instead of 0.98).
    """
    if (split.seq_len is None or op.op != "linear" or op.expert or op.flop <= 0
            or op.weight_shape is None):
        return None
    a = split.act_bytes
    wide, narrow = (float(max(op.weight_shape)), float(min(op.weight_shape)))
    m = split.micro_batch * float(split.seq_len) / split.cp
    if op.shard is Shard.TP:
        wide /= split.tp
    else:  # a replicated weight; under sequence parallelism its tokens are split instead
        m /= split.divisor(op.shard)
    io = a * (m * narrow + wide * narrow + m * wide)
    return (Gemm(m, wide, narrow, io, a), Gemm(m, narrow, wide, io, a),
            Gemm(wide, narrow, m, a * (m * wide + m * narrow + 2.0 * wide * narrow), 2.0 * a))


def grouped_gemms(op: OpCost, split: Split, expert_scale: float = 1.0
                  ) -> tuple[GroupedGemm, GroupedGemm, GroupedGemm] | None:
    """The (forward, input-gradient, weight-gradient) grouped GEMMs of an expert GEMM for one
    micro-batch on one GPU, as the engines run a MoE layer's local experts: one kernel over
    every local expert at the rows it received (Megatron-Core's ``--moe-grouped-gemm``,
    torchtitan's ``torch._grouped_mm``), not one small GEMM per expert. ``None`` without the
    stacked weight's shape (``OpCost.expert_shape``) or the sequence length.

    The rows of one sequence over all E experts are the op's FLOPs over ``2 * K * N``; a GPU
    routes its own tokens' (``split.scale(op.shard)``: under the fold of the experts over the
    tp ranks, its sequence shard), grown by ``expert_scale`` (the busiest rank's load), and
    receives as many as it sends, spread over its ``E / ep`` experts; expert tensor
    parallelism gathers the rows of its ``etp`` ranks and splits each expert's width ``N``
    (columns of the gate and up projections; of the down projection its reduction, the same
    GEMM transposed: the split dimension is named ``N`` either way). The weight gradient is
    ``E / ep`` GEMMs of ``K x N/etp`` reducing each expert's rows: few rows per expert make it
    short, which the tile model prices (``epilogue_depth``)."""
    if split.seq_len is None or op.expert_shape is None or op.flop <= 0:
        return None
    e, k, n = (float(x) for x in op.expert_shape)
    rows = op.flop / (2.0 * k * n) * split.scale(op.shard) * expert_scale * split.etp
    local = max(1, int(e) // split.ep)
    m = rows / local
    n = n / split.etp
    a = split.act_bytes
    weights = local * k * n
    io = a * (rows * k + weights + rows * n)
    return (GroupedGemm(local, Gemm(m, n, k, io, a)), GroupedGemm(local, Gemm(m, k, n, io, a)),
            GroupedGemm(local, Gemm(k, n, m, a * (rows * k + rows * n + 2.0 * weights),
                                    2.0 * a)))


FP8_CAST_BYTES_PER_ELEMENT = 33.0
"""HBM bytes one dynamic-scale cast of a bf16 element to FP8 moves as torchao 0.18's eager float8
linear runs it, six kernels (``torchao/float8``: ``tensor_to_amax`` is ``max(abs(x))``,
``_ToFloat8ConstrFunc`` is ``x.to(float32) * scale`` then ``to_fp8_saturated``'s ``clamp`` and
``.to(float8)``): abs reads 2 and writes 2, max reads 2, the fp32 copy reads 2 and writes 4, the
scaling reads 4 and writes 4, the clamp reads 4 and writes 4, the cast reads 4 and writes 1.
torch.compile fuses the chain into two kernels (``FP8_COMPILED_CAST_BYTES_PER_ELEMENT``),
Transformer Engine into the op before (``fp8_fused_casts``)."""

FP8_COMPILED_CAST_BYTES_PER_ELEMENT = 5.0
"""HBM bytes one cast of a bf16 element to FP8 with a dynamic scale moves under torch.compile
(``fp8_compiled_casts``): Inductor's amax reduction reads it (2), the fused scale-clamp-cast
reads it again and writes one byte (3), in the layout the GEMM reads (the transpose is the
kernel's store order, no copy of its own) -- two kernels a cast."""

FP8_TRANSPOSE_BYTES_PER_ELEMENT = 42.0
"""The FP8 copies ``torch._scaled_mm``'s layouts force in an eager float8 linear's backward (its
second operand column-major: the weight for the input gradient, the input and the output
gradient for the weight gradient; torchao's ``float8_ops`` copies with ``.t().contiguous()``),
priced as HBM bytes per element at the memory-bound rate. Measured, not derived: one-byte
transposes run far below the copy rate. Basis (bench/results/fp8_linear.md, 2026-11-28, H200,
torch 2.11, torchao 0.18): in the profile of an 8192-token, 8192 -> 28672 float8 linear's
forward and backward, its copies (``aten::clone``) took 6.26 ms a step for the 537 M elements of
input, weight and output gradient, 11.7 ps an element: 42 bytes at 75 % of the H200's
4.8 TB/s."""

FP8_EAGER_KERNELS = (19, 41)
"""Kernels an eager float8 linear launches beyond its GEMMs, (forward, backward): per cast the
six of ``FP8_CAST_BYTES_PER_ELEMENT`` and three that turn the amax into a scale; two casts
forward (input, weight) and its GEMM; four backward (the output gradient twice, once per
layout, the weight and the input again: torchao keeps them in bf16), the three transposes and
the two GEMMs."""


def fp8_cast_s(op: OpCost, split: Split, cluster: ClusterSpec, eff: Efficiency
               ) -> tuple[float, float]:
    """(forward, backward) seconds an FP8 linear adds to its GEMMs for one micro-batch on one
    GPU: the casts (``passes/float8.py``, torchao's eager ``Float8Linear``). Forward, its input
    and its weight; backward, the output gradient twice (one per GEMM layout), the input and
    the weight again, and the three transposes ``torch._scaled_mm`` needs
    (``FP8_CAST_BYTES_PER_ELEMENT``, ``FP8_TRANSPOSE_BYTES_PER_ELEMENT``,
    ``FP8_EAGER_KERNELS``). Memory-bound: a profile's measured rate when there is one. The tp
    split of the weight is ``linear_gemms``'.

    Measured (bench/results/fp8_linear.md, H200): the eager float8 linear is slower than the
    bf16 one at every shape tried, 1.6x at 8192 -> 28672 and 3-9x at a 1B model's; the
    engine's FP8 is priced as that, and the search picks it only where it would win.

    With ``Split.fp8_compiled_casts`` (torch.compile): the input and the weight forward, the
    output gradient, the input and the weight backward, ``FP8_COMPILED_CAST_BYTES_PER_ELEMENT``
    each, two kernels a cast.

    With ``Split.fp8_fused_casts`` (Transformer Engine): forward, one more byte per input
    element, written by the kernel that produces the input; the weight cast once per step
    (left out: 5 bytes per weight element once, some 10 ms a step for an 8B model on an H100);
    backward, the output gradient's cast-transpose (read 2 bytes, write the FP8 copy and its
    transpose) in one kernel, the input and weight copies reused from the forward."""
    out_f, in_f = (float(x) for x in op.weight_shape)
    m = split.micro_batch * float(split.seq_len) / split.cp
    if op.shard is Shard.TP:  # the wider of the two is split, as linear_gemms has it
        if out_f >= in_f:
            out_f /= split.tp
        else:
            in_f /= split.tp
    else:
        m /= split.divisor(op.shard)
    k = eff.kernel_overhead_s
    x, w, g = m * in_f, out_f * in_f, m * out_f
    if split.fp8_fused_casts:
        return _memory_s(x, cluster, eff), _memory_s(4.0 * g, cluster, eff) + k
    if split.fp8_compiled_casts:
        b = FP8_COMPILED_CAST_BYTES_PER_ELEMENT
        return (_memory_s(b * (x + w), cluster, eff) + 4 * k,
                _memory_s(b * (g + x + w), cluster, eff) + 6 * k)
    cast, transpose = FP8_CAST_BYTES_PER_ELEMENT, FP8_TRANSPOSE_BYTES_PER_ELEMENT
    kernels_fwd, kernels_bwd = FP8_EAGER_KERNELS
    forward = _memory_s(cast * (x + w), cluster, eff) + kernels_fwd * k
    backward = (_memory_s(cast * (2 * g + x + w) + transpose * (g + x + w), cluster, eff)
                + kernels_bwd * k)
    return forward, backward


def _memory_s(nbytes: float, cluster: ClusterSpec, eff: Efficiency) -> float:
    """Seconds to stream ``nbytes`` through HBM: the profile's measured memory-bound rate, or
    the datasheet's at ``eff.memory``."""
    p = cluster.profile
    t = measured("memory-bound", p and p.memory_s(nbytes), cluster)
    return t if t is not None else nbytes / (cluster.gpu.hbm_bytes_per_s * eff.memory)


def _expert_cast_s(forward: Gemm | GroupedGemm, cluster: ClusterSpec, eff: Efficiency
                   ) -> tuple[float, float]:
    """(forward, backward) seconds of the FP8 casts of an expert GEMM as Transformer Engine
    runs them (``fp8_fused_casts``): the routed rows' FP8 copy written by the permutation that
    makes them (one byte per element), the output gradient's cast-transpose (``fp8_cast_s``)."""
    groups, g = ((forward.groups, forward.gemm) if isinstance(forward, GroupedGemm)
                 else (1, forward))
    rows = groups * g.rows
    return (_memory_s(rows * g.depth, cluster, eff),
            _memory_s(4.0 * rows * g.cols, cluster, eff) + eff.kernel_overhead_s)


def measured(term: str, seconds: float | None, cluster: ClusterSpec) -> float | None:
    """``seconds`` (a profile lookup), counted as a measured or an analytical ``term`` of the
    step being priced (``profile.note``) when the cluster has a profile."""
    if cluster.profile is not None:
        note(term, seconds is not None)
    return seconds


def _gemm_s(gemm: Gemm | GroupedGemm, split: Split, cluster: ClusterSpec, eff: Efficiency
            ) -> float:
    if isinstance(gemm, GroupedGemm):
        return _grouped_s(gemm, split, cluster, eff)
    p = cluster.profile
    if p is not None:
        t = measured("gemm", p.gemm_s(gemm.rows, gemm.cols, gemm.depth, split.compute_dtype),
                     cluster)
        if t is not None:
            return t
    rate = (cluster.gpu.peak(split.compute_dtype) * eff.matmul_mainloop
            * gemm_efficiency(gemm, cluster, eff, split.compute_dtype))
    hbm = cluster.gpu.hbm_bytes_per_s * eff.memory
    return max(gemm.flop / rate, gemm.bytes / hbm) + eff.kernel_overhead_s


def _grouped_s(grouped: GroupedGemm, split: Split, cluster: ClusterSpec, eff: Efficiency
               ) -> float:
    """A grouped GEMM: its measured time where the profile holds grouped GEMMs of this shape
    (``autopar profile``), else the tile model over every group's tiles at once, bound by the
    bytes it moves (every local expert's weight is read once)."""
    gemm, groups = grouped.gemm, grouped.groups
    p = cluster.profile
    if p is not None:
        t = measured("grouped_gemm", p.grouped_gemm_s(groups, gemm.rows, gemm.cols, gemm.depth,
                                                      split.compute_dtype), cluster)
        if t is not None:
            return t
    rate = (cluster.gpu.peak(split.compute_dtype) * eff.matmul_mainloop
            * gemm_efficiency(gemm, cluster, eff, split.compute_dtype, groups))
    hbm = cluster.gpu.hbm_bytes_per_s * eff.memory
    return max(grouped.flop / rate, gemm.bytes / hbm) + eff.kernel_overhead_s


def estimate_op_s(
    op: OpCost, split: Split, cluster: ClusterSpec, eff: Efficiency, *, expert_scale: float = 1.0
) -> PhaseTimes:
    """Forward and backward seconds of one op for one micro-batch on one GPU."""
    if op.kind is OpKind.FREE:
        return PhaseTimes()
    if op.kind is OpKind.MATMUL:
        gemms = (grouped_gemms(op, split, expert_scale) if op.expert
                 else linear_gemms(op, split))
        if gemms is not None:
            # the blocks' linears under fp8; the experts' grouped GEMMs only where Transformer
            # Engine runs them (autopar's engine keeps the stacked experts bf16: core.fp8)
            fp8 = split.fp8 and (split.fp8_fused_casts if op.expert else op.fp8)
            at = replace(split, compute_dtype="fp8") if fp8 else split
            first, second, weight = (_gemm_s(g, at, cluster, eff) for g in gemms)
            # forward and input gradient are the two activation GEMMs, in an order that depends
            # on column vs row split; each phase gets their mean
            act = (first + second) / 2
            if fp8:
                cast_fwd, cast_bwd = (_expert_cast_s(gemms[0], cluster, eff) if op.expert
                                      else fp8_cast_s(op, split, cluster, eff))
                return PhaseTimes(act + cast_fwd, act + cast_bwd, weight,
                                  cast_fwd if casts_unsaved(op, split) else 0.0)
            return PhaseTimes(act, act, weight)
    s = split.scale(op.shard) * (expert_scale if op.expert else 1.0)
    flop, nbytes = op.flop * s, op.bytes * s
    peak = cluster.gpu.peak(split.compute_dtype)
    hbm = cluster.gpu.hbm_bytes_per_s * eff.memory
    k = eff.kernel_overhead_s
    p = cluster.profile
    if op.kind is OpKind.MATMUL:
        measured("gemm", None, cluster)  # a GEMM of unknown shape is not looked up
        fwd = max(flop / (peak * eff.matmul), nbytes / hbm) + k
        return PhaseTimes(fwd, fwd, fwd)
    if op.kind is OpKind.ATTENTION:
        fwd = measured("attention", p and p.attention_s(flop, split.compute_dtype,
                                                        backward=False), cluster)
        bwd = measured("attention", p and p.attention_s(flop, split.compute_dtype,
                                                        backward=True), cluster)
        # a causal kernel computes the unmasked half of the score tiles; the efficiencies are
        # of the FLOPs it computes, as FlashAttention reports them
        work = flop * (0.5 if op.causal else 1.0)
        if fwd is None:
            fwd = max(work / (peak * eff.attention_fwd), nbytes / hbm) + k
        if bwd is None:
            bwd = max(2 * work / (peak * eff.attention_bwd), 2 * nbytes / hbm) + k
        # under context parallelism: each of this rank's query chunks against the gathered K/V
        # up to its end, causal (passes/context_parallel.py), 1/cp of the full score matrix the
        # FLOPs count (ops/attention.py), no ring steps to merge
        return PhaseTimes(fwd, bwd, 0.0)
    bwd_bytes = 2 * nbytes if op.backward_bytes is None else op.backward_bytes * s
    fwd = measured("memory-bound", p and p.memory_s(nbytes), cluster)
    bwd = measured("memory-bound", p and p.memory_s(bwd_bytes), cluster)
    return PhaseTimes(nbytes / hbm + k if fwd is None else fwd,
                      bwd_bytes / hbm + k if bwd is None else bwd, 0.0)


def reruns(op: OpCost, policy: Checkpoint) -> bool:
    """Whether ``policy`` runs ``op``'s forward again in the backward: ``full`` every op,
    ``matmuls`` every op but the linear layers and fused attention, ``selective`` the unfused
    attention core's, ``moe`` the mixture-of-experts layers' (``passes/checkpointing.py``)."""
    if policy is Checkpoint.FULL:
        return True
    if policy is Checkpoint.MATMULS:
        return not op.kept_by_matmuls
    if policy is Checkpoint.SELECTIVE:
        return op.attention_core
    if policy is Checkpoint.MOE:
        return op.moe_layer
    return False


def casts_unsaved(op: OpCost, split: Split) -> bool:
    """Whether ``op`` is a linear whose FP8 casts are ops of their own, outside its GEMM
    (torchao's float8, eager or compiled), which the matmuls policy, saving the GEMM's output
    and not its FP8 operands, runs again (``PhaseTimes.forward_unsaved``); Transformer
    Engine's fused casts are its GEMM's."""
    return split.fp8 and op.fp8 and not op.expert and not split.fp8_fused_casts


def reissues(policy: Checkpoint) -> bool:
    """Whether ``policy``'s recomputation issues the block's forward collectives again (tp, cp,
    ep): ``full`` and ``matmuls`` rerun the ops around them; ``selective`` reruns the attention
    core only, which issues none (under cp the attention is fused: nothing is rerun); ``moe``
    reruns the MoE layers only, which issue the ep all-to-alls (``costmodel/moe.py:
    ep_reissues``) and no tp or cp collective of the attention's."""
    return policy in (Checkpoint.FULL, Checkpoint.MATMULS)


def op_times(layer: LayerCost, split: Split, cluster: ClusterSpec, eff: Efficiency, *,
             expert_scale: float = 1.0, expert: bool | None = None) -> tuple[PhaseTimes, ...]:
    """``estimate_op_s`` of each of ``layer``'s ops, in order: what ``layer_times`` sums, for
    the whole layer and for the ops each policy reruns alike (they are priced once: the cost
    model's memo, ``step.layer_compute_s``). With
    ``expert`` only the expert ops (True) or only the others (False): the others depend
    neither on ``expert_scale`` nor on the split's ep and etp (``grouped_gemms`` alone reads
    them), so one pricing of them serves every expert layout."""
    return tuple(estimate_op_s(op, split, cluster, eff, expert_scale=expert_scale)
                 for op in layer.ops if expert is None or op.expert is expert)


def merged_times(layer: LayerCost, dense: Sequence[PhaseTimes], experts: Sequence[PhaseTimes]
                 ) -> tuple[PhaseTimes, ...]:
    """The ``op_times`` of every op of ``layer``, in order, from those of its non-expert ops
    (``dense``) and of its expert ops (``experts``)."""
    d, e = iter(dense), iter(experts)
    return tuple(next(e) if op.expert else next(d) for op in layer.ops)


def layer_times(ops: Sequence[OpCost], times: Sequence[PhaseTimes],
                recomputed_by: Checkpoint | None = None) -> PhaseTimes:
    """The sum of ``times`` (each of ``ops``'s) over every op, or over the ops the
    ``recomputed_by`` policy reruns in the backward (``reruns``), added in the ops' order; of
    an op the matmuls policy keeps, the part of its forward it reruns all the same
    (``PhaseTimes.forward_unsaved``)."""
    forward = backward_act = backward_weight = 0.0
    for op, t in zip(ops, times):
        if recomputed_by is not None and not reruns(op, recomputed_by):
            forward += t.forward_unsaved if recomputed_by is Checkpoint.MATMULS else 0.0
            continue
        forward += t.forward
        backward_act += t.backward_act
        backward_weight += t.backward_weight
    return PhaseTimes(forward, backward_act, backward_weight)


def estimate_layer_s(
    layer: LayerCost,
    split: Split,
    cluster: ClusterSpec,
    eff: Efficiency,
    *,
    recomputed_by: Checkpoint | None = None,
    expert_scale: float = 1.0,
) -> PhaseTimes:
    """Compute seconds of a layer (or of the ops the ``recomputed_by`` policy reruns in the
    backward, ``reruns``) for one micro-batch on one GPU."""
    # only the ops summed are priced (a profile notes each lookup); under matmuls a kept
    # linear too, whose FP8 casts rerun
    ops = [o for o in layer.ops if recomputed_by is None or reruns(o, recomputed_by)
           or (recomputed_by is Checkpoint.MATMULS and casts_unsaved(o, split))]
    return layer_times(ops, [estimate_op_s(o, split, cluster, eff, expert_scale=expert_scale)
                             for o in ops], recomputed_by)
