"""How few of a step's micro-batches a rank role's dry run has to run to find its peak.

A pipeline rank runs its step as a sequence of forwards and backwards of (stage, micro-batch),
in the order torch's schedule gives it (``ScheduleGPipe``, ``Schedule1F1B``,
``ScheduleInterleaved1F1B``: ``passes/pipeline.py``). Every micro-batch has the same shapes,
so what the rank holds while it runs one of them depends only on where the action sits in the
schedule -- its *memory state*:

* forward or backward, and of which of the rank's stages;
* how many micro-batches each of the rank's stages holds in flight (forward run, backward
  not yet) when the action starts, and how many receives it has posted ahead (torch's
  interleaved runtime posts a stage's next receive before the backward it runs; the buffer
  exists from then on);
* which of its stages have run a backward already (their gradients exist: FSDP2's
  accumulated gradients, the ZeRO-1/2 gradient buffers), and which have run their last one
  (their gradients reduced, their gathered parameters let go);
* which of its stages hold their parameters gathered (under ZeRO-3 the interleaved runtime
  keeps at most three stages' FSDP parameters gathered, and lets the others' go between their
  uses: ``core/stages.py:gathered_stages``);
* whether it is the stage's first forward (buffers made once) or last backward (the
  gradient reduction of the step, FSDP2's ``last_backward``).

Two step lengths whose schedules pass through the same set of states hold the same bytes at
their peaks: every state of the shorter one is one of the longer one's and the converse. Once
the schedule is in its steady state (1F1B: one forward, one backward), more micro-batches
repeat states already met, so a dry run of many micro-batches (llama3-405b's plan on 16,384
GPUs runs 64 per rank) can run fewer, ``microbatches_to_run``, and find the same peak. What
grows with the number of micro-batches beside the states -- the step's batch of token ids
and the last stage's per-micro-batch losses -- is added back by the dry run
(``autopar/dryrun/run.py:_batch_bytes``). GPipe runs every forward before any backward: each
micro-batch adds a state, and its dry run runs them all.

``tests/unit/dryrun/test_steady.py`` holds the shorter runs' peaks, byte for byte, to the full
ones' on 1F1B, interleaved (1 and 2 chunks per rank), context-parallel, ZeRO-3 and MoE plans.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from autopar.core.plan import Plan
from autopar.core.specs import ParallelConfig, Schedule, TrainSpec
from autopar.core.stages import gathered_stages

Action = tuple[str, int, int]
"""(kind, the stage's index among the rank's stages, micro-batch): kind "F" or "B" (forward,
backward), "RECV_F" or "RECV_B" (a receive posted: its buffer exists from then on), "UNSHARD"
or "RESHARD" (the interleaved runtime gathers a stage's FSDP parameters before its use and lets
them go when it is not among the next stages to compute: ``_add_unshard_reshard``)."""


def schedule_actions(schedule: Schedule, pp: int, chunks: int, rank: int,
                     n: int, gathered: int | None = None) -> list[Action]:
    """What pipeline rank ``rank`` runs in a step of ``n`` micro-batches, in the order torch's
    schedule runs it (``chunks`` stages per rank under the interleaved schedule, ``gathered`` of
    them with their parameters gathered at once, all by default:
    ``core/stages.py:gathered_stages``). The
    single-stage schedules post a receive just before the forward or backward that reads it,
    so their receives are left out; the interleaved schedule posts some ahead, and they are
    in."""
    if schedule is Schedule.GPIPE:
        return [("F", 0, i) for i in range(n)] + [("B", 0, i) for i in range(n)]
    if schedule is Schedule.ONE_F_ONE_B:
        # Schedule1F1B._step_microbatches: pp - rank forwards, then a backward and a forward
        # while forwards are left, then the remaining backwards
        warmup = min(n, pp - rank)
        out: list[Action] = [("F", 0, i) for i in range(warmup)]
        f = warmup
        for b in range(n):
            out.append(("B", 0, b))
            if f < n:
                out.append(("F", 0, f))
                f += 1
        return out
    return list(_interleaved(pp, chunks, n, chunks if gathered is None else gathered)[rank])


@lru_cache(maxsize=64)
def _interleaved(pp: int, chunks: int, n: int, gathered: int) -> tuple[tuple[Action, ...], ...]:
    """Every rank's actions under ``ScheduleInterleaved1F1B``, as its constructor lowers its
    compute order with the communication (``_prepare_schedule_with_comms``, with ``gathered``
    stages gathered at once as ``passes/pipeline.py:InterleavedSchedule`` lowers it), without
    stages."""
    from torch.distributed.pipelining import schedules

    order = schedules.ScheduleInterleaved1F1B.__new__(schedules.ScheduleInterleaved1F1B)
    order.n_local_stages, order.pp_group_size, order._n_microbatches = chunks, pp, n
    order.number_of_rounds = max(1, n // pp)
    order.microbatches_per_round = n // order.number_of_rounds
    compute = {r: order._calculate_single_rank_operations(r) for r in range(pp)}
    lowered = {r: schedules._add_reduce_grad(
        schedules._add_unshard_reshard(compute[r], max_active_stages=gathered), n)
        for r in range(pp)}
    lowered = schedules._add_send_recv(lowered, stage_to_rank=lambda s: s % pp,
                                       num_stages=pp * chunks)
    kept = ("F", "B", "RECV_F", "RECV_B", "UNSHARD", "RESHARD")
    return tuple(tuple((a.computation_type.value, a.stage_index // pp, a.microbatch_index)
                       for a in lowered[r] if a.computation_type.value in kept)
                 for r in range(pp))


def memory_states(actions: list[Action], chunks: int) -> frozenset[tuple]:
    """The memory state at the start of every forward and backward (see the module
    docstring); a receive posted ahead counts until its micro-batch's backward, when the
    stage lets its buffer go (``passes/pipeline.py:InFlightStage``)."""
    in_flight, received, grads_received = [0] * chunks, [0] * chunks, [0] * chunks
    forwards, backwards, total = [0] * chunks, [0] * chunks, [0] * chunks
    unsharded = [False] * chunks
    for kind, stage, _ in actions:
        total[stage] += kind == "B"
    states = set()
    for kind, stage, _ in actions:
        if kind == "RECV_F":
            received[stage] += 1
            continue
        if kind == "RECV_B":
            grads_received[stage] += 1
            continue
        if kind in ("UNSHARD", "RESHARD"):
            unsharded[stage] = kind == "UNSHARD"
            continue
        first = kind == "F" and forwards[stage] == 0
        last = kind == "B" and backwards[stage] == total[stage] - 1
        states.add((kind, stage, tuple(in_flight), tuple(received), tuple(grads_received),
                    tuple(b > 0 for b in backwards), tuple(b == t for b, t in zip(backwards, total)),
                    tuple(unsharded), first, last))
        if kind == "F":
            in_flight[stage] += 1
            forwards[stage] += 1
        else:
            in_flight[stage] -= 1
            backwards[stage] += 1
            received[stage] = max(0, received[stage] - 1)
            grads_received[stage] = max(0, grads_received[stage] - 1)
    return frozenset(states)


def microbatches_to_run(c: ParallelConfig, train: TrainSpec, pp_rank: int) -> int:
    """The fewest micro-batches whose step takes pipeline rank ``pp_rank`` through the same
    memory states as the whole step of ``c`` on ``train`` (its own count when none fewer
    does, always without pipelining), among the counts the engine accepts."""
    from autopar.analysis.admissibility import microbatch_problem

    n = c.microbatches(train)
    if c.pp == 1:
        return n
    chunks = c.virtual_stages if c.schedule is Schedule.INTERLEAVED else 1
    gathered = gathered_stages(c.zero, chunks)
    wanted = memory_states(schedule_actions(c.schedule, c.pp, chunks, pp_rank, n, gathered),
                           chunks)
    # a stage holding k micro-batches in flight needs k of them, and one more to start the
    # forward it holds them at
    fewest = max(max(state[2]) + (state[0] == "F") for state in wanted)
    for m in range(fewest, n):
        fewer = replace(train, global_batch=c.dp * c.micro_batch * m)
        if microbatch_problem(replace(c, num_microbatches=None), fewer) is not None:
            continue
        if memory_states(schedule_actions(c.schedule, c.pp, chunks, pp_rank, m, gathered),
                         chunks) == wanted:
            return m
    return n


def shortened(plan: Plan, microbatches: int) -> Plan:
    """``plan`` with a step of ``microbatches`` micro-batches (the global batch cut to match);
    its estimate is the whole step's."""
    c = plan.config
    config = replace(c, num_microbatches=None) if c.num_microbatches is not None else c
    train = replace(plan.train, global_batch=c.dp * c.micro_batch * microbatches)
    return replace(plan, config=config, train=train)
