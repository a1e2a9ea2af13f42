"""One training step: per-stage compute and communication, the pipeline, gradient reduction.

``estimate_step(workload, cluster, train, config)`` is the whole cost model. It prices one
micro-batch on every pipeline stage (compute per op, recomputation, tensor-, context- and
expert-parallel communication, pipeline sends), runs the schedule (micro-batches times the
slowest stage plus the bubble the other stages' fill and drain make: ``pipeline.pipeline_s``,
the critical path ``schedule_slots`` lays out), adds what the data-parallel gradient reduction cannot hide
behind the backward pass and the optimizer step, and sizes every stage's memory.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache

from .cluster import ClusterSpec
from .collectives import Collective, Group, estimate_collective_s
from .compute import (PhaseTimes, Split, estimate_layer_s, estimate_op_s, layer_times, measured,
                      merged_times, op_times, reissues, reruns)
from .efficiency import DEFAULT_EFFICIENCY, Efficiency
from .memo import ByLayer
from autopar.core.errors import AutoparError
from autopar.core.estimate import Estimate
from .moe import ep_comm_s
from .memory import (StateBytes, grad_reduce_bytes, activation_bytes_per_element,
                     model_state_bytes, state_bytes_per_param)
from .profile import recording
from .pipeline import StagePartition, even_partition, pipeline_s
from autopar.core.specs import (ASYNC_TP, FP8_COMPILED_CASTS, FP8_FUSED_CASTS, MCORE_ACTIVATIONS,
                                Checkpoint, Optimizer, ParallelConfig, Precision, Schedule,
                                TrainSpec)
from .dp_comm import dp_comm_s
from .stage_memory import (LAYER_TIMES_KEPT, _StageSizes, _gathered_weight_bytes, _stage_groups,
                           _stage_memory, _stage_params, _stage_sizes)
from .topology import MeshGroups, domain_notes, mesh_groups, placed_group
from .workload import LayerCost, OpCost, OpKind, Phase, Shard, TPCollective, Workload

COMPUTE_DTYPE = {
    Precision.BF16: "bf16",
    Precision.BF16_PURE: "bf16",
    Precision.FP16: "fp16",
    Precision.FP32: "tf32",
    Precision.FP8: "bf16",  # everything but the FP8 linears' GEMMs (``Split.fp8``)
}


def fp8_notes(workload: Workload, split: Split) -> list[str]:
    """Which linears of a block an fp8 plan runs in FP8 (``core.fp8``'s rule), by their traced
    names without the block's prefix; nothing under another precision."""
    if not split.fp8:
        return []
    linears = [op for op in workload.block.ops if op.op == "linear"]
    fp8 = [re.sub(r"^.*?_\d+_", "", op.name) for op in linears if op.fp8]
    experts = any(op.expert for op in workload.block.ops)
    return [f"FP8 GEMMs: {', '.join(fp8) or 'none'} of each block ({len(fp8)} of {len(linears)} "
            "linears"
            + ("; the experts' grouped GEMMs too (Transformer Engine's)" if experts
               and split.fp8_fused_casts else "")
            + "); the routers, odd-shaped linears, "
            + ("the experts' grouped GEMMs, " if experts and not split.fp8_fused_casts else "")
            + "everything outside the blocks and the head in bf16"]


def split_of(config: ParallelConfig, train: TrainSpec, seq_len: int | None) -> Split:
    """How one GPU's share of a layer's work is cut under ``config`` and ``train`` (``Split``):
    the one place the split is made, for the estimate, the search's bound and the strategy
    solver's pricing alike."""
    return Split(config.micro_batch, config.tp, config.cp, config.sequence_parallel,
                 activation_bytes_per_element(train.precision), COMPUTE_DTYPE[train.precision],
                 seq_len=seq_len, ep=config.ep, etp=config.etp,
                 fp8=train.precision is Precision.FP8,
                 fp8_fused_casts=FP8_FUSED_CASTS in config.fusions,
                 fp8_compiled_casts=FP8_COMPILED_CASTS in config.fusions,
                 mcore_activations=MCORE_ACTIVATIONS in config.fusions)


@dataclass(frozen=True)
class _StageTime:
    """Seconds per micro-batch on one stage, by kind."""

    compute: float
    recompute: float
    comm: dict[str, float]
    backward: float
    """Backward compute of one micro-batch (the window the gradient reduction hides under)."""

    @property
    def total(self) -> float:
        return self.compute + self.recompute + sum(self.comm.values())


def check_world(config: ParallelConfig, cluster: ClusterSpec) -> None:
    if config.world_size != cluster.num_gpus:
        raise AutoparError(
            f"dp*tp*pp*cp = {config.dp}*{config.tp}*{config.pp}*{config.cp} = "
            f"{config.world_size} GPUs, but the cluster has {cluster.num_gpus} "
            f"({cluster.nodes} nodes x {cluster.gpus_per_node})",
            where="dp, tp, pp, cp",
            fix="make dp*tp*pp*cp equal the GPU count (ep is carved from dp*cp)",
        )


def tp_collective_s(c: TPCollective, split: Split, tp_group: Group, cluster: ClusterSpec,
                    eff: Efficiency) -> float:
    """Seconds of one tensor-parallel collective for one micro-batch on one cp rank."""
    nbytes = c.elements * split.micro_batch * split.act_bytes / split.cp
    return estimate_collective_s(Collective(c.kind), nbytes, tp_group, cluster, eff)


def tp_comm_s(
    layer: LayerCost, split: Split, policy: Checkpoint, g: MeshGroups, cluster: ClusterSpec,
    eff: Efficiency, *, overlapped_gemm_s: float | None = None,
) -> float:
    """Exposed seconds of the layer's tensor-parallel collectives for one micro-batch.

    With ``overlapped_gemm_s`` (``async_tp``: the seconds of the tp-split GEMMs, forward and
    backward, that the collectives feed or drain), each sequence-parallel all-gather and
    reduce-scatter runs decomposed into its tp - 1 transfers, each overlapped with the GEMM on
    the chunk already there (PyTorch's micro-pipeline TP, ``passes/async_tp.py``): the GEMM
    in tp chunks of ``gemm / tp``, the transfers ``comm / (tp - 1)`` each, so what stays
    exposed is ``(tp - 1) * max(0, comm / (tp - 1) - gemm / tp)``, i.e. at best
    ``max(0, comm - (tp - 1) / tp * gemm)``. Of that ideal, ``Efficiency.async_tp_overlap`` is
    hidden (measured runs hide less: the chunked GEMMs are slower, not every collective fuses;
    the constant's docstring has its basis). All-reduces (tp without sequence parallelism)
    are not decomposed."""
    total = overlappable = 0.0
    for c in layer.tp_collectives:
        t = tp_collective_s(c, split, g.tp, cluster, eff)
        # a recomputed forward issues its collectives again: the matmuls policy caches GEMM
        # outputs, not the collectives after them; selective and moe recompute the attention
        # core or the MoE layers, which issue no tp collective, but gather the
        # column-parallel inputs they kept as shards again (Checkpoint.regathers)
        again = reissues(policy) or (policy.regathers
                                     and c.kind == Collective.ALL_GATHER.value)
        repeats = 2 if (c.phase is Phase.FORWARD and again) else 1
        if overlapped_gemm_s is not None and Collective(c.kind) in OVERLAPPED_BY_ASYNC_TP:
            overlappable += t * repeats
        else:
            total += t * repeats
    if overlappable:
        ideal = min(overlappable, (split.tp - 1) / split.tp * (overlapped_gemm_s or 0.0))
        total += overlappable - eff.async_tp_overlap * ideal
    return total


OVERLAPPED_BY_ASYNC_TP = frozenset({Collective.ALL_GATHER, Collective.REDUCE_SCATTER})
"""The collectives micro-pipeline TP decomposes: all-gather before a GEMM, reduce-scatter
after one (``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``)."""


def tp_gemm_s(layer: LayerCost, split: Split, policy: Checkpoint, cluster: ClusterSpec,
              eff: Efficiency) -> float:
    """Seconds of the layer's tensor-parallel GEMMs for one micro-batch, forward and backward,
    and the recomputed forward's under full checkpointing: what ``async_tp`` overlaps the
    layer's collectives with."""
    total = 0.0
    for op in layer.ops:
        if op.kind is OpKind.MATMUL and op.shard is Shard.TP:
            t = estimate_op_s(op, split, cluster, eff)
            total += t.forward + t.backward + (t.forward if policy is Checkpoint.FULL else 0.0)
    return total


def cp_collectives(layer: LayerCost) -> list[tuple[Collective, Phase, OpCost]]:
    """The collectives context parallelism runs in one layer for one micro-batch (cp > 1), as
    (kind, phase, the attention op, whose ``kv_elements`` are gathered): the engine
    (``passes/context_parallel.py``) all-gathers each attention's K and V together over the cp
    group in its forward and reduce-scatters dK and dV in its backward."""
    return [(kind, phase, op) for op in layer.ops
            if op.kind is OpKind.ATTENTION and op.kv_elements > 0
            for kind, phase in ((Collective.ALL_GATHER, Phase.FORWARD),
                                (Collective.REDUCE_SCATTER, Phase.BACKWARD_ACT))]


def _cp_comm_s(
    layer: LayerCost, split: Split, policy: Checkpoint, g: MeshGroups, cluster: ClusterSpec,
    eff: Efficiency,
) -> float:
    """Seconds of ``cp_collectives`` (this tp rank's heads; none overlapped with compute); a
    recomputed forward gathers again (``reissues``: full and matmuls, which keeps the
    attention's output, not its gathered inputs; selective recomputes nothing of a fused
    attention)."""
    if split.cp == 1:
        return 0.0
    total = 0.0
    for kind, phase, op in _CP_COLLECTIVES.get(layer, (), lambda: cp_collectives(layer)):
        heads = split.tp if op.shard is Shard.TP else 1  # this tp rank's key/value heads
        nbytes = op.kv_elements * split.micro_batch * split.act_bytes / heads
        repeats = 2 if (phase is Phase.FORWARD and reissues(policy)) else 1
        total += repeats * estimate_collective_s(kind, nbytes, g.cp, cluster, eff)
    return total


def recompute_s(layer: LayerCost, policy: Checkpoint, split: Split, config: ParallelConfig,
                cluster: ClusterSpec, eff: Efficiency) -> float:
    """Seconds of ``layer``'s forward that ``policy`` runs again in its backward, for one
    micro-batch: all of it under full; under matmuls every op but the linear layers and fused
    attention, under selective the unfused attention core's, under moe the MoE layers'
    (``compute.reruns``); none under none."""
    if policy is Checkpoint.NONE:
        return 0.0
    imbalance = eff.moe_load_imbalance if config.ep > 1 and layer.ep_dropless else 1.0
    return layer_compute_s(layer, split, cluster, eff, imbalance,
                           None if policy is Checkpoint.FULL else policy).forward


def stage_recompute_s(workload: Workload, cluster: ClusterSpec, train: TrainSpec,
                      config: ParallelConfig, policies: tuple[Checkpoint, ...],
                      efficiency: Efficiency = DEFAULT_EFFICIENCY,
                      partition: StagePartition | None = None) -> tuple[float, ...]:
    """Each stage's recomputation for one micro-batch under the per-block ``policies``
    (``recompute_s``, as a stage's time counts it): what the search adds to a candidate's
    floor to bound one checkpoint choice of it (``search.optimize``)."""
    part = partition or even_partition(workload.num_blocks, config.pp, config.virtual_stages)
    split = split_of(config, train, workload.seq_len)
    return tuple(sum(n * recompute_s(layer, policy, split, config, cluster, efficiency)
                     for layer, policy, n in _stage_groups(workload, part, s, policies))
                 for s in range(config.pp))


_CP_COLLECTIVES = ByLayer(4096)
"""A layer's ``cp_collectives``, found once (``_cp_comm_s``)."""


def _layer_time(
    layer: LayerCost, policy: Checkpoint, split: Split, config: ParallelConfig, g: MeshGroups,
    cluster: ClusterSpec, eff: Efficiency,
) -> tuple[PhaseTimes, float, float, float, float]:
    """(compute, recompute, tp, cp, ep seconds) of one layer for one micro-batch."""
    # a capacity layer's experts compute their static slots; a dropless one's busiest rank
    # computes its share of the rows
    imbalance = eff.moe_load_imbalance if config.ep > 1 and layer.ep_dropless else 1.0
    t = layer_compute_s(layer, split, cluster, eff, imbalance)
    recompute = recompute_s(layer, policy, split, config, cluster, eff)
    overlapped = (tp_gemm_s(layer, split, policy, cluster, eff)
                  if ASYNC_TP in config.fusions and config.tp > 1 else None)
    return (t, recompute, tp_comm_s(layer, split, policy, g, cluster, eff,
                                    overlapped_gemm_s=overlapped),
            _cp_comm_s(layer, split, policy, g, cluster, eff),
            ep_comm_s(layer, split, policy, config, g, cluster, eff,
                      t.forward + t.backward + recompute))


_LAYER_TIMES = ByLayer(LAYER_TIMES_KEPT)
"""``_layer_time`` of the candidates priced so far."""
"""A layer's memory terms (``_layer_bytes``) of the candidates priced so far."""
_RECOMPUTED = ByLayer(256)
"""A block's FLOPs recomputed per policy (``_recomputed_flop``)."""


def _shared_layer_time(
    layer: LayerCost, policy: Checkpoint, split: Split, config: ParallelConfig, g: MeshGroups,
    cluster: ClusterSpec, eff: Efficiency,
) -> tuple[PhaseTimes, float, float, float, float]:
    """``_layer_time``, remembered across estimates (``_LAYER_TIMES``). Not with a measured
    profile, whose lookups each note which terms it priced."""
    if cluster.profile is not None:
        return _layer_time(layer, policy, split, config, g, cluster, eff)
    return _LAYER_TIMES.get(
        layer, (policy, split, config.ep, config.etp, config.tp, config.fusions, g, cluster,
                eff),
        lambda: _layer_time(layer, policy, split, config, g, cluster, eff))


_LAYER_COMPUTE = ByLayer(LAYER_TIMES_KEPT)
"""``estimate_layer_s`` of the candidates priced so far (``layer_compute_s``)."""
_OP_TIMES = ByLayer(LAYER_TIMES_KEPT)
"""``compute.op_times`` of the candidates priced so far: one pricing of a layer's ops serves
its whole time and what each policy reruns."""
_DENSE_OP_TIMES = ByLayer(LAYER_TIMES_KEPT)
"""``compute.op_times`` of a layer's non-expert ops, for every expert layout and load."""


def layer_compute_s(layer: LayerCost, split: Split, cluster: ClusterSpec, eff: Efficiency,
                    expert_scale: float = 1.0, recomputed_by: Checkpoint | None = None
                    ) -> PhaseTimes:
    """``compute.estimate_layer_s`` of ``layer``, remembered across estimates and the
    search's bounds (``_LAYER_COMPUTE``, its ops' times in ``_OP_TIMES``); not with a measured
    profile, whose lookups each note which terms it priced."""
    if cluster.profile is not None:
        return estimate_layer_s(layer, split, cluster, eff, recomputed_by=recomputed_by,
                                expert_scale=expert_scale)

    if (split.ep != 1 or split.etp != 1 or expert_scale != 1.0) and not _has_experts(layer):
        # ep, etp and the experts' load change nothing of a layer without experts: one entry
        # serves every expert layout
        split, expert_scale = _dense_split(split), 1.0

    def make() -> PhaseTimes:
        return layer_times(layer.ops, _op_times(layer, split, cluster, eff, expert_scale),
                           recomputed_by)
    return _LAYER_COMPUTE.get(layer, (split, cluster, eff, expert_scale, recomputed_by), make)


_HAS_EXPERTS = ByLayer(LAYER_TIMES_KEPT)
"""Whether a layer has expert ops (``_has_experts``)."""


def _has_experts(layer: LayerCost) -> bool:
    return _HAS_EXPERTS.get(layer, (), lambda: any(op.expert for op in layer.ops))


@lru_cache(maxsize=4096)
def _dense_split(split: Split) -> Split:
    """``split`` without its expert layout (ep = etp = 1): what ops outside the experts see."""
    return split if split.ep == split.etp == 1 else replace(split, ep=1, etp=1)


def _op_times(layer: LayerCost, split: Split, cluster: ClusterSpec, eff: Efficiency,
              expert_scale: float) -> tuple[PhaseTimes, ...]:
    """``compute.op_times`` of ``layer``, remembered (``_OP_TIMES``): its non-expert ops priced
    once for every expert layout and load (``_DENSE_OP_TIMES``: ep, etp and the imbalance
    leave them unchanged)."""
    def make() -> tuple[PhaseTimes, ...]:
        dense_split = _dense_split(split)
        dense = _DENSE_OP_TIMES.get(layer, (dense_split, cluster, eff), lambda: op_times(
            layer, dense_split, cluster, eff, expert=False))
        if not _has_experts(layer):
            return dense
        experts = op_times(layer, split, cluster, eff, expert_scale=expert_scale, expert=True)
        return merged_times(layer, dense, experts)
    return _OP_TIMES.get(layer, (split, cluster, eff, expert_scale), make)


def _recomputed_flop(block: LayerCost, policy: Checkpoint) -> float:
    """FLOPs of the GEMMs and attention ``policy`` runs again in one block's backward."""
    if policy is Checkpoint.FULL:
        return block.matmul_flop
    return _RECOMPUTED.get(block, (policy,), lambda: sum(
        o.flop for o in block.ops
        if reruns(o, policy) and o.kind in (OpKind.MATMUL, OpKind.ATTENTION)))


def _stage_time(
    workload: Workload, groups: list[tuple[LayerCost, Checkpoint, int]], split: Split,
    config: ParallelConfig, g: MeshGroups, cluster: ClusterSpec, eff: Efficiency,
) -> _StageTime:
    """The seconds per micro-batch of a stage of ``groups`` (``_stage_groups``)."""
    compute = PhaseTimes()
    recompute = 0.0
    comm = {"comm_tp": 0.0, "comm_cp": 0.0, "comm_ep": 0.0, "comm_pp": 0.0}
    for layer, policy, n in groups:
        t, rc, tp_s, cp_s, ep_s = _shared_layer_time(layer, policy, split, config, g,
                                                     cluster, eff)
        compute = compute + PhaseTimes(n * t.forward, n * t.backward_act, n * t.backward_weight)
        recompute += n * rc
        comm["comm_tp"] += n * tp_s
        comm["comm_cp"] += n * cp_s
        comm["comm_ep"] += n * ep_s
    if config.pp > 1:
        comm["comm_pp"] += _pp_comm_s(workload, split, config, g, cluster, eff)
    return _StageTime(compute.forward + compute.backward, recompute, comm, compute.backward)


def _pp_comm_s(workload: Workload, split: Split, config: ParallelConfig, g: MeshGroups,
               cluster: ClusterSpec, eff: Efficiency) -> float:
    """Seconds of one stage's pipeline transfers for one micro-batch (pp > 1), whatever its
    checkpointing: each chunk's activation forward and its gradient backward."""
    # Narayanan et al.'s scatter/gather: each tp rank sends 1/tp of the boundary activation.
    nbytes = (workload.block.output_elements * split.micro_batch * split.act_bytes
              / (split.tp * split.cp))
    link = Group(size=2, per_node=1 if g.pp_crosses_node else 2)
    one = estimate_collective_s(Collective.SEND_RECV, nbytes, link, cluster, eff)
    # ...and the receiving tp ranks all-gather the full activation over NVLink.
    one += estimate_collective_s(Collective.ALL_GATHER, nbytes * split.tp, g.tp, cluster, eff)
    chunks = config.virtual_stages if config.schedule is Schedule.INTERLEAVED else 1
    return 2 * one * chunks  # activation forward, its gradient backward


def floor_terms_s(workload: Workload, cluster: ClusterSpec, train: TrainSpec,
                  config: ParallelConfig, efficiency: Efficiency = DEFAULT_EFFICIENCY,
                  partition: StagePartition | None = None
                  ) -> tuple[tuple[float, ...], float, float]:
    """What every checkpoint choice of ``config`` pays at least beyond each stage's compute,
    tensor-parallel collectives and exposed all-to-alls (the search's bound,
    ``search.optimize``): (per stage, seconds per micro-batch; exposed data-parallel seconds
    per step; optimizer and offload seconds per step).

    Per stage: the context-parallel collectives as ``none`` issues them (a recomputed forward
    only issues them again, ``_cp_comm_s``) and the pipeline transfers (``_pp_comm_s``, which
    no policy changes). Per step: the largest stage's data-parallel communication left
    exposed under the most compute a policy can run beside it -- its forward and backward and
    the whole forward again (no policy recomputes more than the forward) -- as ``dp_comm.dp_comm_s``
    prices it, which never exposes more under more compute
    (``tests/unit/costmodel/test_costmodel_parts.py``), and which offload does not change;
    and the optimizer and offload terms (``optimizer_terms_s``, which no policy changes)."""
    eff = efficiency
    m = config.microbatches(train)
    part = partition or even_partition(workload.num_blocks, config.pp, config.virtual_stages)
    g = mesh_groups(config, cluster)
    split = split_of(config, train, workload.seq_len)
    sb = state_bytes_per_param(train.precision, train.optimizer)
    pp_s = _pp_comm_s(workload, split, config, g, cluster, eff) if config.pp > 1 else 0.0
    # stages of the same blocks and ends pay the same: each such signature once
    by_signature: dict[tuple[int, bool, bool], float] = {}
    params = []
    exposed = 0.0
    for s in range(config.pp):
        signature = (part.blocks[s], s == 0, s == config.pp - 1)
        if signature in by_signature:
            continue
        cp_s = forward = backward = 0.0
        for layer, _, n in _stage_groups(workload, part, s):
            imbalance = eff.moe_load_imbalance if config.ep > 1 and layer.ep_dropless else 1.0
            t = layer_compute_s(layer, split, cluster, eff, imbalance)
            forward, backward = forward + n * t.forward, backward + n * t.backward
            cp_s += n * _cp_comm_s(layer, split, Checkpoint.NONE, g, cluster, eff)
        by_signature[signature] = cp_s + pp_s
        dense, expert = _stage_params(workload, part, s, config)
        params.append((dense, expert))
        weight_bytes = _gathered_weight_bytes(workload, part, s, config, train, dense,
                                              sb.weights)
        exposed = max(exposed, dp_comm_s(dense, expert,
                                          grad_reduce_bytes(train.precision, train.grad_dtype),
                                          weight_bytes, config, m,
                                          backward + forward, forward + backward + forward,
                                          g, cluster, eff))
    stages = tuple(by_signature[(part.blocks[s], s == 0, s == config.pp - 1)]
                   for s in range(config.pp))
    return stages, exposed, sum(_optimizer_terms(params, config, train, g, cluster, eff))


def _loss_scaling_s(shard: float, sb: StateBytes, config: ParallelConfig, train: TrainSpec,
                    cluster: ClusterSpec, eff: Efficiency) -> float:
    """fp16's dynamic loss scaling before the optimizer step (``passes/loss_scaling.py``): the
    gradients this GPU steps on are read and written once (divided by the scale, checked for
    inf/NaN) and the one-value "found inf" flag is all-reduced over every GPU. The steps it
    skips (at most one per ``growth_interval`` of 2000 once the scale has settled, 0.05 %) are
    not priced. 0 for other precisions."""
    if train.precision is not Precision.FP16:
        return 0.0
    unscale = shard * 2 * sb.grads / (cluster.gpu.hbm_bytes_per_s * eff.memory)
    world = placed_group(config.world_size, 1, cluster.domain_gpus)
    return unscale + estimate_collective_s(Collective.ALL_REDUCE, 4.0, world, cluster, eff)


def _optimizer_s(dense: float, expert: float, config: ParallelConfig, train: TrainSpec,
                 g: MeshGroups, cluster: ClusterSpec, eff: Efficiency) -> tuple[float, float]:
    """(optimizer seconds on the GPU or CPU, loss scaling included, offload transfer
    seconds)."""
    shard = dense / g.dp_cp.size + expert / g.expert_dp.size if config.zero >= 1 else dense + expert
    sb = state_bytes_per_param(train.precision, train.optimizer)
    scaling = _loss_scaling_s(shard, sb, config, train, cluster, eff)
    if config.offload:
        cpu = shard / eff.cpu_adam_params_per_s
        moved = shard * (sb.grads + sb.weights)
        return cpu + scaling, moved / (cluster.host_link.bytes_per_s * eff.host_link)
    p = cluster.profile
    if p is not None and train.optimizer in (Optimizer.ADAMW, Optimizer.ADAM):
        t = measured("optimizer", p.optimizer_s(shard), cluster)
        if t is not None:
            return t + scaling, 0.0
    traffic = 2 * sb.optimizer + sb.grads + sb.weights  # read+write states, read grads, write weights
    return shard * traffic / (cluster.gpu.hbm_bytes_per_s * eff.memory) + scaling, 0.0


def _optimizer_terms(stage_params: Iterable[tuple[float, float]], config: ParallelConfig,
                     train: TrainSpec, g: MeshGroups, cluster: ClusterSpec, eff: Efficiency
                     ) -> tuple[float, float]:
    """The step's (``optimizer``, ``offload``) seconds: each the largest of ``_optimizer_s``
    over the stages' (dense, expert) parameters."""
    optimizer = offload = 0.0
    for dense, expert in stage_params:
        opt, off = _optimizer_s(dense, expert, config, train, g, cluster, eff)
        optimizer, offload = max(optimizer, opt), max(offload, off)
    return optimizer, offload


def optimizer_terms_s(workload: Workload, cluster: ClusterSpec, train: TrainSpec,
                      config: ParallelConfig, efficiency: Efficiency = DEFAULT_EFFICIENCY,
                      partition: StagePartition | None = None) -> float:
    """The step's ``optimizer`` and ``offload`` seconds, as ``estimate_step`` prices them
    (``_optimizer_terms``), which no checkpointing changes: with offload the CPU's Adam and the
    transfers over the host link, which the search adds to a candidate's lower bound before it
    prices an offloaded twin (``search.optimize``)."""
    part = partition or even_partition(workload.num_blocks, config.pp, config.virtual_stages)
    params = (_stage_params(workload, part, s, config) for s in range(config.pp))
    return sum(_optimizer_terms(params, config, train, mesh_groups(config, cluster), cluster,
                                efficiency))


def estimate_step(
    workload: Workload,
    cluster: ClusterSpec,
    train: TrainSpec,
    config: ParallelConfig,
    *,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    partition: StagePartition | None = None,
) -> Estimate:
    """Predict one optimizer step of ``workload`` on ``cluster`` under ``config``; the
    workload's strategies must be solved for ``config.tp`` (``Workload.tp``). With a
    ``cluster.profile``, ``Estimate.measured`` says which terms its measurements priced."""
    with recording() as usage:
        est = _priced_step(workload, cluster, train, config, efficiency, partition)
    return replace(est, measured=usage.fractions()) if cluster.profile is not None else est


def exceeds_memory(workload: Workload, cluster: ClusterSpec, train: TrainSpec,
                   config: ParallelConfig, partition: StagePartition | None = None) -> bool:
    """Whether ``estimate_step`` would find some stage's peak over the usable HBM (so the
    estimate does not fit), from the stages' memory alone: no time is priced, and the stages
    most likely over are sized first (the first, which holds the most micro-batches in flight
    and the embedding; the last, with the head and loss), stopping at the first over. The
    search asks this before pricing a candidate that could not enter its kept plans unless
    it fits (``search.optimize``)."""
    m = config.microbatches(train)
    part = partition or even_partition(workload.num_blocks, config.pp, config.virtual_stages)
    policies = config.checkpoint_of(workload.num_blocks)
    g = mesh_groups(config, cluster)
    split = split_of(config, train, workload.seq_len)
    sb = state_bytes_per_param(train.precision, train.optimizer)
    v = config.virtual_stages if config.schedule is Schedule.INTERLEAVED else 1
    usable = float(cluster.usable_hbm_bytes)
    sized: dict[object, _StageSizes] = {}
    for s in dict.fromkeys((0, config.pp - 1, *range(1, config.pp - 1))):
        groups = _stage_groups(workload, part, s, policies)
        signature = _signature(groups, s, config.pp)
        if signature not in sized:
            sized[signature] = _stage_sizes(workload, part, s, groups, split, config,
                                            *_stage_params(workload, part, s, config), train,
                                            sb, g)
        if _stage_memory(sized[signature], s, config, m, v, train).peak_bytes > usable:
            return True
    return False


def _signature(groups: list[tuple[LayerCost, Checkpoint, int]], stage: int, pp: int) -> tuple:
    """What a stage's times and sizes depend on, but for its place in the schedule: its groups
    (``_stage_groups``), and whether it is the last, which holds the tied weights."""
    return tuple((id(layer), p, n) for layer, p, n in groups), stage == pp - 1


def _priced_step(workload: Workload, cluster: ClusterSpec, train: TrainSpec,
                 config: ParallelConfig, efficiency: Efficiency,
                 partition: StagePartition | None) -> Estimate:
    eff = efficiency
    check_world(config, cluster)
    if workload.tp != config.tp:
        raise AutoparError(
            f"the workload records per-op strategies for tp={workload.tp}, the configuration has "
            f"tp={config.tp}", where="tp",
            fix="pass the model (nn.Module) or its GraphIR to autopar.estimate: it solves the "
                "per-op strategies for the configuration's tp")
    m = config.microbatches(train)
    L = workload.num_blocks
    part = partition or even_partition(L, config.pp, config.virtual_stages)
    policies = config.checkpoint_of(L)
    g = mesh_groups(config, cluster)
    split = split_of(config, train, workload.seq_len)
    sb = state_bytes_per_param(train.precision, train.optimizer)

    # Stages of the same blocks under the same policies (the same signature: its groups, and
    # whether it is the last, which holds the tied weights) cost the same: each is priced once
    # per estimate. Not with a profile, whose lookups each note the terms they priced.
    groups = [_stage_groups(workload, part, s, policies) for s in range(config.pp)]
    signatures = [_signature(gr, s, config.pp) if cluster.profile is None else s
                  for s, gr in enumerate(groups)]
    by_signature: dict[object, _StageTime] = {}
    for s in range(config.pp):
        if signatures[s] not in by_signature:
            by_signature[signatures[s]] = _stage_time(workload, groups[s], split, config, g,
                                                      cluster, eff)
    times = [by_signature[sig] for sig in signatures]
    slow = max(range(config.pp), key=lambda s: times[s].total)
    v = config.virtual_stages if config.schedule is Schedule.INTERLEAVED else 1
    _, bubble = pipeline_s(config.schedule, config.pp, m, v, [t.total for t in times])

    # each signature's (dense, expert) parameters, exposed gradient reduction and the
    # optimizer states offload keeps in host memory, and its sizes but for what is in flight
    states: dict[object, tuple[tuple[float, float], float, float]] = {}
    sizes: dict[object, _StageSizes] = {}
    stage_mem = []
    for s in range(config.pp):
        if signatures[s] not in states:
            dense, expert = _stage_params(workload, part, s, config)
            exposed = dp_comm_s(dense, expert, grad_reduce_bytes(train.precision,
                                                                  train.grad_dtype),
                                 _gathered_weight_bytes(workload, part, s, config, train, dense,
                                                        sb.weights),
                                 config, m, times[s].backward + times[s].recompute,
                                 times[s].compute + times[s].recompute, g, cluster, eff)
            held = model_state_bytes(dense, expert, sb, zero=config.zero, dp=g.dp_cp.size,
                                     expert_dp=g.expert_dp.size, offload=False).optimizer \
                if config.offload else 0.0
            states[signatures[s]] = ((dense, expert), exposed, held)
            sizes[signatures[s]] = _stage_sizes(workload, part, s, groups[s], split, config,
                                                dense, expert, train, sb, g)
        stage_mem.append(_stage_memory(sizes[signatures[s]], s, config, m, v, train))
    dp_exposed = max(0.0, *(exposed for _, exposed, _ in states.values()))
    offloaded = max(0.0, *(held for _, _, held in states.values()))
    optimizer_s, offload_s = _optimizer_terms((p for p, _, _ in states.values()), config,
                                              train, g, cluster, eff)

    comm = {k: m * val for k, val in times[slow].comm.items()}
    comm["comm_dp"] = dp_exposed
    breakdown = {"compute": m * times[slow].compute, "recompute": m * times[slow].recompute,
                 **comm, "bubble": bubble, "optimizer": optimizer_s, "offload": offload_s}
    step = sum(breakdown.values())

    fwd = workload.pre.matmul_flop + L * workload.block.matmul_flop + workload.post.matmul_flop
    recomputed = sum(n * _recomputed_flop(workload.block, p)
                     for p, n in Counter(policies).items())
    model_flops = 3 * fwd * train.global_batch
    hw_flops = model_flops + recomputed * train.global_batch
    peak = cluster.gpu.peak(split.compute_dtype) * cluster.num_gpus
    worst = max(stage_mem, key=lambda sm: sm.peak_bytes)
    notes = list(workload.notes) + domain_notes(config, cluster, g) + fp8_notes(workload, split)
    no_rule = {op for layer in (workload.pre, workload.block, workload.post)
               for op in layer.no_rule_ops}
    if no_rule:
        notes.append("ops without a sharding rule, costed as replicated: "
                     + ", ".join(sorted(no_rule)))
    return Estimate(
        config=config,
        step_time_s=step,
        tokens_per_s=train.tokens_per_step / step,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=hw_flops,
        mfu=model_flops / (step * peak),
        hfu=hw_flops / (step * peak),
        peak_memory_bytes=worst.peak_bytes,
        memory_breakdown=dict(worst.breakdown),
        time_breakdown=breakdown,
        usable_memory_bytes=float(cluster.usable_hbm_bytes),
        num_microbatches=m,
        host_memory_bytes=offloaded * cluster.gpus_per_node,
        usable_host_memory_bytes=float(cluster.host_memory_bytes),
        stage_memory=tuple(stage_mem),
        notes=tuple(notes),
    )


