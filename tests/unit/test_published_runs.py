"""The cost model reproduces published training runs; these tests fail when it drifts.

Megatron-LM (Narayanan et al., SC'21, Table 1): each run in its published configuration (TP, PP,
DP = GPUs / (TP*PP), interleaved schedule, full recomputation; the fastest micro-batch and chunk
count that fit, as the paper tuned them), achieved TFLOP/s per GPU = the paper's Eq. 3 FLOPs over
the predicted step time and the GPU count, within +-10 % of the published figure.
ZeRO (Rajbhandari et al., SC'20, Figure 1): model-state memory per GPU within 2 %.
Selective recomputation (Korthikanti et al., MLSys'23, Tables 3 and 5): each model priced under
full recomputation and under sequence parallelism with selective recomputation; full is the
slower, by the published ratio of iteration times within 3 % (measured: 22B +2.4 %, 175B
+1.3 %, 530B +1.7 %, 1T -0.8 %), and selective keeps 34/t / 2 = 2.125 times full's activations
per layer (the paper's Table 2: 34*s*b*h/t against 2*s*b*h) within 1 %.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autopar.validation import (
    check_megatron_row,
    check_recompute_row,
    load_published,
    zero_model_states,
)


REPO = Path(__file__).resolve().parents[2]
SHARED_RUNS = REPO / "tests" / "data" / "published_runs.json"
MORE_RUNS = REPO / "tests" / "data" / "megatron_table1_more.json"
RECOMPUTE_RUNS = REPO / "tests" / "data" / "korthikanti_table5.json"
RATIO_TOLERANCE = 0.03
"""+-3 % on full / selective iteration time (the worst measured: +2.4 %, the 22B row)."""
TOLERANCE = 0.10
"""+-10 % on achieved TFLOP/s per GPU (the issue's bar for every published row)."""
ZERO_TOLERANCE = 0.02


def _rows(path) -> list[dict]:
    return json.loads(path.read_text())["rows"]


@pytest.mark.parametrize("row", _rows(SHARED_RUNS) + _rows(MORE_RUNS),
                         ids=lambda r: f"{r['params_billion']}B-tp{r['tensor_parallel_size']}"
                                       f"-pp{r['pipeline_parallel_size']}")
def test_megatron_run_within_ten_percent(row: dict) -> None:
    check = check_megatron_row(row)
    assert check.estimate.fits
    assert abs(check.error) <= TOLERANCE, (
        f"{row['params_billion']}B: predicted {check.predicted_tflops:.1f} TFLOP/s per GPU, "
        f"published {check.published_tflops:.0f} ({check.error:+.1%})")


def test_every_shared_row_is_checked(published_runs_path) -> None:
    assert len(load_published(published_runs_path)["rows"]) >= 5


def test_zero_memory_example_within_two_percent(published_runs_path) -> None:
    example = load_published(published_runs_path)["zero_example"]
    predicted = zero_model_states(example)
    for key, published in example["model_state_bytes_per_gpu_GB"].items():
        assert predicted[key] == pytest.approx(published, rel=ZERO_TOLERANCE), key


@pytest.mark.parametrize("row", _rows(RECOMPUTE_RUNS), ids=lambda r: f"{r['params_billion']}B")
def test_selective_recompute_speedup_and_memory_match_korthikanti(row: dict) -> None:
    check = check_recompute_row(row)
    assert check.full.fits and check.selective.fits
    assert check.full.step_time_s > check.selective.step_time_s  # the published order
    assert check.time_ratio == pytest.approx(check.published_time_ratio, rel=RATIO_TOLERANCE), (
        f"{row['params_billion']}B: full / selective predicted {check.time_ratio:.3f}, "
        f"published {check.published_time_ratio:.3f}")
    t = row["tensor_parallel_size"]
    assert check.memory_ratio == pytest.approx(34 / t / 2, rel=0.01)
