"""The error raised when no candidate fits: the smallest footprint found and what would fit.

The advice is derived from the smallest footprint's memory breakdown alone, so it is an
estimate, and the message says so:

* model states (params, grads, optimizer) on one GPU are the whole model's states divided by how
  each kind is sharded: ``tp * pp`` always, and ``dp * cp`` more for the kinds ZeRO shards
  (optimizer from stage 1, grads from 2, params from 3). Under ZeRO-3 on ``N`` GPUs every kind
  is divided by ``N``, so the states fit when ``total / N`` fits beside the activations and
  buffers: ``N >= total / (usable - activations - buffers)``;
* activations grow with the micro-batch and shrink with full recomputation (only each block's
  input is kept) and with the tensor/context split of the sequence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from autopar.costmodel.cluster import ClusterSpec
from autopar.core.errors import AutoparError
from autopar.core.estimate import Estimate
from autopar.costmodel.memory import ZERO_SHARDS_FROM
from autopar.core.specs import Checkpoint, ParallelConfig, TrainSpec
from autopar.analysis.admissibility import (
    ModelFacts,
    batch_problem,
    context_parallel_problem,
    experts_problem,
    heads_problem,
    stages_problem,
)

GIB = 2**30
STATES = tuple(ZERO_SHARDS_FROM)


class InfeasibleError(AutoparError):
    """No plan fits in memory; ``smallest`` is the candidate with the least peak memory."""

    def __init__(self, what: str, *, where: str = "", fix: str = "",
                 smallest: Estimate | None = None) -> None:
        self.smallest = smallest
        super().__init__(what, where=where, fix=fix)


def infeasible_error(smallest: Estimate | None, cluster: ClusterSpec,
                     constraints: Mapping[str, object], *, train: TrainSpec | None = None,
                     facts: ModelFacts | None = None,
                     refused: Mapping[str, int] | None = None) -> InfeasibleError:
    """Say how far the smallest candidate is from fitting and what would close the gap.

    ``train`` and ``facts``, when given, let the message name the constraint that left no valid
    configuration (a dp the batch does not divide, a tp the heads do not divide); ``refused``
    (the search's ``SpaceStats.refused``) adds the admissibility check's reasons, most frequent
    first.
    """
    where = f"{cluster.name}, {_gpus(cluster)}; constraints: {_constraints(constraints)}"
    if smallest is None:
        problems = constraint_problems(cluster, constraints, train, facts)
        for reason, _ in sorted((refused or {}).items(), key=lambda kv: -kv[1]):
            if reason not in problems:  # the same rules word them the same
                problems.append(reason)
        problems = problems[:4]
        what = "no parallel configuration is valid for this model, cluster and batch"
        if problems:
            return InfeasibleError(f"{what}: {'; '.join(problems)}", where=where,
                                   fix="change or drop the constraints named")
        return InfeasibleError(
            what, where=where,
            fix="relax the constraints, or choose a GPU count and global batch that the "
                "degrees can divide")
    usable = smallest.usable_memory_bytes
    peak = smallest.peak_memory_bytes
    b = smallest.memory_breakdown
    states = sum(b.get(k, 0.0) for k in STATES)
    parts = " + ".join(f"{k} {v / GIB:.1f}" + (" (offloaded)" if k == "optimizer"
                                               and smallest.config.offload else "")
                       for k, v in b.items())
    dominant = ("model states (params, grads, optimizer)", states) \
        if states >= peak - states else ("activations", b.get("activations", 0.0))
    what = (f"no plan fits in memory: the smallest footprint found, {smallest.summary()}, "
            f"needs {peak / GIB:.1f} GiB per GPU but {usable / GIB:.1f} GiB is usable, "
            f"{(peak - usable) / GIB:.1f} GiB short ({parts} GiB; {dominant[0]} are "
            f"{dominant[1] / peak:.0%} of it)")
    fixes = remedies(smallest, cluster, constraints)
    return InfeasibleError(what, where=where, fix="; or ".join(fixes), smallest=smallest)


def remedies(smallest: Estimate, cluster: ClusterSpec,
             constraints: Mapping[str, object]) -> list[str]:
    """Quantified changes that would bring ``smallest`` under the usable memory, the one for
    the dominant kind of memory first."""
    c = smallest.config
    b = smallest.memory_breakdown
    usable = smallest.usable_memory_bytes
    total = total_state_bytes(b, c)
    states = sum(b.get(k, 0.0) for k in STATES)
    rest = smallest.peak_memory_bytes - states  # activations and buffers
    act = b.get("activations", 0.0)
    out: list[str] = []

    def advise(change: str, blocked_by: str) -> None:
        if blocked_by in constraints:
            change = f"relax the constraint {blocked_by}={_value(constraints[blocked_by])}, " \
                     f"then {change}"
        out.append(change)

    if states >= rest:  # model states dominate
        replicas = c.dp * c.cp
        if c.zero < 3 and replicas > 1:
            zero3 = sum(total.values()) / (c.tp * c.pp * replicas) + rest
            advise(f"use ZeRO-3 over the {replicas} dp*cp ranks (about {zero3 / GIB:.1f} GiB "
                   "per GPU, an estimate)", "zero")
        if not c.offload and b.get("optimizer", 0.0) > 0:
            advise(f"offload the optimizer (frees its {b['optimizer'] / GIB:.1f} GiB)", "offload")
        out += _more_gpus(total, rest, usable, cluster, c.offload)
    if c.checkpoint != Checkpoint.FULL:
        advise("use full recomputation (it keeps only each block's input of the "
               f"{act / GIB:.1f} GiB of activations)", "checkpoint")
    if c.micro_batch > 1:
        advise(f"use micro-batch 1 (activations about {act / c.micro_batch / GIB:.1f} GiB "
               f"instead of {act / GIB:.1f})", "micro_batch")
    if states < rest and c.checkpoint == Checkpoint.FULL and c.micro_batch == 1:
        out.append(f"use a larger tp or cp (each divides the {act / GIB:.1f} GiB of "
                   "activations), a shorter sequence, or GPUs with more memory")
    limiting = [k for k in ("dp", "tp", "pp", "cp", "zero") if k in constraints]
    sharded = sum(total.values()) / cluster.num_gpus + rest
    if limiting and sharded <= usable:
        out.append("drop the constraints " + ", ".join(f"{k}={constraints[k]}" for k in limiting)
                   + f": sharded over all {cluster.num_gpus} GPUs the model states would leave "
                     f"about {sharded / GIB:.1f} GiB per GPU (an estimate)")
    return out or ["use GPUs with more memory"]


def _more_gpus(total: Mapping[str, float], rest: float, usable: float, cluster: ClusterSpec,
               offload: bool) -> list[str]:
    """The GPU count at which the model states, divided evenly, fit beside ``rest``."""
    room = usable - rest
    if room <= 0:
        return [f"shrink the activations and buffers ({rest / GIB:.1f} GiB): they alone exceed "
                "the usable memory"]
    need = math.ceil(sum(total.values()) / room)
    if need <= cluster.num_gpus:
        return []
    nodes = math.ceil(need / cluster.gpus_per_node)
    return [f"use at least {need} GPUs ({nodes} nodes of {cluster.gpus_per_node}"
            f"{', with optimizer offload' if offload else ''}; an estimate: the "
            f"{sum(total.values()) / GIB:.0f} GiB of model states shrink as 1/GPUs under ZeRO-3 "
            f"or more tp*pp, beside {rest / GIB:.1f} GiB of activations and buffers)"]


def total_state_bytes(breakdown: Mapping[str, float], c: ParallelConfig) -> dict[str, float]:
    """The whole model's states by kind, undoing the sharding of ``c`` (an estimate: the most
    loaded stage times the stages, tensor-parallel replicated weights counted tp times)."""
    out = {}
    for kind in STATES:
        shards = c.tp * c.pp * (c.dp * c.cp if c.zero >= ZERO_SHARDS_FROM[kind] else 1)
        out[kind] = breakdown.get(kind, 0.0) * shards
    return out


def constraint_problems(cluster: ClusterSpec, constraints: Mapping[str, object],
                        train: TrainSpec | None, facts: ModelFacts | None) -> list[str]:
    """Why the constraints leave no valid configuration, one reason each (may be empty): the
    GPU arithmetic here, the model's through the admissibility rules for the constrained
    degrees."""
    n = cluster.num_gpus
    deg = {k: v for k in ("dp", "tp", "pp", "cp")
           if isinstance(v := constraints.get(k), int) and v > 0}
    out = [f"{k}={v} does not divide the {n} GPUs (divisors: {_divisors(n)})"
           for k, v in deg.items() if n % v]
    product = math.prod(deg.values())
    if not out and len(deg) == 4 and product != n:
        out.append(f"dp*tp*pp*cp = {product} but the cluster has {n} GPUs")
    elif not out and n % product:
        out.append(f"{'*'.join(deg)} = {product} does not divide the {n} GPUs")
    if facts is not None:
        tp, pp, cp = deg.get("tp", 1), deg.get("pp", 1), deg.get("cp", 1)
        ep = constraints.get("ep")
        v = constraints.get("virtual_stages", 1)
        v = v if isinstance(v, int) and v > 0 else 1
        chunks = pp * v
        if v > 1 and "pp" not in deg:  # the pipeline depths left to the search
            depths = [d for d in range(2, n + 1) if n % d == 0 and d * v <= facts.num_blocks]
            if not depths:
                out.append(f"virtual_stages={v} needs pp >= 2 pipeline ranks with {v} model "
                           f"chunks each, at least one block per chunk, and the model has "
                           f"{facts.num_blocks} blocks on {n} GPUs")
            chunks = pp  # the constrained pp (1): its own stages only
        found = [heads_problem(facts, tp), stages_problem(facts, pp, chunks),
                 experts_problem(facts, ep) if isinstance(ep, int) else None,
                 context_parallel_problem(facts, train.seq_len, cp) if train else None]
        out += [p.what for p in found if p is not None]
    if train is not None:
        dp, mb = deg.get("dp"), constraints.get("micro_batch")
        if dp and (problem := batch_problem(train.global_batch, dp)):
            out.append(problem.what)
        elif isinstance(mb, int) and dp and train.global_batch % (dp * mb):
            out.append(f"global batch {train.global_batch} is not a multiple of "
                       f"dp*micro_batch = {dp * mb}")
    return out


def _gpus(cluster: ClusterSpec) -> str:
    nodes = f"{cluster.nodes} node" + ("s" if cluster.nodes != 1 else "")
    return f"{nodes} x {cluster.gpus_per_node} GPUs"


def _constraints(constraints: Mapping[str, object]) -> str:
    if not constraints:
        return "none"
    return ", ".join(f"{k}={_value(v)}" for k, v in constraints.items())


def _value(v: object) -> str:
    if isinstance(v, (tuple, list)):
        return ",".join(str(x) for x in v)
    return str(v)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
