"""The pipeline schedule slot by slot: when each micro-batch's forward and backward runs on each
stage (what the HTML report draws as a Gantt chart).

The cost model prices a schedule by two numbers of ``costmodel/pipeline.py``: the micro-batches a
stage holds in flight (``in_flight_microbatches``) and the bubble (``bubble_fraction``); it keeps
no slot-by-slot timeline, but where a stage's model chunks keep different amounts (the first
rank's first chunk holds the embedding) it reads what each chunk holds at each backward start
from the order laid out here (``in_flight_states``, ``weighted_in_flight``). This module is the
one place that lays the schedule out, from those same rules:

* rank ``r`` runs ``in_flight_microbatches(...) * v`` chunk forwards before its first backward
  (all ``m`` under GPipe, ``min(pp - r, m)`` under 1F1B, torch's ``_get_warmup_ops`` + 1 under
  the interleaved schedule), then one backward and one forward in turn, then the backwards left;
* under the interleaved schedule forwards go chunk by chunk in rounds of ``m // max(1, m // pp)``
  micro-batches (chunk 0 of a round, then chunk 1, ...), backwards the same with the chunks in
  reverse (torch's ``ScheduleInterleaved1F1B``: ``forward_stage_index``,
  ``backward_stage_index``);
* an op starts when its rank is free and its input is there: a forward after the previous
  virtual stage's forward of that micro-batch, a backward after the next virtual stage's
  backward (the last one's after its own forward). Point-to-point transfers take no time here
  (the cost model adds them to the stage time, ``comm_pp``).

With equal stages the idle time of a rank is the cost model's bubble:
``(pp - 1) / v`` micro-batch stage times (``tests/unit/costmodel/test_schedule_slots.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from autopar.core.errors import AutoparError
from autopar.core.specs import Schedule

from .pipeline import in_flight_microbatches


@dataclass(frozen=True)
class Slot:
    """One forward or backward of one micro-batch on one model chunk of one pipeline rank."""

    stage: int
    """The pipeline rank, first to last."""
    chunk: int
    """The rank's model chunk (0 without interleaving); virtual stage ``chunk * pp + stage``."""
    microbatch: int
    backward: bool
    start_s: float
    end_s: float


