"""Which pipeline ranks' dry runs the dry run reads off three alike neighbours instead of running.

Pipeline ranks whose stages hold the same blocks, chunk by chunk, and none of which is the first
rank (the embedding, the layers before the blocks) or the last (the head and the loss), run the
same program on tensors of the same shapes. Their steps differ only in where they sit in the
schedule: torch's 1F1B warms rank ``r`` up with ``pp - r`` micro-batches, its interleaved
schedule with two more forwards a rank nearer the first (``steady.py``). A micro-batch in flight
holds the same bytes on each of them -- its saved activations, its received input -- and where
every chunk of the rank holds as many blocks, the same bytes whichever chunk it is in. So while
the peak is at a moment whose micro-batches in flight grow with the warm-up, one such rank's peak
exceeds the next one's by the same bytes, kind by kind, all along the run of ranks.

The dry run (``run.py``) therefore runs, of each such run of four or more adjacent alike ranks,
the three with the fewest micro-batches in flight (the last three: the cheapest to run), and:

* where the schedule's most micro-batches in flight at a forward or backward step by the same
  count from each rank of the run to the next, at the same memory states but for that count
  (``in_flight_at_most``: no warm-up cut short by the step's micro-batches, the same receives
  posted ahead and parameters gathered), which ``families`` checks before anything runs, and
* where the three peaks, kind by kind, step by the same bytes, and the peak grows
  (``extrapolated``: a peak at a moment the warm-up does not change, such as the optimizer
  step's, would step by nothing, and a deeper rank's in-flight moment could pass it),

it reads every other rank's peak off that step (``RoleRun.inferred_from``). Otherwise it runs
them too. ``tests/unit/dryrun/test_alike.py`` holds the read-off peaks, byte for byte, to the
ones the roles' own dry runs find on 1F1B, interleaved and context-parallel plans, and
``bench/dry_run_alike.py`` on pp-16 plans of two and four chunks a rank; llama3-405b's plan on
16,384 GPUs runs 5 of its 16 roles (``bench/results/dry_run_405b.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autopar.core.plan import Plan
from autopar.core.specs import Schedule
from autopar.core.stages import gathered_stages, stage_chunks
from autopar.dryrun.steady import memory_states, schedule_actions

RUN = 3
"""How many alike ranks of a run are dry-run to read the others off: two steps to compare."""


@dataclass(frozen=True)
class Family:
    """A run of adjacent alike pipeline ranks: ``run`` (the last ``RUN`` of them) are dry-run,
    ``inferred`` (the others) read off them where their peaks step evenly."""

    run: tuple[int, ...]
    inferred: tuple[int, ...]


def rank_chunks(plan: Plan, pp_rank: int) -> tuple[int, ...]:
    """Blocks of each of ``pp_rank``'s model chunks (chunk ``i`` on rank ``i % pp``)."""
    c = plan.config  # virtual_stages is 1 but under the interleaved schedule (ParallelConfig)
    return tuple(stage_chunks(plan.stage_blocks, c.virtual_stages)[pp_rank::c.pp])


def in_flight_at_most(plan: Plan, pp_rank: int) -> tuple[int, frozenset[tuple]]:
    """The most micro-batches ``pp_rank`` holds in flight, over all its chunks, at the start of
    a forward or backward of the plan's whole step, and the memory states it holds them at
    (``steady.memory_states``) with the receives posted ahead counted beyond that many and
    the counts by chunk summed (the rank's chunks hold as many blocks each): what else is live
    then (receives, gradients made, parameters gathered)."""
    c = plan.config
    chunks = c.virtual_stages
    actions = schedule_actions(c.schedule, c.pp, chunks, pp_rank, c.microbatches(plan.train),
                               gathered_stages(c.zero, chunks))
    states = memory_states(actions, chunks)
    most = max(sum(state[2]) for state in states)
    # (kind, stage, in flight, receives posted, gradient receives posted, the rest): under the
    # interleaved schedule a micro-batch in flight keeps the receive posted for it, so both
    # counts grow with the warm-up (the other schedules post none ahead: steady.py)
    ahead = most if c.schedule is Schedule.INTERLEAVED else 0
    return most, frozenset((s[0], s[1], sum(s[3]) - ahead, sum(s[4]), *s[5:])
                           for s in states if sum(s[2]) == most)


def families(plan: Plan, wanted: Sequence[int]) -> tuple[Family, ...]:
    """The runs of adjacent alike ranks among ``wanted`` whose peaks can be read off their last
    three (module docstring); none without pipelining or under GPipe (which runs every
    forward first: no warm-up to step)."""
    c = plan.config
    if c.pp < RUN + 2 or c.schedule is Schedule.GPIPE:
        return ()
    try:
        chunks_of = {r: rank_chunks(plan, r) for r in range(1, c.pp - 1)}
    except ValueError:  # blocks per rank the interleaved cut does not give: run every role
        return ()
    chosen = set(wanted)
    runs: list[list[int]] = []
    for r in range(1, c.pp - 1):
        chunks = chunks_of[r]
        if r not in chosen or len(set(chunks)) != 1:
            runs.append([])
        elif runs and runs[-1] and chunks_of[runs[-1][-1]] == chunks:
            runs[-1].append(r)
        else:
            runs.append([r])
    out = []
    for run in runs:
        for even in _evenly_in_flight(plan, run) if len(run) > RUN else ():
            if len(even) > RUN:
                out.append(Family(tuple(even[-RUN:]), tuple(even[:-RUN])))
    return tuple(out)


def _evenly_in_flight(plan: Plan, ranks: Sequence[int]) -> list[list[int]]:
    """``ranks`` (adjacent, alike) cut into the longest runs along which the most micro-batches
    in flight step by the same nonzero count from each rank to the next, held at the same
    states but for that count (``in_flight_at_most``)."""
    most = {r: in_flight_at_most(plan, r) for r in ranks}
    out: list[list[int]] = []
    for r in ranks:
        run = out[-1] if out else None
        if run and most[run[-1]][1] == most[r][1] and most[run[-1]][0] > most[r][0] and (
                len(run) == 1 or most[run[-2]][0] - most[run[-1]][0]
                == most[run[-1]][0] - most[r][0]):
            run.append(r)
        else:
            out.append([r])
    return out


def extrapolated(family: Family, breakdowns: dict[int, dict[str, float]]
                 ) -> dict[int, dict[str, float]] | None:
    """Each inferred rank's peak bytes by kind, read off the run ranks' ``breakdowns`` (by pp
    rank): the first run rank's, plus one step for each rank nearer the first; None where the
    run ranks' peaks do not step by the same bytes in every kind, or do not grow."""
    a, b, c = (breakdowns[r] for r in family.run)
    kinds = tuple(a)
    step = {k: a[k] - b[k] for k in kinds}
    if any(step[k] != b[k] - c[k] for k in kinds) or sum(step.values()) <= 0:
        return None
    first = family.run[0]
    return {r: {k: a[k] + (first - r) * step[k] for k in kinds} for r in family.inferred}
