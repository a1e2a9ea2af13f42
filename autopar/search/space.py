"""The search space as data: every outer decision, its candidate values, and the pruning rules.

``outer_candidates`` enumerates the decisions taken outside the per-candidate ILP: the mesh
(dp x tp x pp x cp; ep over the experts' mesh, folded over dp x cp x tp under sequence
parallelism, ``core.mesh``), the micro-batch size, the pipeline schedule and its
chunks, ZeRO stage, sequence parallelism and offload. ``constraints`` (any ``ParallelConfig``
field) fix a decision; the checkpoint policy, per-op strategies and stage boundaries are left to
the inner solve.

Pruning rules, each with why it cannot lose the optimum under the cost model:

* ``gpipe``: GPipe has 1F1B's bubble and compute but keeps every micro-batch in flight, so it is
  never faster and never smaller (Narayanan et al.; ``costmodel.pipeline``).
* ``zero0``: with data parallelism, ZeRO-1 reduces gradients with a reduce-scatter plus an
  all-gather, the volume of ZeRO-0's all-reduce, and keeps 1/dp of the optimizer states: same
  time, less memory.
* ``no-sp``: with tp > 1, sequence parallelism replaces each all-reduce by a reduce-scatter and an
  all-gather of the same volume and divides the norm/dropout work and activations by tp: never
  slower, never larger.
* ``offload``: offloading the optimizer only adds transfers and a CPU step; it is tried only for
  a candidate that does not fit without it (the search does that, not this module).

Everything else here is validity, not pruning: degrees must divide the GPU count and the
micro-batch the per-replica batch, tp = 1 with the fused loss (``linear_cross_entropy``
computes every logit on one GPU; ``ParallelConfig`` refuses it with tp > 1), and every
candidate must pass the one admissibility check (``autopar.analysis.admissibility.problems``: heads,
stages, sequence under sequence and context parallelism, experts, micro-batches against the
schedule). Its rules are called here, not restated; the reasons of the candidates it refuses are
counted in ``SpaceStats.refused``, so that an empty space can say why. Where sequence
parallelism cannot split the sequence (tp does not divide it), the space offers the candidate
without it instead: planning around it, never a plan that cannot run.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from autopar.analysis.admissibility import (
    ModelFacts,
    Problem,
    batch_problem,
    context_parallel_problem,
    heads_problem,
    problems,
    sequence_parallel_problem,
    stages_problem,
)
from autopar.core.errors import AutoparError
from autopar.core.specs import ASYNC_TP, ParallelConfig, Schedule, TrainSpec, check_field

MICRO_BATCHES = (1, 2, 4, 8, 16)
"""Micro-batch sizes tried (those dividing the per-replica batch)."""
MAX_VIRTUAL_STAGES = 8
"""Most model chunks per pipeline rank tried by the interleaved schedule."""
FIELDS = frozenset(ParallelConfig.__dataclass_fields__)


@dataclass
class SpaceStats:
    enumerated: int = 0
    pruned: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    """Candidates the admissibility check refused, by reason."""

    def prune(self, rule: str) -> None:
        self.pruned[rule] = self.pruned.get(rule, 0) + 1

    def refuse(self, problem: Problem | None) -> bool:
        """Count ``problem`` (if any) as a refusal; True when there was one."""
        if problem is None:
            return False
        self.refused[problem.what] = self.refused.get(problem.what, 0) + 1
        return True

    @property
    def total_pruned(self) -> int:
        return sum(self.pruned.values())


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_constraints(constraints: Mapping[str, object]) -> None:
    """Unknown fields and values no configuration can have are errors, not empty searches."""
    for key in constraints:
        if key not in FIELDS:
            raise AutoparError(f"unknown constraint {key!r}", where="constraints",
                               fix=f"use ParallelConfig fields: {', '.join(sorted(FIELDS))}")
    for key, value in constraints.items():
        check_field(key, value)


def _allowed(values: list[int], key: str, constraints: Mapping[str, object]) -> list[int]:
    if key in constraints:
        return [v for v in values if v == constraints[key]]
    return values


def meshes(num_gpus: int, facts: ModelFacts, train: TrainSpec,
           constraints: Mapping[str, object], stats: SpaceStats | None = None
           ) -> Iterator[tuple[int, int, int, int]]:
    """Valid (dp, tp, pp, cp) with dp*tp*pp*cp = num_gpus."""
    stats = stats if stats is not None else SpaceStats()
    for tp in _allowed(divisors(num_gpus), "tp", constraints):
        if stats.refuse(heads_problem(facts, tp)):
            continue
        if constraints.get("sequence_parallel") and tp == 1:
            continue  # sequence parallelism splits over the tp ranks
        if tp > 1 and "linear_cross_entropy" in (constraints.get("fusions") or ()):
            continue  # the fused loss needs the whole vocabulary on one GPU
        if tp == 1 and ASYNC_TP in (constraints.get("fusions") or ()):
            continue  # it overlaps tensor-parallel collectives
        rest = num_gpus // tp
        for pp in _allowed(divisors(rest), "pp", constraints):
            if stats.refuse(stages_problem(facts, pp, pp)):
                continue
            for cp in _allowed(divisors(rest // pp), "cp", constraints):
                if stats.refuse(context_parallel_problem(facts, train.seq_len, cp)):
                    continue
                dp = rest // (pp * cp)
                if "dp" in constraints and constraints["dp"] != dp:
                    continue
                if stats.refuse(batch_problem(train.global_batch, dp)):
                    continue
                yield dp, tp, pp, cp


def outer_candidates(num_gpus: int, facts: ModelFacts, train: TrainSpec,
                     constraints: Mapping[str, object] | None = None,
                     stats: SpaceStats | None = None) -> Iterator[ParallelConfig]:
    """Every outer candidate, with the checkpoint policy set from the constraints or ``none``
    (the inner solve decides it). Every candidate passes ``admissibility.problems``."""
    constraints = dict(constraints or {})
    check_constraints(constraints)
    stats = stats if stats is not None else SpaceStats()
    fixed = {k: constraints[k] for k in ("checkpoint", "fusions", "num_microbatches")
             if k in constraints}
    for dp, tp, pp, cp in meshes(num_gpus, facts, train, constraints, stats):
        per_replica = train.global_batch // dp
        sizes = ([int(constraints["micro_batch"])]  # type: ignore[call-overload]
                 if "micro_batch" in constraints else list(MICRO_BATCHES))
        for mb in [m for m in sizes if per_replica % m == 0]:
            m = per_replica // mb
            for schedule, v in _schedules(pp, m, facts.num_blocks, constraints, stats):
                for zero in _zero_stages(dp * cp, pp, constraints, stats):
                    for sp in _sequence_parallel(tp, cp, train.seq_len, constraints, stats):
                        ranks = dp * cp * (tp if sp else 1)
                        for ep, etp in _expert_layouts(facts, ranks, tp if sp else 1,
                                                       constraints, stats):
                            config = ParallelConfig(
                                dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, zero=zero,
                                micro_batch=mb, schedule=schedule, virtual_stages=v,
                                sequence_parallel=sp,
                                offload=bool(constraints.get("offload", False)), **fixed)
                            found = problems(facts, config, train)
                            if found:
                                stats.refuse(found[0])
                                continue
                            stats.enumerated += 1
                            yield config


def _expert_degrees(facts: ModelFacts, ranks: int) -> list[int]:
    """The ep degrees of a model's experts over ``ranks`` (a stage's ranks the experts' mesh
    folds over, ``ParallelConfig.expert_ranks``): divisors of both; [1] for a dense model."""
    if not facts.num_experts:
        return [1]
    return [e for e in divisors(ranks) if facts.num_experts % e == 0]


def _expert_layouts(facts: ModelFacts, ranks: int, folded_tp: int,
                    constraints: Mapping[str, object], stats: SpaceStats
                    ) -> list[tuple[int, int]]:
    """(ep, etp) of a model's experts over ``ranks``: ep as ``_expert_degrees``; etp 1 (each
    expert whole), and under the fold (``folded_tp`` > 1) the whole tp -- each expert's width
    over the tp ranks -- where the model's family can split an expert
    (``ModelFacts.etp_refused``), ep x etp divides the ranks, and the experts cannot be spread
    whole over ep x etp ranks instead: that layout holds the same expert weights per rank over
    the same expert data-parallel ranks without etp's gather and scatter, so etp is searched
    where it goes past the experts' count (a few wide experts: Mixtral's 8 over 16 ranks),
    pruned elsewhere (``SpaceStats.pruned["etp"]``). An etp the user names, only."""
    experts = facts.num_experts or 0
    named = "etp" in constraints
    if named:
        etps = [int(constraints["etp"])]  # type: ignore[call-overload]
    elif folded_tp > 1 and experts and facts.etp_refused is None:
        etps = [1, folded_tp]
    else:
        etps = [1]
    out = []
    for etp in etps:
        if etp > 1 and folded_tp % etp:
            continue
        for ep in _allowed(_expert_degrees(facts, ranks), "ep", constraints):
            if ranks % (ep * etp):
                continue
            if etp > 1 and not named and experts % (ep * etp) == 0:
                stats.prune("etp")
                continue
            out.append((ep, etp))
    return out


def _schedules(pp: int, m: int, num_blocks: int, constraints: Mapping[str, object],
               stats: SpaceStats) -> list[tuple[Schedule, int]]:
    want = constraints.get("schedule")
    want = Schedule(want) if want is not None else None
    if pp == 1:
        if constraints.get("virtual_stages", 1) != 1:
            return []  # model chunks need pipeline stages
        return [(want or Schedule.ONE_F_ONE_B, 1)] if want != Schedule.INTERLEAVED \
            else [(Schedule.INTERLEAVED, 1)]
    out: list[tuple[Schedule, int]] = []
    # torch.distributed.pipelining's Schedule1F1B needs a micro-batch per stage at least; with
    # fewer, 1F1B and GPipe keep the same m micro-batches in flight, so GPipe stands in for it
    if want in (None, Schedule.ONE_F_ONE_B) and m >= pp:
        out.append((Schedule.ONE_F_ONE_B, 1))
    if want == Schedule.GPIPE or (want is None and m < pp):
        out.append((Schedule.GPIPE, 1))
    elif want is None:
        stats.prune("gpipe")
    if want in (None, Schedule.INTERLEAVED) and m % pp == 0:
        per_stage = num_blocks // pp if num_blocks % pp == 0 else 0
        most = max(MAX_VIRTUAL_STAGES, int(constraints.get("virtual_stages", 1)))  # type: ignore[call-overload]
        vs = [v for v in range(2, most + 1) if per_stage and per_stage % v == 0]
        if want == Schedule.INTERLEAVED:
            vs = [1] + vs
        out += [(Schedule.INTERLEAVED, v) for v in _allowed(vs, "virtual_stages", constraints)]
    if "virtual_stages" in constraints:
        out = [(s, v) for s, v in out if v == constraints["virtual_stages"]]
    return out


def _zero_stages(replicas: int, pp: int, constraints: Mapping[str, object],
                 stats: SpaceStats) -> list[int]:
    if "zero" in constraints:
        return [int(constraints["zero"])]  # type: ignore[arg-type]
    if replicas == 1:
        return [0]
    stats.prune("zero0")
    if pp > 1:
        # torch.distributed.pipelining reduces gradients once per step, after the last
        # micro-batch, whatever FSDP is told: ZeRO-2 would run as ZeRO-1 (passes/data_parallel)
        stats.prune("zero2 under pipelining")
        return [1, 3]
    return [1, 2, 3]


def _sequence_parallel(tp: int, cp: int, seq_len: int, constraints: Mapping[str, object],
                       stats: SpaceStats) -> list[bool]:
    options = _sequence_parallel_options(tp, cp, seq_len, constraints, stats)
    if ASYNC_TP in (constraints.get("fusions") or ()):
        return [o for o in options if o]  # it overlaps the sequence-parallel collectives
    return options


def _sequence_parallel_options(tp: int, cp: int, seq_len: int,
                               constraints: Mapping[str, object], stats: SpaceStats
                               ) -> list[bool]:
    if "sequence_parallel" in constraints:
        return [bool(constraints["sequence_parallel"]) and tp > 1]
    if tp == 1 or sequence_parallel_problem(seq_len, tp, cp) is not None:
        return [False]  # the sequence does not split evenly: planned without it
    stats.prune("no-sp")
    return [True]
