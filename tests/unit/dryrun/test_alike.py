"""Alike pipeline ranks' peaks read off three of them (``autopar/dryrun/alike.py``) are the ones
their own dry runs find, byte for byte and kind by kind; where the schedule does not step them
evenly, every role runs."""

from __future__ import annotations

import pytest

import autopar
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.dryrun.alike import Family, extrapolated, families, in_flight_at_most
from autopar.report.dryrun import read_off_lines


def _plan(model: str = "tiny-llama", layers: int = 8, **config):
    spec = ModelSpec(name=model, overrides={"num_layers": layers, "seq_len": 64})
    c = ParallelConfig(**{"dp": 1, "pp": 8, "micro_batch": 1, "zero": 1, **config})
    nodes = max(1, c.dp * c.tp * c.pp * c.cp // 8)
    cluster = autopar.ClusterSpec.preset("hgx-h100-80g", nodes=nodes)
    return autopar.plan_for(spec.build("meta"), cluster,
                            TrainSpec(global_batch=c.dp * 16, seq_len=64), c, model_spec=spec)


# measured 2026-12-08, 16 micro-batches a rank, pp 8 (ranks 1-6 alike: ranks 1-3 read off 4-6):
# every read-off role equal to its own dry run to the byte, every kind too, the whole dry run
# in 45-65 % of the time of every role's
CASES = {
    "1f1b": dict(schedule="1f1b"),
    "interleaved-v1": dict(schedule="interleaved", virtual_stages=1),
    "1f1b-cp2": dict(schedule="1f1b", cp=2),
    "moe-ep2-zero3": dict(model="tiny-moe", schedule="1f1b", dp=2, ep=2, zero=3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_read_off_peaks_are_the_roles_own(name: str) -> None:
    plan = _plan(**CASES[name])
    assert families(plan, range(8)) == (Family(run=(4, 5, 6), inferred=(1, 2, 3)),)
    every = autopar.dry_run(plan, workers=1, every_role=True)
    read = autopar.dry_run(plan, workers=1)
    assert not any(r.inferred_from for r in every.roles)
    assert [r.inferred_from for r in read.roles] == [()] + [(4, 5, 6)] * 3 + [()] * 4
    for a, b in zip(every.roles, read.roles):
        assert b.peak_bytes == a.peak_bytes, a.pp_rank
        assert b.peak_breakdown == a.peak_breakdown, a.pp_rank
        assert (a.stages, a.blocks, a.rank, a.predicted) == (b.stages, b.blocks, b.rank,
                                                             b.predicted)
    assert any("read off ranks 4-6" in n for n in read.notes)
    # plan --check's report says so too (its per-role table has no column for it)
    assert read_off_lines(read) == ["pipeline ranks 1, 2, 3: read off ranks 4, 5, 6, which run "
                                    "the same program (not run themselves)"]
    assert read_off_lines(every) == []
    # a role read off its neighbours ran nothing of its own
    assert all(r.microbatches == 0 and not r.collectives for r in read.roles if r.inferred_from)


def test_uneven_warm_ups_run_every_role() -> None:
    # four chunks a rank under ZeRO-3: the warm-up wraps into the next round at a different
    # rank for each chunk, and the three gathered stages change; the peaks do not step evenly
    # (7.61, 7.33, 7.07, 6.78 MB on ranks 1-4), so nothing is read off
    plan = _plan(layers=32, schedule="interleaved", virtual_stages=4, zero=3)
    assert families(plan, range(8)) == ()


def test_two_chunks_a_rank_split_where_the_peaks_moment_changes() -> None:
    # ranks 1-3 peak in their first chunk's backward, 4-6 in their second's: two runs of three,
    # too short to read anything off
    plan = _plan(layers=16, schedule="interleaved", virtual_stages=2)
    most = [in_flight_at_most(plan, r) for r in range(1, 7)]
    assert [m for m, _ in most] == [21, 19, 17, 15, 13, 11]
    assert most[0][1] == most[2][1] != most[3][1] == most[5][1]
    assert families(plan, range(8)) == ()


def test_no_family_without_enough_alike_ranks_or_under_gpipe() -> None:
    assert families(_plan(pp=4, dp=2, schedule="1f1b"), range(4)) == ()  # ranks 1-2 alike only
    assert families(_plan(schedule="gpipe"), range(8)) == ()
    # only the ranks asked for: 2-6 leave 2 to read off 4-6
    assert families(_plan(schedule="1f1b"), [0, 2, 3, 4, 5, 6]) == (Family((4, 5, 6), (2, 3)),)


def test_peaks_that_do_not_step_evenly_or_do_not_grow_are_not_extrapolated() -> None:
    family = Family(run=(4, 5, 6), inferred=(1, 2, 3))
    even = {4: {"activations": 30.0, "params": 5.0}, 5: {"activations": 20.0, "params": 5.0},
            6: {"activations": 10.0, "params": 5.0}}
    assert extrapolated(family, even) == {1: {"activations": 60.0, "params": 5.0},
                                          2: {"activations": 50.0, "params": 5.0},
                                          3: {"activations": 40.0, "params": 5.0}}
    uneven = {**even, 6: {"activations": 11.0, "params": 5.0}}
    assert extrapolated(family, uneven) is None
    # the same peak on all three (the optimizer step's, say): a deeper rank's in-flight moment
    # could pass it, so it is run
    flat = {r: {"activations": 10.0, "params": 5.0} for r in (4, 5, 6)}
    assert extrapolated(family, flat) is None


def test_every_role_and_all_microbatches_run_each_role() -> None:
    # ranks 1-6 would read 1-3 off 4-6
    run = autopar.dry_run(_plan(schedule="1f1b"), workers=1, pp_ranks=range(1, 7),
                          all_microbatches=True)
    assert not any(r.inferred_from for r in run.roles)
    assert [r.microbatches for r in run.roles] == [16] * 6
