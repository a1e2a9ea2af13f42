"""The free search beats every published Megatron-LM configuration, and fits.

Each row of ``tests/data/published_runs.json`` (Narayanan et al., SC'21, Table 1) is planned
on the inputs of ``autopar.measure.validation`` twice (``bench/search_time.py``, ``compare_published``):
constrained to the configuration the paper ran (TP, PP, DP, interleaved 1F1B, full recomputation,
no ZeRO, sequence parallelism or offload; micro-batch and chunks free) and free. The free search
space contains the constrained one, so the free plan must fit and be no slower (a float tolerance
only).
``--durations`` shows each row's cost: the 145.6B row's free search is the longest.
"""

from __future__ import annotations

from functools import cache

import pytest

import autopar
from bench_scripts import load
from autopar.core.specs import Checkpoint, Schedule
from autopar.measure.validation import check_megatron_row, megatron_inputs

REL = 1e-9


bench = load("search_time", "search_time")
ROWS = bench.published_rows()
IDS = [bench.row_name(r) for r in ROWS]


@cache
def _comparison(index: int):
    return bench.compare_published(ROWS[index])


def test_published_rows_are_present() -> None:
    assert len(ROWS) >= 5, f"{bench.PUBLISHED_RUNS} is missing or has fewer than 5 rows"


@pytest.mark.parametrize("index", range(len(ROWS)), ids=IDS)
def test_free_plan_fits_and_is_no_slower_than_the_published_configuration(index: int) -> None:
    c = _comparison(index)
    free, fixed = c.free.estimate, c.constrained.estimate
    assert free.fits, f"free plan {c.free.summary()} needs {free.peak_memory_bytes / 2**30:.1f} GiB"
    assert free.step_time_s <= fixed.step_time_s * (1 + REL), (
        f"free {c.free.summary()} {free.step_time_s:.4f} s is slower than the published "
        f"configuration {c.constrained.summary()} {fixed.step_time_s:.4f} s")
    assert c.free.config.fusions == bench.MEGATRON_FUSIONS


@pytest.mark.parametrize("index", range(len(ROWS)), ids=IDS)
def test_constrained_plan_is_the_published_configuration(index: int) -> None:
    row, plan = ROWS[index], _comparison(index).constrained
    tp, pp = row["tensor_parallel_size"], row["pipeline_parallel_size"]
    c = plan.config
    assert (c.tp, c.pp, c.dp, c.cp, c.zero) == (tp, pp, row["num_gpus"] // (tp * pp), 1, 0)
    assert c.schedule is Schedule.INTERLEAVED and c.checkpoint is Checkpoint.FULL
    assert not c.sequence_parallel and not c.offload
    assert plan.estimate.fits
    assert all(alt.config.with_(micro_batch=c.micro_batch, virtual_stages=c.virtual_stages)
               == c for alt in plan.alternatives), "a runner-up left the published configuration"


@pytest.mark.parametrize("index", range(len(ROWS)), ids=IDS)
def test_inputs_and_search_agree_with_validation(index: int) -> None:
    """``megatron_inputs`` re-creates validation's inputs exactly, and the constrained search
    finds the configuration validation prices (the micro-batch and chunks of the authors'
    script) or a faster one: it sweeps both."""
    row = ROWS[index]
    check = check_megatron_row(row)
    model, cluster, train = megatron_inputs(row)
    again = autopar.estimate(model, cluster, train, check.estimate.config)
    assert again.step_time_s == check.estimate.step_time_s
    assert again.peak_memory_bytes == check.estimate.peak_memory_bytes
    plan = _comparison(index).constrained
    # Both price by one path (the per-op strategies solved for the configuration).
    assert plan.estimate.step_time_s <= check.estimate.step_time_s * (1 + REL)
