"""The cost model's step time against steps measured on a GPU (tests/data/gpu_steps.json: the
GPU check's part 4 on an H200), with the profile measured on the same GPU in the same run: what
autopar's own engine runs, bf16 and fp8, every checkpoint policy.

Tolerances: 10 % on each step whose time the model prices (measured errors 2026-11-28: bf16
-3.8 % (none, selective), +4.3 % (full); fp8 -7.2 %, -2.0 %, -1.6 %); the matmuls policy is a
known miss the data file explains (host-bound), held to its measured side and 40 %."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_scripts import load

DATA = json.loads((Path(__file__).parents[2] / "data" / "gpu_steps.json").read_text())
ROOT = Path(__file__).parents[3]
TOLERANCE = 0.10
MATMULS_TOLERANCE = 0.40


@pytest.fixture(scope="module")
def predicted() -> dict[tuple[str, str], float]:
    from autopar.costmodel.cluster import process_cluster
    from autopar.costmodel.profile import Profile

    step = load("gpu_step", "bench_gpu_step")
    cluster = process_cluster(1, DATA["preset"]).with_profile(
        Profile.load(str(ROOT / DATA["profile"])))
    return {(r["precision"], r["checkpoint"]): step.plan_of(
                step.MODEL, r["precision"], r["checkpoint"], cluster).estimate.step_time_s
            for r in DATA["runs"]}


@pytest.mark.parametrize("run", DATA["runs"], ids=lambda r: f"{r['precision']}-{r['checkpoint']}")
def test_step_time_within_tolerance_of_the_measured_step(run, predicted):
    error = predicted[run["precision"], run["checkpoint"]] / run["step_s"] - 1
    if run["checkpoint"] in DATA["known_misses"]:
        assert -MATMULS_TOLERANCE < error < 0, error
    else:
        assert abs(error) <= TOLERANCE, error


def test_fp8_on_the_engine_is_predicted_slower_than_bf16_as_measured(predicted):
    """torchao's eager float8 linears: measured 2.2-3.0x bf16's step; predicted in the same
    order, and the ratio within 10 % where the step is priced (not matmuls)."""
    measured = {(r["precision"], r["checkpoint"]): r["step_s"] for r in DATA["runs"]}
    for policy in ("none", "selective", "full"):
        ratio = predicted["fp8", policy] / predicted["bf16", policy]
        real = measured["fp8", policy] / measured["bf16", policy]
        assert ratio > 1 and abs(ratio / real - 1) <= TOLERANCE, (policy, ratio, real)
