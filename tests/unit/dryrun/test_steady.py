"""A pipelined role's dry run runs the fewest micro-batches that reach every memory state of
its step (``autopar/dryrun/steady.py``) and finds the whole step's peak, byte for byte."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig, Schedule, TrainSpec
from autopar.dryrun.steady import memory_states, microbatches_to_run, schedule_actions


def _config(**kw) -> ParallelConfig:
    return ParallelConfig(**{"dp": 2, "pp": 4, "micro_batch": 1, **kw})


def test_one_f_one_b_needs_the_warm_up_and_two_steady_rounds() -> None:
    # rank r holds pp - r micro-batches in flight; the forward that reaches them with the
    # gradients made, a backward with them and the step's last backward need a few more
    c = _config(schedule="1f1b")
    train = TrainSpec(global_batch=2 * 64, seq_len=32)
    runs = [microbatches_to_run(c, train, r) for r in range(4)]
    assert runs == [5, 4, 4, 4]  # 1F1B itself needs at least pp micro-batches
    # a step of that many passes through the very states of the whole step, one fewer does
    # not (ranks 2 and 3 would need fewer, but for torch's minimum)
    def states(r: int, n: int):
        return memory_states(schedule_actions(Schedule.ONE_F_ONE_B, 4, 1, r, n), 1)

    for r, m in enumerate(runs):
        assert states(r, m) == states(r, 64)
        assert (states(r, m - 1) == states(r, 64)) is (r >= 2)


def test_gpipe_runs_every_micro_batch_each_adds_a_state() -> None:
    c = _config(schedule="gpipe")
    assert microbatches_to_run(c, TrainSpec(global_batch=2 * 12, seq_len=32), 0) == 12


def test_the_interleaved_schedules_receives_posted_ahead_are_states() -> None:
    # torch's interleaved runtime posts a stage's next receive before the backward it runs
    # in the steady state: a shorter step whose last forwards end that pattern early misses it
    c = _config(schedule="interleaved", virtual_stages=1)
    train = TrainSpec(global_batch=2 * 12, seq_len=32)
    assert [microbatches_to_run(c, train, r) for r in range(4)] == [8, 7, 5, 3]
    no_receives = [a for a in schedule_actions(Schedule.INTERLEAVED, 4, 1, 1, 6)
                   if a[0] in ("F", "B")]
    assert memory_states(no_receives, 1) == memory_states(
        [a for a in schedule_actions(Schedule.INTERLEAVED, 4, 1, 1, 12) if a[0] in ("F", "B")], 1)


def test_a_plan_without_pipelining_runs_its_whole_step() -> None:
    c = ParallelConfig(dp=2, micro_batch=1)
    assert microbatches_to_run(c, TrainSpec(global_batch=16, seq_len=32), 0) == 8


def _plan(batch: int, model: str = "tiny-llama", **config):
    spec = ModelSpec(name=model, overrides={"num_layers": 8, "seq_len": 64})
    c = ParallelConfig(**{"dp": 2, "pp": 4, "micro_batch": 1, "zero": 1, **config})
    cluster = autopar.ClusterSpec.preset("hgx-h100-80g", nodes=1)
    return autopar.plan_for(spec.build("meta"), cluster,
                            TrainSpec(global_batch=c.dp * batch, seq_len=64), c, model_spec=spec)


# measured 2026-11-28, 12-16 micro-batches per rank: every role of each plan equal to the byte,
# every kind too, in 35-75 % of the whole step's time; before the receives posted ahead were
# states, interleaved v=1's middle ranks read 8 KiB low (one receive buffer), and before the
# batch's bytes were added back the last stage read 4 bytes low per micro-batch not run (its
# loss) and under cp 2 every rank 512 bytes (its chunks of the token ids and targets); the MoE
# case (experts over ep 2 under ZeRO-3) equal as well
CASES = {
    "1f1b-zero3": dict(schedule="1f1b", zero=3),
    "1f1b-cp2": dict(schedule="1f1b", dp=1, cp=2),
    "interleaved-v1": dict(schedule="interleaved", virtual_stages=1),
    "interleaved-v2-tp2-sp": dict(schedule="interleaved", virtual_stages=2, dp=1, tp=2,
                                  sequence_parallel=True),
    "moe-ep2-zero3": dict(model="tiny-moe", schedule="1f1b", pp=2, dp=4, ep=2, zero=3),
    # four chunks a rank under ZeRO-3: the runtime keeps three gathered and lets the others'
    # go between their uses (core/stages.py:gathered_stages)
    "interleaved-v4-zero3": dict(schedule="interleaved", virtual_stages=4, pp=2, dp=4, zero=3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_shorter_step_finds_the_whole_steps_peak(name: str) -> None:
    plan = _plan(16, **CASES[name])
    whole = autopar.dry_run(plan, workers=1, all_microbatches=True)
    short = autopar.dry_run(plan, workers=1)
    assert any(r.microbatches < r.step_microbatches for r in short.roles)
    for a, b in zip(whole.roles, short.roles):
        assert a.microbatches == a.step_microbatches == b.step_microbatches == 16
        assert b.peak_bytes == a.peak_bytes, (a.pp_rank, b.microbatches)
        assert b.peak_breakdown == a.peak_breakdown, a.pp_rank
        assert dataclasses.replace(b, seconds=0, microbatches=16, collectives={}) == \
            dataclasses.replace(a, seconds=0, collectives={})


def test_zero1_gathers_every_chunk_once_a_step_however_many_chunks() -> None:
    # torch's lowering keeps three chunks gathered and gathers the others again at each use:
    # the all-gathers would grow with the micro-batches; the engine's keeps every chunk's
    # (passes/pipeline.py:InterleavedSchedule), as ZeRO-1 is priced
    gathers = []
    for batch in (8, 16):
        plan = _plan(batch, schedule="interleaved", virtual_stages=4, pp=2, dp=4)
        run = autopar.dry_run(plan, workers=1, pp_ranks=[0], all_microbatches=True)
        gathers.append(run.roles[0].collectives["all-gather"])
    assert gathers[0] == gathers[1] > 0