def rank_order(schedule: Schedule, stage: int, pp: int, m: int, v: int
               ) -> list[tuple[bool, int, int]]:
    """The ops rank ``stage`` runs, in order: ``(backward, chunk, microbatch)``."""
    chunks = v if schedule is Schedule.INTERLEAVED else 1
    per_round = m // max(1, m // pp) if chunks > 1 else m
    total = m * chunks
    warm = round(in_flight_microbatches(schedule, stage, pp, m, chunks) * chunks)

    def nth(i: int, backward: bool) -> tuple[bool, int, int]:
        group = (i // per_round) % chunks
        chunk = chunks - 1 - group if backward else group
        return backward, chunk, (i // (per_round * chunks)) * per_round + i % per_round

    order = [nth(i, False) for i in range(warm)]
    f, b = warm, 0
    while b < total:
        order.append(nth(b, True))
        b += 1
        if f < total:
            order.append(nth(f, False))
            f += 1
    return order


@lru_cache(maxsize=4096)
def in_flight_states(schedule: Schedule, stage: int, pp: int, m: int, v: int
                     ) -> tuple[tuple[int, ...], ...]:
    """The micro-batches each of rank ``stage``'s model chunks holds at the start of each of
    its backwards (``rank_order``), first chunk first: the distinct counts that no other
    moment's exceed chunk by chunk (so the largest of any weighting of the chunks is among
    them). Under the interleaved schedule the first chunk fills up while the last drains:
    torch's pp 2, v 2, 8 micro-batches holds 3 and 2, then 4 and 1 on rank 0 at its first
    backwards -- 2.5 micro-batches of the whole rank either way, but 4 of its first chunk."""
    counts = [0] * (v if schedule is Schedule.INTERLEAVED else 1)
    seen: set[tuple[int, ...]] = set()
    for backward, chunk, _ in rank_order(schedule, stage, pp, m, v):
        if backward:
            seen.add(tuple(counts))
            counts[chunk] -= 1
        else:
            counts[chunk] += 1
    return tuple(sorted(state for state in seen if not any(
        other != state and all(o >= s for o, s in zip(other, state)) for other in seen)))


def weighted_in_flight(schedule: Schedule, stage: int, pp: int, m: int, v: int,
                       chunk_bytes: Sequence[float]) -> float:
    """Micro-batches rank ``stage`` holds in flight at its largest backward start, in units of
    all its chunks' activations of one micro-batch, when its chunks keep ``chunk_bytes`` each
    for one micro-batch (first chunk first): ``in_flight_microbatches`` where the chunks are
    alike, more where one holds more (the first rank's first chunk, which holds the
    embedding and any layers before the blocks, DeepSeek's dense layers)."""
    total = float(sum(chunk_bytes))
    if total <= 0.0:
        return in_flight_microbatches(schedule, stage, pp, m, v)
    return max(sum(n * b for n, b in zip(state, chunk_bytes))
               for state in in_flight_states(schedule, stage, pp, m, v)) / total


RankSeconds = float | Sequence[float | Sequence[float]]
"""A micro-batch's seconds on every rank (one number), or one entry per rank: a number (the
rank's chunks share it equally) or one number per model chunk."""


def schedule_slots(schedule: Schedule, pp: int, m: int, v: int,
                   forward_s: RankSeconds, backward_s: RankSeconds) -> tuple[Slot, ...]:
    """Every slot of one step's pipeline, rank by rank in the order each runs them, when a
    micro-batch's forward through all of a rank's blocks takes ``forward_s`` and its backward
    ``backward_s``: one number for every rank, or one entry per rank (stages of different
    cost). A rank's entry is its whole time, a chunk's ``1 / v`` of it under the interleaved
    schedule, or its chunks' own times, first chunk first (the head and loss run in the last
    rank's last chunk only, the embedding in the first rank's first, as Megatron-LM's and
    torch's interleaved schedules place them)."""
    if pp < 1 or m < 1 or v < 1:
        raise AutoparError(f"a schedule needs pp, micro-batches and virtual stages >= 1, got "
                           f"pp={pp} m={m} v={v}", where="schedule_slots",
                           fix="pass the plan's configuration")
    chunks = v if schedule is Schedule.INTERLEAVED else 1
    if chunks > 1 and m % max(1, m // pp):
        raise AutoparError(f"the interleaved schedule needs the {m} micro-batches to split into "
                           f"rounds of equal size for pp={pp}", where="num_microbatches",
                           fix="use a multiple of pp micro-batches")
    last = pp * chunks - 1
    fwd, bwd = _per_chunk(forward_s, pp, chunks), _per_chunk(backward_s, pp, chunks)
    orders = [rank_order(schedule, s, pp, m, v) for s in range(pp)]
    done: dict[tuple[bool, int, int], float] = {}  # (backward, virtual stage, mb) -> end
    nxt, free = [0] * pp, [0.0] * pp
    slots: list[list[Slot]] = [[] for _ in range(pp)]
    while any(nxt[s] < len(orders[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            while nxt[s] < len(orders[s]):
                backward, chunk, mb = orders[s][nxt[s]]
                vs = chunk * pp + s
                need = ((True, vs + 1, mb) if vs < last else (False, vs, mb)) if backward \
                    else ((False, vs - 1, mb) if vs > 0 else None)
                if need is not None and need not in done:
                    break
                start = max(free[s], done[need] if need is not None else 0.0)
                end = start + (bwd if backward else fwd)[s][chunk]
                done[(backward, vs, mb)] = free[s] = end
                slots[s].append(Slot(s, chunk, mb, backward, start, end))
                nxt[s] += 1
                moved = True
        if not moved:  # an order that waits on itself: a bug in rank_order, not bad input
            raise RuntimeError(f"pipeline schedule {schedule} pp={pp} m={m} v={v} deadlocks")
    return tuple(slot for rank in slots for slot in rank)


def _per_chunk(seconds: RankSeconds, pp: int, chunks: int) -> list[list[float]]:
    """``seconds`` as one list of ``chunks`` chunk times per rank."""
    if isinstance(seconds, (int, float)):
        seconds = [float(seconds)] * pp
    if len(seconds) != pp:
        raise AutoparError(f"{len(seconds)} stage times for {pp} pipeline ranks",
                           where="schedule_slots", fix="give one time per rank, or one for all")
    out = []
    for t in seconds:
        if isinstance(t, (int, float)):
            out.append([float(t) / chunks] * chunks)
        elif len(t) != chunks:
            raise AutoparError(f"{len(t)} chunk times for a rank of {chunks} model chunks",
                               where="schedule_slots",
                               fix="give one time per chunk, or the rank's total")
        else:
            out.append([float(c) for c in t])
    return out


def makespan_s(slots: Sequence[Slot]) -> float:
    """Seconds from the first slot's start to the last one's end: the schedule's critical
    path."""
    return max(slot.end_s for slot in slots) - min(slot.start_s for slot in slots)
