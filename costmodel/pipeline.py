"""Pipeline stages and schedules: which layers each stage runs, what each keeps in flight, bubbles.

Schedules (Narayanan et al., SC'21; Korthikanti et al., 2022):

* GPipe runs every forward, then every backward: each stage keeps all ``m`` micro-batches.
* 1F1B: stage ``i`` of ``p`` keeps ``min(p - i, m)`` micro-batches in flight.
* Interleaved 1F1B with ``v`` model chunks per rank: rank ``i`` keeps
  ``((v - 1) * p + 2 * (p - 1 - i) + 1) / v`` micro-batches' worth of its layers, at most
  ``m`` (torch's ``ScheduleInterleaved1F1B``; ``p * (1 + (p - 1) / (p * v))`` on the first
  stage, as Narayanan et al. give it).

The bubble is ``(p - 1) / v`` stage-times of a micro-batch (v = 1 without interleaving); with
stages of different cost, the times of the stages the fill and the drain pass through, not the
slowest one's (``pipeline_s``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import accumulate

from autopar.core.errors import AutoparError
from autopar.core.specs import Schedule
from autopar.core.stages import ENDS_AS_CHUNKS, rank_blocks


@dataclass(frozen=True)
class StagePartition:
    """Blocks per pipeline stage (all chunks of a rank together), first stage first."""

    blocks: tuple[int, ...]

    @property
    def num_stages(self) -> int:
        return len(self.blocks)

    @cached_property
    def _starts(self) -> tuple[int, ...]:
        return tuple(accumulate(self.blocks, initial=0))

    def first_block(self, stage: int) -> int:
        return self._starts[stage]


@lru_cache(maxsize=4096)
def even_partition(num_blocks: int, pp: int, virtual_stages: int = 1) -> StagePartition:
    """Split ``num_blocks`` over ``pp`` stages as evenly as possible; the remainder goes to the
    middle stages, since the first and last also carry the embedding and the head. Under the
    interleaved schedule (``virtual_stages`` > 1) each rank's blocks are those of its chunks as
    the engine cuts them (``autopar.core.stages``), uneven when ``pp * virtual_stages`` does not
    divide the blocks."""
    if pp > num_blocks:
        raise AutoparError(
            f"pp={pp} pipeline stages for a model of {num_blocks} blocks",
            where="pp",
            fix=f"use at most {num_blocks} stages",
        )
    if virtual_stages > 1:
        if pp * virtual_stages > num_blocks + ENDS_AS_CHUNKS:
            raise AutoparError(
                f"pp={pp} x virtual_stages={virtual_stages} chunks for a model of {num_blocks} "
                "blocks", where="virtual_stages",
                fix=f"keep pp*virtual_stages at most {num_blocks + ENDS_AS_CHUNKS} (the "
                    "embedding and the loss may each be a chunk of their own)")
        return StagePartition(tuple(rank_blocks(num_blocks, pp, virtual_stages)))
    base, rest = divmod(num_blocks, pp)
    blocks = [base] * pp
    order = sorted(range(pp), key=lambda i: (i in (0, pp - 1), abs(i - (pp - 1) / 2)))
    for i in order[:rest]:
        blocks[i] += 1
    return StagePartition(tuple(blocks))


def in_flight_microbatches(schedule: Schedule, stage: int, pp: int, m: int, v: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak (in units of all its
    layers' activations for one micro-batch)."""
    if schedule is Schedule.GPIPE:
        return float(m)
    if schedule is Schedule.ONE_F_ONE_B:
        return float(min(pp - stage, m))
    # torch's ScheduleInterleaved1F1B (``_get_warmup_ops``): rank r runs
    # (v - 1) * per_round + 2 * (pp - 1 - r) chunk forwards before its first backward, at most
    # all m * v of them, and one more before that backward frees one; a chunk holds 1/v of the
    # rank's blocks. For rank 0 and m a multiple of pp this is Narayanan et al.'s
    # pp * (1 + (pp - 1) / (pp * v)).
    per_round = m // max(1, m // pp)
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - stage), m * v)
    return min(warmup + 1, m * v) / v


def loss_in_flight_microbatches(schedule: Schedule, pp: int, m: int) -> float:
    """Micro-batches that hold what the loss saved for its backward when the last stage's
    first backward begins. Under GPipe every forward runs before the first backward: all
    ``m``. Under 1F1B and torch's interleaved schedule the last rank runs each micro-batch's
    backward of the loss's chunk right after its forward (its warm-up forwards are of its
    earlier chunks): one; and one without pipelining, which runs a micro-batch's forward and
    backward before the next."""
    return float(m) if schedule is Schedule.GPIPE and pp > 1 else 1.0


