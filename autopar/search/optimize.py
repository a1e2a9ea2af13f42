"""``search``: the best plan over the search space, by branch and bound on the cost model.

Outer candidates (``space.outer_candidates``) are ordered by a lower bound on their step time:
the compute and tensor-parallel collectives of the slowest pipeline stage for every micro-batch,
plus the bubble they imply. Recomputation, the other communication and the optimizer only add to
it, so the bound holds for every checkpoint choice. Candidates are priced best-bound first; the
search stops when the next bound exceeds the ``keep``-th best plan found, which cannot lose the
optimum.

Each candidate is priced with its own workload (the per-op strategies solved for its tp split,
``tp_solve``) and two inner decisions:

* **Stage boundaries** (1F1B and GPipe): blocks per stage balance the stages' compute, the
  first stage also running the embedding and the last the head and loss
  (``pipeline.balanced_partition``); the interleaved schedule needs equal chunks. The bound
  uses the same boundaries, so it stays a bound.
* **Checkpointing, block by block.** With the block's strategies tied, every recomputed block
  of a stage saves the same bytes and costs the same time, so the choice is how many blocks of
  each stage to recompute, not which. No recomputation when that fits (it only adds time);
  otherwise uniform selective (Korthikanti et al.'s: the eager attention core recomputed),
  uniform matmuls, uniform moe (the MoE layers recomputed; for a model with MoE layers the
  engine can checkpoint, ``partial_policies``), uniform full, and the mixes "k blocks full, the
  rest none", "... the rest selective", "... the rest matmuls" and "... the rest moe" with
  the fewest full blocks per stage that fit (found
  from the uniform policies' stage memory, which is linear in k, then checked by pricing the
  mix). A partial policy is tried only where it keeps less than ``none`` (selective with fused
  attention keeps the same).
  The fastest that fits wins; with nothing fitting, optimizer offload is tried.

**Tensor parallelism inside an NVLink domain first.** Candidates whose tp group fits in one
NVLink domain (``ClusterSpec.domain_gpus``: a node, or GB200 NVL72's 72 GPUs) are bounded and
priced first; those whose tp group spans domains (every layer's tp collectives over the
network) only when fewer than ``keep`` plans fit among the others, or when the constraints
leave nothing else (``--tp 16`` on 8-GPU nodes). On the search-time bench set none of them was
among the kept plans (checked 2026-11-28), while their strategy solves were most of
DeepSeek-V3's solve time there (8 of its 14 tp splits on 256 GPUs:
``bench/results/search.md``).
The count skipped is ``SpaceStats.pruned["tp over the network"]``.

**Memory and floors before time.** Once a plan fits, the search no longer needs the smallest
footprint (it reports that only when nothing fits), so a candidate (or offloaded twin) whose
stages do not fit with the choice that keeps the least (full recomputation, with two or more
blocks a stage) is dropped from its stages' memory alone, before any time is priced
(``step.exceeds_memory``; ``SpaceStats.pruned["memory"]``); most candidates of a large model
end there. Once ``keep`` plans fit, a candidate about to be priced is first given a floor, a
closer and dearer lower bound than the one it was ordered by: the bound's stage times plus the
context-parallel and pipeline transfers every policy issues, through the schedule, plus the
data-parallel communication left exposed under the most compute a policy can add and the
optimizer (``step.floor_terms_s``). A candidate that fits but whose floor is slower than the
last kept plan is dropped (``pruned["floor"]``; its offloaded twin, tried only for candidates
that do not fit, is not tried either), and so is an offloaded twin whose floor is
(``pruned["bound with offload"]``). Inside a candidate that is priced, a partial policy or a
mix with full whose floor with its own recomputation (``step.stage_recompute_s``) is slower
is not priced either, nor are the mixes that recompute more (not under ``async_tp``, whose
collectives also hide under recomputed GEMMs). The order of pricing, and so every plan kept,
is the bound's as before.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import groupby
from typing import NamedTuple

from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autopar.core.errors import AutoparError
from autopar.core.estimate import Estimate
from autopar.costmodel.moe import ep_comm_s
from autopar.costmodel.pipeline import (
    StagePartition,
    balanced_partition,
    even_partition,
    pipeline_s,
)
from autopar.core.specs import (ASYNC_TP, EP_A2A_OVERLAP, Checkpoint, ParallelConfig, Schedule,
                                 TrainSpec)
from autopar.costmodel.step import (estimate_step, exceeds_memory, floor_terms_s,
                                    layer_compute_s, optimizer_terms_s, split_of,
                                    stage_recompute_s, tp_comm_s, tp_gemm_s)
from autopar.costmodel.topology import mesh_groups
from autopar.costmodel.workload import Workload
from autopar.analysis.admissibility import ModelFacts, matmuls_runs
from autopar.search.space import SpaceStats, outer_candidates

POLICIES = (Checkpoint.NONE, Checkpoint.SELECTIVE, Checkpoint.MATMULS, Checkpoint.MOE,
            Checkpoint.FULL)


def partial_policies(facts: ModelFacts, config: ParallelConfig | None = None
                     ) -> tuple[Checkpoint, ...]:
    """The policies between ``none`` and ``full`` the search tries for the model of ``facts``:
    selective and matmuls, and moe where it has MoE layers the engine can checkpoint
    (``admissibility.moe_problem``); of a candidate ``config``, not matmuls where the engine
    cannot run it there (``admissibility.matmuls_runs``)."""
    moe = bool(facts.num_experts) and facts.moe_modules_refused is None
    matmuls = config is None or matmuls_runs(facts, config)
    return ((Checkpoint.SELECTIVE,) + ((Checkpoint.MATMULS,) if matmuls else ())
            + ((Checkpoint.MOE,) if moe else ()))


@dataclass(frozen=True)
class SearchResult:
    """The priced plans, best first, and how the search went."""

    best: tuple[Estimate, ...]
    """Fitting estimates, fastest first (the winner and its runner-ups)."""
    smallest: Estimate | None
    """When nothing fits: the candidate with the least peak memory."""
    stats: SpaceStats
    priced: int
    wall_s: float
    gap: float = 0.0
    """When the time limit stopped the search: (best - least bound not priced) / best."""


def partition_of(work: Workload, config: ParallelConfig, pre_s: float, block_s: float,
                 post_s: float) -> StagePartition:
    """Stage boundaries: balanced for 1F1B and GPipe, equal chunks for the interleaved
    schedule."""
    if config.schedule is Schedule.INTERLEAVED or config.pp == 1:
        return even_partition(work.num_blocks, config.pp, config.virtual_stages)
    return balanced_partition(work.num_blocks, config.pp, block_s, pre_s, post_s)


def simplicity(config: ParallelConfig) -> tuple:
    """Breaks exact ties between candidates towards the plan with fewer moving parts: no
    context split, fewer stages, less tensor parallelism, the lower ZeRO stage."""
    return (config.cp, config.pp, config.tp, config.ep, config.zero, config.virtual_stages,
            config.offload, config.sequence_parallel)


WorkloadFor = Callable[[ParallelConfig], Workload]
"""The workload a candidate is priced with: the per-op strategies solved for its tp split."""


def stage_partition(work: Workload, config: ParallelConfig, train: TrainSpec,
                    cluster: ClusterSpec, efficiency: Efficiency) -> StagePartition:
    """The stage boundaries the search prices ``config`` with (the bound's, ``_bound_s``):
    ``estimate`` and ``plan_for`` cut a given configuration the same way."""
    return _bound_s(work, config, train, cluster, efficiency, {})[1]


def _bound_s(work: Workload, config: ParallelConfig, train: TrainSpec, cluster: ClusterSpec,
             eff: Efficiency, memo: dict[tuple, float]) -> tuple[float, StagePartition]:
    """Lower bound on the step time: compute, tensor-parallel collectives and the exposed
    expert-parallel all-to-alls of the slowest stage for every micro-batch, plus the bubble
    they imply (``_stage_bounds``)."""
    stages, part = _stage_bounds(work, config, train, cluster, eff, memo)
    return _through_schedule(config, train, stages), part


def _through_schedule(config: ParallelConfig, train: TrainSpec, stage_s: list[float]) -> float:
    """Busy plus bubble seconds of a step whose stages take ``stage_s`` a micro-batch
    (``pipeline_s``), which no stage taking longer makes shorter."""
    v = config.virtual_stages if config.schedule is Schedule.INTERLEAVED else 1
    busy, bubble = pipeline_s(config.schedule, config.pp, config.microbatches(train), v,
                              stage_s)
    return busy + bubble


class Floor(NamedTuple):
    """What every checkpoint choice of a candidate pays at least (``floor_of``)."""

    stage_s: list[float]
    """Each stage's seconds a micro-batch: its bound's (``_stage_bounds``), and the transfers
    every policy issues there."""
    step_s: dict[bool, float]
    """Per step, by offload (the twin's where asked, with its own optimizer and offload
    terms): the exposed data-parallel communication and the optimizer."""


def floor_of(work: Workload, config: ParallelConfig, train: TrainSpec, cluster: ClusterSpec,
             eff: Efficiency, stage_s: list[float], part: StagePartition | None,
             twin: bool) -> Floor:
    """What every checkpoint choice of ``config`` (and, with ``twin``, of its offloaded twin)
    pays at least beyond each stage's bound time ``stage_s`` (``step.floor_terms_s``: the
    context-parallel and pipeline transfers, the exposed data-parallel communication, the
    optimizer); the twin's with its own optimizer and offload terms
    (``step.optimizer_terms_s``), offload changing nothing else of them."""
    per_stage, comm_dp, optimizer = floor_terms_s(work, cluster, train, config, eff, part)
    offloaded = optimizer_terms_s(work, cluster, train, config.with_(offload=True), eff,
                                  part) if twin else None
    steps = {config.offload: comm_dp + optimizer}
    if offloaded is not None:
        steps[True] = comm_dp + offloaded
    return Floor([b + f for b, f in zip(stage_s, per_stage)], steps)


def _floor_s(floor: Floor, config: ParallelConfig, train: TrainSpec, offload: bool = False,
             recompute_s: tuple[float, ...] | None = None) -> float:
    """A lower bound on the step time of every checkpoint choice of ``config`` (``offload``:
    of its offloaded twin), closer than ``_bound_s`` and dearer, so asked only of a candidate
    about to be priced while ``keep`` plans are kept: ``floor``'s stage times through the
    schedule, plus its step's. With ``recompute_s`` (each stage's recomputation under one
    choice, ``step.stage_recompute_s``) of that choice, and of any that recomputes more in
    every block (full in more of them): a stage's time is at least its floor plus what it
    recomputes, its collectives being at least ``none``'s -- not under ``async_tp``, whose
    collectives also hide under the recomputed GEMMs (``_recompute_floors``)."""
    stages = floor.stage_s if recompute_s is None else [
        f + r for f, r in zip(floor.stage_s, recompute_s)]
    return _through_schedule(config, train, stages) + floor.step_s[offload]


def _stage_bounds(work: Workload, config: ParallelConfig, train: TrainSpec,
                  cluster: ClusterSpec, eff: Efficiency, memo: dict[tuple, float]
                  ) -> tuple[list[float], StagePartition]:
    """Each stage's least seconds a micro-batch, and the stage boundaries: its compute,
    tensor-parallel collectives and exposed expert-parallel all-to-alls. Every policy issues
    at least ``none``'s all-to-alls; with them overlapped (``ep_a2a_overlap``) at least
    ``1 - Efficiency.ep_overlap`` of them stay exposed, whatever compute runs beside them
    (``costmodel/moe.py``)."""
    split = split_of(config, train, work.seq_len)
    overlap = ASYNC_TP in config.fusions and config.tp > 1
    groups = mesh_groups(config, cluster)
    # what the layers' terms read: the split, the tp and expert groups, the fusions
    key = (id(work), split, groups.tp, groups.ep, groups.etp, overlap, config.fusions)
    if key not in memo:
        # compute plus the tensor-parallel collectives every policy pays at least once
        per = []
        plain = (config.with_(fusions=tuple(f for f in config.fusions if f != EP_A2A_OVERLAP))
                 if EP_A2A_OVERLAP in config.fusions else config)
        for layer in (work.pre, work.block, work.post):
            # the busiest rank's load, as the estimate prices it (``step._layer_time``)
            scale = (eff.moe_load_imbalance if config.ep > 1 and layer.ep_dropless else 1.0)
            t = layer_compute_s(layer, split, cluster, eff, scale)
            gemm = (tp_gemm_s(layer, split, Checkpoint.NONE, cluster, eff) if overlap
                    else None)
            a2a = ep_comm_s(layer, split, Checkpoint.NONE, plain, groups, cluster, eff, 0.0)
            if EP_A2A_OVERLAP in config.fusions:
                a2a *= 1.0 - eff.ep_overlap
            per.append(t.forward + t.backward + a2a
                       + tp_comm_s(layer, split, Checkpoint.NONE, groups, cluster, eff,
                                   overlapped_gemm_s=gemm))
        memo[key] = tuple(per)  # type: ignore[assignment]
    pre, block, post = memo[key]  # type: ignore[misc]
    part = partition_of(work, config, pre, block, post)
    stages = [part.blocks[s] * block + (pre if s == 0 else 0.0)
              + (post if s == config.pp - 1 else 0.0) for s in range(config.pp)]
    return stages, part


def _estimate(work: Workload, cluster: ClusterSpec, train: TrainSpec, config: ParallelConfig,
              eff: Efficiency, part: StagePartition | None) -> Estimate:
    return estimate_step(work, cluster, train, config, efficiency=eff, partition=part)


def _mixed(policies: tuple[Checkpoint, ...], base: Checkpoint, rest: Estimate, full: Estimate,
           usable: float, part: StagePartition, extra: tuple[int, ...] = ()
           ) -> tuple[Checkpoint, ...] | None:
    """Per-block policies: in each stage the fewest blocks under FULL (the rest ``base``) for
    the stage's memory, interpolated linearly between all-``base`` and all-FULL, to fit;
    ``extra`` adds blocks per stage after a failed check. None when it equals a uniform one."""
    out = list(policies)
    any_full = False
    for s, (mem_rest, mem_full) in enumerate(zip(rest.stage_memory, full.stage_memory)):
        b = part.blocks[s]
        need = mem_rest.peak_bytes - usable
        saving = mem_rest.peak_bytes - mem_full.peak_bytes
        k = 0 if need <= 0 else (b if saving <= 0 else min(b, math.ceil(b * need / saving)))
        k = min(b, k + (extra[s] if extra else 0))
        first = part.first_block(s)
        for j in range(b):
            out[first + j] = Checkpoint.FULL if j < k else base
        any_full |= k > 0
    mixed = tuple(out)
    if not any_full or all(p is Checkpoint.FULL for p in mixed):
        return None
    return mixed


def _price(work: Workload, cluster: ClusterSpec, train: TrainSpec, config: ParallelConfig,
           eff: Efficiency, fixed_checkpoint: bool, part: StagePartition | None,
           partials: tuple[Checkpoint, ...] = (Checkpoint.SELECTIVE, Checkpoint.MATMULS),
           too_slow: TooSlow | None = None) -> tuple[Estimate | None, Estimate]:
    """(fastest fitting estimate or None, smallest estimate) over the checkpoint choices:
    ``none``, ``full``, the ``partials`` (``partial_policies``) and their mixes with ``full``.
    A partial or a mix that ``too_slow`` (``_recompute_floors``) finds slower than the kept
    plans is not priced, nor are the mixes that recompute more than it: the fastest one left
    enters the kept plans exactly when the fastest of all would."""
    if fixed_checkpoint:
        est = _estimate(work, cluster, train, config, eff, part)
        return (est if est.fits else None), est
    full = _estimate(work, cluster, train, config.with_(checkpoint=Checkpoint.FULL), eff, part)
    if not full.fits and _least_kept_by_full(work, config):
        return None, full
    none = _estimate(work, cluster, train, config.with_(checkpoint=Checkpoint.NONE), eff, part)
    if none.fits:
        return none, none  # recomputation only adds time
    if not full.fits:
        return None, min(full, none, key=lambda e: e.peak_memory_bytes)
    fitting = [full]
    bases = [(Checkpoint.NONE, none)]
    for policy in partials:
        if too_slow is not None and too_slow((policy,) * work.num_blocks):
            continue  # nor can its mixes with full, which recompute more
        partial = _estimate(work, cluster, train, config.with_(checkpoint=policy), eff, part)
        if partial.peak_memory_bytes < none.peak_memory_bytes:  # it drops something
            if partial.fits:
                fitting.append(partial)
            bases.append((policy, partial))
    partition = part or even_partition(work.num_blocks, config.pp, config.virtual_stages)
    usable = float(cluster.usable_hbm_bytes)
    uniform = none.config.checkpoint_of(work.num_blocks)
    for base, rest in bases:
        extra: tuple[int, ...] = ()
        for _ in range(3):  # the interpolation can miss by the recompute working set
            policies = _mixed(uniform, base, rest, full, usable, partition, extra)
            if policies is None or (too_slow is not None and too_slow(policies)):
                break  # a retry only recomputes more
            est = _estimate(work, cluster, train, config.with_(checkpoint=policies), eff, part)
            if est.fits:
                fitting.append(est)
                break
            extra = tuple((e if extra else 0) + (1 if sm.peak_bytes > usable else 0)
                          for e, sm in zip(extra or (0,) * config.pp, est.stage_memory))
    best = min(fitting, key=lambda e: (e.step_time_s, e.peak_memory_bytes))
    return best, full


def _least_kept_by_full(work: Workload, config: ParallelConfig) -> bool:
    """Whether full recomputation keeps the least of every checkpoint choice: with two or more
    blocks a stage (it keeps the inputs, plus one block's activations while it is recomputed),
    so when it does not fit, nothing does; most candidates of a large model end there."""
    return work.num_blocks >= 2 * config.pp


def _fits_at_all(work: Workload, cluster: ClusterSpec, train: TrainSpec,
                 config: ParallelConfig, fixed_checkpoint: bool, part: StagePartition | None
                 ) -> bool | None:
    """Whether some checkpoint choice of ``config`` fits in the HBM, told from the stages'
    memory alone (``step.exceeds_memory``) of the choice that keeps the least: the fixed one,
    or full recomputation (``_least_kept_by_full``); None where that cannot be told without
    pricing."""
    if fixed_checkpoint:
        return not exceeds_memory(work, cluster, train, config, part)
    if not _least_kept_by_full(work, config):
        return None
    return not exceeds_memory(work, cluster, train, config.with_(checkpoint=Checkpoint.FULL),
                              part)


def _candidate(w: Workload, config: ParallelConfig, part: StagePartition | None,
               cluster: ClusterSpec, train: TrainSpec, eff: Efficiency, stage_s: list[float],
               stats: SpaceStats, fixed_checkpoint: bool, partials: tuple[Checkpoint, ...],
               twin: bool, fitted: bool, slowest: float | None
               ) -> tuple[Estimate | None, Estimate | None]:
    """(fastest fitting estimate or None, smallest estimate) of a candidate and, where it does
    not fit, of its offloaded twin (``twin``: offload is free); (None, None) when neither was
    priced. Once a plan fits (``fitted``) what cannot fit is not priced (``_fits_at_all``),
    and once ``keep`` plans are kept neither is what is ``slowest`` than the last of them by its
    floor (``_floor_s``), nor a checkpoint choice by its own (``_recompute_floors``); each
    skipped candidate is counted in ``stats.pruned``."""
    floor = (floor_of(w, config, train, cluster, eff, stage_s, part, twin)
             if slowest is not None else None)
    too_slow = floor is not None and _floor_s(floor, config, train, config.offload) > slowest
    twin_too_slow = twin and floor is not None and _floor_s(floor, config, train, True) > slowest
    # too slow fitting or not: with offload too, or with no twin to try
    if too_slow and (not twin or twin_too_slow):
        stats.prune(FLOOR)
        return None, None
    fit = small = None
    fits = _fits_at_all(w, cluster, train, config, fixed_checkpoint, part) if fitted else None
    if fits is False:
        stats.prune(OVER_MEMORY)
    elif fits and too_slow:
        stats.prune(FLOOR)  # and it fits: its offloaded twin is not tried either
        return None, None
    else:
        fit, small = _price(w, cluster, train, config, eff, fixed_checkpoint, part, partials,
                            _recompute_floors(w, config, train, cluster, eff, part, floor,
                                              config.offload, slowest))
    if fit is not None or not twin:
        return fit, small
    offloaded = config.with_(offload=True)
    # the offloaded twin pays its CPU optimizer step and host transfers on top
    if twin_too_slow:
        stats.prune("bound with offload")
    elif fitted and _fits_at_all(w, cluster, train, offloaded, fixed_checkpoint,
                                 part) is False:
        stats.prune(OVER_MEMORY)
    else:
        fit, small_off = _price(w, cluster, train, offloaded, eff, fixed_checkpoint, part,
                                partials, _recompute_floors(w, config, train, cluster, eff, part,
                                                            floor, True, slowest))
        small = min((e for e in (small, small_off) if e is not None),
                    key=lambda e: e.peak_memory_bytes)
    return fit, small


TooSlow = Callable[[tuple[Checkpoint, ...]], bool]
"""Whether a checkpoint choice (a policy per block) of a candidate, and any that recomputes
more in every block, is slower than the kept plans (``_recompute_floors``)."""


def _recompute_floors(w: Workload, config: ParallelConfig, train: TrainSpec,
                      cluster: ClusterSpec, eff: Efficiency, part: StagePartition | None,
                      floor: Floor | None, offload: bool, slowest: float | None
                      ) -> TooSlow | None:
    """``_price``'s test of a checkpoint choice against the kept plans: its floor with each
    stage's recomputation (``_floor_s``) slower than ``slowest``; None where there is no
    floor, or under ``async_tp`` (whose collectives hide under recomputed GEMMs too)."""
    if floor is None or slowest is None or (ASYNC_TP in config.fusions and config.tp > 1):
        return None

    def too_slow(policies: tuple[Checkpoint, ...]) -> bool:
        recompute = stage_recompute_s(w, cluster, train, config, policies, eff, part)
        return _floor_s(floor, config, train, offload, recompute) > slowest
    return too_slow


OVER_MEMORY = "memory"
"""Why a candidate or its offloaded twin went unpriced once a plan fits: its stages' memory
alone, with the checkpoint choice that keeps the least, exceeds the usable HBM
(``_fits_at_all``)."""
FLOOR = "floor"
"""Why a candidate that fits went unpriced once ``keep`` plans are kept: its floor
(``_floor_s``) is slower than the last of them."""
FAR_TP = "tp over the network"
"""Why a candidate whose tp group spans NVLink domains went unpriced (``search``)."""


class Bounded(NamedTuple):
    """A candidate with its lower bound (``_bound_s``) and what the bound was made of."""

    bound_s: float
    config: ParallelConfig
    part: StagePartition
    stage_s: list[float]
    """Each stage's bound seconds a micro-batch (``_stage_bounds``)."""
    work: Workload
    """Its workload (``WorkloadFor``)."""


def _bounded(configs: list[ParallelConfig], workload_for: WorkloadFor, train: TrainSpec,
             cluster: ClusterSpec, eff: Efficiency, memo: dict[tuple, float], stats: SpaceStats
             ) -> list[Bounded]:
    """``configs`` with their bounds, best bound first (ties: the simpler, then the config's
    own field order, so the order is deterministic); a candidate the cost model or the engine
    cannot run is counted in ``stats.refused``."""
    bounded = []
    for config in configs:
        try:
            w = workload_for(config)
            stages, part = _stage_bounds(w, config, train, cluster, eff, memo)
            bounded.append(Bounded(_through_schedule(config, train, stages), config, part,
                                   stages, w))
        except AutoparError as err:
            stats.refused[err.what] = stats.refused.get(err.what, 0) + 1
    bounded.sort(key=lambda b: (b.bound_s, simplicity(b.config)))
    # candidates tied on both (few): in the config's own field order, written out for them only
    ordered = []
    for _, tied in groupby(bounded, key=lambda b: (b.bound_s, simplicity(b.config))):
        group = list(tied)
        ordered += group if len(group) == 1 else sorted(group, key=lambda b: tuple(
            str(v) for v in b.config.to_dict().values()))
    return ordered


BOUND_MARGIN = 1e-9
"""Relative slack on a floor (``_floor_s``): one equal to a kept plan's time up to rounding is
priced."""


def search(work: Workload | WorkloadFor, facts: ModelFacts, cluster: ClusterSpec,
           train: TrainSpec, constraints: Mapping[str, object] | None = None, *, keep: int = 4,
           efficiency: Efficiency = DEFAULT_EFFICIENCY,
           progress: Callable[[int, int], None] | None = None,
           time_limit_s: float | None = None) -> SearchResult:
    """Branch and bound over the outer candidates; see the module docstring. ``work`` is one
    workload for every candidate, or a function giving each candidate its own (the per-op
    strategies solved for its tp split)."""
    workload_for: WorkloadFor = work if callable(work) else (lambda _c, w=work: w)
    t0 = time.perf_counter()
    constraints = dict(constraints or {})
    stats = SpaceStats()
    memo: dict[tuple, float] = {}
    near: list[ParallelConfig] = []
    far: list[ParallelConfig] = []
    for config in outer_candidates(cluster.num_gpus, facts, train, constraints, stats):
        (far if config.tp > cluster.domain_gpus else near).append(config)
    gap = 0.0
    best: list[Estimate] = []
    smallest: Estimate | None = None
    fixed_ckpt = "checkpoint" in constraints
    priced = 0
    timed_out = False
    for tier in (near, far):
        if timed_out:
            break
        if tier is far and len(best) >= keep:
            if far:
                stats.pruned[FAR_TP] = len(far)
            break
        bounded = _bounded(tier, workload_for, train, cluster, efficiency, memo, stats)
        for i, (bound, config, part, stage_s, w) in enumerate(bounded):
            if len(best) >= keep and bound >= best[keep - 1].step_time_s:
                # sorted by bound: every later candidate is bounded out too
                stats.pruned["bound"] = stats.pruned.get("bound", 0) + len(bounded) - i
                break
            if time_limit_s is not None and best and time.perf_counter() - t0 > time_limit_s:
                gap = max(0.0, (best[0].step_time_s - bound) / best[0].step_time_s)
                stats.pruned["time limit"] = len(bounded) - i + (len(far) if tier is near else 0)
                timed_out = True
                break
            if progress is not None and i % 25 == 24:
                progress(i, len(bounded))
            part = part if config.pp > 1 else None
            # with ``keep`` plans kept, one slower than the last of them cannot enter
            slowest = (best[keep - 1].step_time_s * (1.0 + BOUND_MARGIN) if len(best) >= keep
                       else None)
            fit, small = _candidate(w, config, part, cluster, train, efficiency, stage_s, stats,
                                    fixed_ckpt, partial_policies(facts, config),
                                    "offload" not in constraints,
                                    bool(best), slowest)
            if small is None:
                continue  # nothing priced
            priced += 1
            if smallest is None or small.peak_memory_bytes < smallest.peak_memory_bytes:
                smallest = small
            if fit is not None:
                best.append(fit)
                best.sort(key=lambda e: (e.step_time_s, simplicity(e.config), e.peak_memory_bytes))
                del best[keep:]
    if progress is not None:
        progress(len(bounded), len(bounded))
    return SearchResult(tuple(best), None if best else smallest, stats, priced,
                        time.perf_counter() - t0, gap)
