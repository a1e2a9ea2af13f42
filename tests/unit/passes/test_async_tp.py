"""Asynchronous tensor parallelism (the ``async_tp`` fusion): what the configuration, the
search, the price and the "What runs" table say of it. Its measured speedups are held in
``tests/unit/measure/test_published_runs.py``; a plan with it runs under ``autopar verify``
(``tests/dist/test_verify_cli.py``: eagerly on CPU ranks)."""

from __future__ import annotations

import pytest

import autopar
from autopar import ClusterSpec, ParallelConfig, TrainSpec
from autopar.core.errors import AutoparError
from autopar.report.execution import execution_lines

TRAIN = TrainSpec(global_batch=8, seq_len=1024, precision="bf16")


@pytest.fixture(scope="module")
def gpt():
    return autopar.models.build("gpt", num_layers=2, hidden_size=1024, num_heads=16,
                                vocab_size=512, seq_len=1024, device="meta")


def test_it_needs_tensor_and_sequence_parallelism() -> None:
    with pytest.raises(AutoparError, match="sequence parallelism"):
        ParallelConfig(dp=1, tp=2, fusions=("async_tp",))
    with pytest.raises(AutoparError, match="sequence parallelism"):
        ParallelConfig(dp=2, fusions=("async_tp",))
    ParallelConfig(tp=2, sequence_parallel=True, fusions=("async_tp",))


def test_it_hides_tensor_parallel_communication_and_nothing_else(gpt) -> None:
    cluster = ClusterSpec.preset("hgx-h100-80g")
    plain, overlapped = (autopar.estimate(gpt, cluster, TRAIN, ParallelConfig(
        dp=2, tp=4, sequence_parallel=True, micro_batch=2, fusions=f))
        for f in ((), ("async_tp",)))
    assert 0 < overlapped.time_breakdown["comm_tp"] < plain.time_breakdown["comm_tp"]
    for kind in ("compute", "recompute", "comm_dp", "bubble"):
        assert overlapped.time_breakdown.get(kind) == plain.time_breakdown.get(kind)
    assert overlapped.peak_memory_bytes == plain.peak_memory_bytes


def test_the_search_given_it_plans_tensor_and_sequence_parallelism_only(gpt) -> None:
    cluster = ClusterSpec.preset("hgx-h100-80g")
    plan = autopar.optimize(gpt, cluster, TRAIN, constraints={"fusions": ("async_tp",)},
                            keep=5)
    assert plan.alternatives
    for config in (plan.config, *(alt.config for alt in plan.alternatives)):
        assert config.tp > 1 and config.sequence_parallel and "async_tp" in config.fusions


def test_what_runs_says_where_the_overlap_runs() -> None:
    config = ParallelConfig(tp=2, sequence_parallel=True, fusions=("async_tp",))
    rows = dict(execution_lines(config, TRAIN, 2))
    assert "CUDA" in rows["async tp"] and "without the overlap" in rows["async tp"]
    assert "fused kernels" not in rows