def bubble_fraction(schedule: Schedule, pp: int, m: int, v: int) -> float:
    """Idle stage-times per step as a fraction of ``m`` micro-batch stage-times.

    ``(pp - 1) / (v * m)`` (Narayanan et al., SC'21, sec. 2.2), and more under the interleaved
    schedule when a round holds fewer micro-batches than there are stages (torch's rounds of
    ``m // max(1, m // pp)``): at each of the ``v - 1`` changes of chunk the first rank waits
    ``pp - m`` chunk-times for the round's first micro-batch to come back through the other
    stages. ``costmodel/schedule_slots.py`` lays the schedule out slot by slot and
    ``tests/unit/costmodel/test_schedule_slots.py`` holds the two equal."""
    chunks = v if schedule is Schedule.INTERLEAVED else 1
    return ((pp - 1) + (chunks - 1) * max(0, pp - m)) / (chunks * m)


def pipeline_s(schedule: Schedule, pp: int, m: int, v: int,
               stage_s: Sequence[float]) -> tuple[float, float]:
    """(busy, bubble) seconds of one step's pipeline when a micro-batch's forward and backward
    take ``stage_s[r]`` on rank ``r`` (all its chunks; communication inside the stage, the
    point-to-point transfers included, since torch's schedules wait for them).

    The slowest rank paces the steady state, ``m`` of its stage times (busy). The bubble is
    what the fill and the drain add to that: the other ranks' stage times, each passed once
    through on the way to the slowest rank and back (``(sum - slowest) / v`` with ``m >= pp``,
    ``bubble_fraction`` of ``m`` of their mean in general). With equal stages that is
    ``bubble_fraction * m`` stage times; with a heavy last stage (the head) or uneven blocks
    (126 layers on 16 stages) it is less, as ``costmodel/schedule_slots.py``'s slot-by-slot
    layout of the schedule has it (``tests/unit/costmodel/test_schedule_slots.py`` holds them within
    2 % on such stages; the slowest-stage bubble was up to 3 % long there). Under the
    interleaved schedule the head runs in the last rank's last chunk only, yet that rank runs
    it once per micro-batch whatever the order, between the fill and the drain: ``m`` times its
    whole stage is its share of the critical path, not ``m * v`` times its slowest chunk (laid
    out for Megatron-LM's 530B and 1T rows, this prices within 0.11 % of the layout, never
    above it: ``test_a_head_in_the_last_chunk_only_costs_the_last_rank_once_per_micro_batch``)."""
    if len(stage_s) != pp:
        raise AutoparError(f"{len(stage_s)} stage times for {pp} pipeline stages",
                           where="pipeline_s", fix="pass one time per stage")
    slow = max(stage_s)
    if pp == 1:
        return m * slow, 0.0
    fill = (sum(stage_s) - slow) / (pp - 1)
    return m * slow, bubble_fraction(schedule, pp, m, v) * m * fill


@lru_cache(maxsize=4096)
def balanced_partition(num_blocks: int, pp: int, block_s: float, first_s: float,
                       last_s: float) -> StagePartition:
    """Blocks per stage minimising the slowest stage, when the first stage also runs
    ``first_s`` (the embedding) and the last ``last_s`` (the head and loss) per micro-batch.

    Starting from the even split, a block moves from the slowest stage to the fastest while
    that lowers the slowest; every stage keeps at least one block. With equal stages this is
    the even split; with a heavy head the last stage gets fewer blocks.
    """
    blocks = list(even_partition(num_blocks, pp, 1).blocks)
    if pp == 1 or block_s <= 0:
        return StagePartition(tuple(blocks))
    extra = [0.0] * pp
    extra[0] += first_s
    extra[-1] += last_s

    def t(s: int) -> float:
        return blocks[s] * block_s + extra[s]

    while True:
        slow = max(range(pp), key=lambda s: (t(s), -s))
        fast = min(range(pp), key=lambda s: (t(s), s))
        # strictly lower by more than rounding, or two equal stages would trade a block forever
        if blocks[slow] <= 1 or t(fast) + block_s >= t(slow) - 1e-9 * block_s:
            return StagePartition(tuple(blocks))
        blocks[slow] -= 1
        blocks[fast] += 1
