"""``optimize``: the best plan over the search space, by branch and bound on the cost model.

Outer candidates (``space.outer_candidates``) are ordered by a lower bound on their step time:
the compute of the slowest pipeline stage for every micro-batch plus the bubble that compute
implies. Recomputation, communication and the optimizer only add to it, so the bound is valid for
every checkpoint policy. Candidates are priced best-bound first; the search stops when the next
bound exceeds the ``keep``-th best plan found, which cannot lose the optimum. For each priced
candidate the checkpoint policy is chosen as the fastest that fits (none, selective, full), and
offload is tried only when nothing fits without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.compute import Split, estimate_layer_s
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autopar.costmodel.errors import AutoparError
from autopar.costmodel.estimate import Estimate
from autopar.costmodel.memory import activation_bytes_per_element
from autopar.costmodel.pipeline import bubble_fraction, even_partition
from autopar.costmodel.specs import Checkpoint, ParallelConfig, Schedule, TrainSpec
from autopar.costmodel.step import COMPUTE_DTYPE, estimate_step, tp_comm_s
from autopar.costmodel.topology import mesh_groups
from autopar.costmodel.workload import Workload
from autopar.search.space import ModelShape, SpaceStats, outer_candidates

POLICIES = (Checkpoint.NONE, Checkpoint.SELECTIVE, Checkpoint.FULL)


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


WorkloadFor = Callable[[ParallelConfig], Workload]
"""The workload a candidate is priced with: the per-op strategies solved for its tp split."""


def _bound_s(work: Workload, config: ParallelConfig, train: TrainSpec, cluster: ClusterSpec,
             eff: Efficiency, memo: dict[tuple, float]) -> float:
    """Lower bound on the step time: compute and tensor-parallel collectives of the slowest
    stage for every micro-batch, plus the bubble they imply."""
    act = activation_bytes_per_element(train.precision)
    split = Split(config.micro_batch, config.tp, config.cp, config.sequence_parallel, act,
                  COMPUTE_DTYPE[train.precision])
    key = (id(work), split, config.ep > 1, config.tp, config.dp, config.cp, config.pp)
    if key not in memo:
        scale = eff.moe_load_imbalance if config.ep > 1 else 1.0
        groups = mesh_groups(config, cluster)
        # compute plus the tensor-parallel collectives every policy pays at least once
        per = []
        for layer in (work.pre, work.block, work.post):
            t = estimate_layer_s(layer, split, cluster, eff, expert_scale=scale)
            per.append(t.forward + t.backward
                       + tp_comm_s(layer, split, Checkpoint.NONE, groups, cluster, eff))
        memo[key] = tuple(per)  # type: ignore[assignment]
    pre, block, post = memo[key]  # type: ignore[misc]
    part = even_partition(work.num_blocks, config.pp, 1)
    stages = [part.blocks[s] * block + (pre if s == 0 else 0.0)
              + (post if s == config.pp - 1 else 0.0) for s in range(config.pp)]
    m = config.microbatches(train)
    v = config.virtual_stages if config.schedule is Schedule.INTERLEAVED else 1
    slow = max(stages)
    return m * slow * (1 + bubble_fraction(config.schedule, config.pp, m, v))


def _price(work: Workload, cluster: ClusterSpec, train: TrainSpec, config: ParallelConfig,
           eff: Efficiency, fixed_checkpoint: bool) -> tuple[Estimate | None, Estimate]:
    """(fastest fitting estimate or None, smallest estimate) over the checkpoint policies."""
    policies = [config.checkpoint] if fixed_checkpoint else list(POLICIES)
    fitting: Estimate | None = None
    smallest: Estimate | None = None
    seen_memory: set[float] = set()
    for policy in policies:
        est = estimate_step(work, cluster, train, config.with_(checkpoint=policy),
                            efficiency=eff)
        if est.peak_memory_bytes in seen_memory:
            continue  # the same plan under another name (selective without s^2 activations)
        seen_memory.add(est.peak_memory_bytes)
        if smallest is None or est.peak_memory_bytes < smallest.peak_memory_bytes:
            smallest = est
        if est.fits and (fitting is None or est.step_time_s < fitting.step_time_s):
            fitting = est
    assert smallest is not None
    return fitting, smallest


def search(work: Workload | WorkloadFor, shape: ModelShape, cluster: ClusterSpec,
           train: TrainSpec, constraints: Mapping[str, object] | None = None, *, keep: int = 4,
           efficiency: Efficiency = DEFAULT_EFFICIENCY,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Branch and bound over the outer candidates; see the module docstring. ``work`` is one
    workload for every candidate, or a function giving each candidate its own (the per-op
    strategies solved for its tp split)."""
    workload_for: WorkloadFor = work if callable(work) else (lambda _c, w=work: w)
    t0 = time.perf_counter()
    constraints = dict(constraints or {})
    stats = SpaceStats()
    memo: dict[tuple, float] = {}
    bounded = []
    for config in outer_candidates(cluster.num_gpus, shape, train, constraints, stats):
        try:
            w = workload_for(config)
            bounded.append((_bound_s(w, config, train, cluster, efficiency, memo), config))
        except AutoparError:
            stats.prune("invalid")
    # deterministic order: bound, then the config's own field order
    bounded.sort(key=lambda bc: (bc[0], tuple(str(v) for v in bc[1].to_dict().values())))
    best: list[Estimate] = []
    smallest: Estimate | None = None
    fixed_ckpt = "checkpoint" in constraints
    priced = 0
    for i, (bound, config) in enumerate(bounded):
        if len(best) >= keep and bound >= best[keep - 1].step_time_s:
            stats.prune("bound")
            continue
        priced += 1
        if progress is not None and priced % 25 == 0:
            progress(i, len(bounded))
        w = workload_for(config)
        fit, small = _price(w, cluster, train, config, efficiency, fixed_ckpt)
        if fit is None and "offload" not in constraints:
            fit, small_off = _price(w, cluster, train, config.with_(offload=True),
                                    efficiency, fixed_ckpt)
            if small_off.peak_memory_bytes < small.peak_memory_bytes:
                small = small_off
        if smallest is None or small.peak_memory_bytes < smallest.peak_memory_bytes:
            smallest = small
        if fit is not None:
            best.append(fit)
            best.sort(key=lambda e: (e.step_time_s, e.peak_memory_bytes))
            del best[keep:]
    return SearchResult(tuple(best), None if best else smallest, stats, priced,
                        time.perf_counter() - t0)
