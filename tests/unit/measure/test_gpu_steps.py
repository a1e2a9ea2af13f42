"""The cost model's step time and peak memory against steps measured on a GPU
(tests/data/gpu_steps.json: the GPU check's part 4 on an H200, twice, and the MoE steps of
``bench/gpu_step.py --model moe``), each with the profile measured on the same GPU in the same
run: what autopar's own engine runs, bf16 and fp8, every checkpoint policy.

Tolerances: 10 % on each step whose time the model prices (measured errors 2026-11-28, first
run: bf16 -3.8 % (none, selective), +4.3 % (full); fp8 -7.2 %, -2.0 %, -1.6 %; second run:
bf16 -8.2 %, -8.8 %, -3.7 %; fp8 +1.4 %, +0.9 %, +4.7 %); the matmuls policy is a known miss the
data file explains (host-bound), held to its measured side and 40 %. The MoE steps are a known
miss too (the engine's routed experts are not the grouped GEMMs priced): held to their measured
side and within 12x (measured 4.2-10.4x); their peak memory within 3 % (measured -1.7 % to 0.0 %,
the issue's bound for the memory grid)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_scripts import load

DATA = json.loads((Path(__file__).parents[2] / "data" / "gpu_steps.json").read_text())
ROOT = Path(__file__).parents[3]
TOLERANCE = 0.10
MATMULS_TOLERANCE = 0.40
RATIO_TOLERANCE = 0.15
"""fp8's step over bf16's, predicted against measured: each step is held to 10 %, so their
ratio could be 22 % off; measured +10.5 % on the second run (bf16 -8.2 %, fp8 +1.4 %; the
first run's fp8 steps were 10 % slower than the second's on the same card and software)."""
MOE_MISS = 12.0
MEMORY_TOLERANCE = 0.03
GiB = 2**30
RUNS = [(i, r) for i, s in enumerate(DATA["sessions"]) for r in s["runs"]]


def _cluster(profile: str):
    from autopar.costmodel.cluster import process_cluster
    from autopar.costmodel.profile import Profile

    return process_cluster(1, DATA["preset"]).with_profile(Profile.load(str(ROOT / profile)))


@pytest.fixture(scope="module")
def step():
    return load("gpu_step", "bench_gpu_step")


@pytest.fixture(scope="module")
def predicted(step) -> dict[tuple[int, str, str], float]:
    out = {}
    for i, session in enumerate(DATA["sessions"]):
        cluster = _cluster(session["profile"])
        for r in session["runs"]:
            out[i, r["precision"], r["checkpoint"]] = step.plan_of(
                step.MODEL, r["precision"], r["checkpoint"], cluster).estimate.step_time_s
    return out


@pytest.mark.parametrize("session,run", RUNS,
                         ids=lambda x: x if isinstance(x, int) else
                         f"{x['precision']}-{x['checkpoint']}")
def test_step_time_within_tolerance_of_the_measured_step(session, run, predicted):
    error = predicted[session, run["precision"], run["checkpoint"]] / run["step_s"] - 1
    if run["checkpoint"] in DATA["known_misses"]:
        assert -MATMULS_TOLERANCE < error < 0, error
    else:
        assert abs(error) <= TOLERANCE, error


@pytest.mark.parametrize("session", range(len(DATA["sessions"])))
def test_fp8_on_the_engine_is_predicted_slower_than_bf16_as_measured(session, predicted):
    """torchao's eager float8 linears: measured 2.2-3.0x bf16's step; predicted in the same
    order, and the ratio within ``RATIO_TOLERANCE`` where the step is priced (not matmuls)."""
    measured = {(r["precision"], r["checkpoint"]): r["step_s"]
                for r in DATA["sessions"][session]["runs"]}
    for policy in ("none", "selective", "full"):
        ratio = predicted[session, "fp8", policy] / predicted[session, "bf16", policy]
        real = measured["fp8", policy] / measured["bf16", policy]
        assert ratio > 1 and abs(ratio / real - 1) <= RATIO_TOLERANCE, (policy, ratio, real)


@pytest.mark.parametrize("run", DATA["moe"]["runs"],
                         ids=lambda r: f"{r['case']}-{r['checkpoint']}".replace(" ", "-"))
def test_moe_step_memory_and_its_known_time_miss(run, step):
    """The MoE program's peak within 3 % of the estimate; its step slower than priced, as the
    data file's known miss says, and by no more than ``MOE_MISS``."""
    case = {c.label: c for c in step.CASES["moe"]}[run["case"]]
    plan = step.plan_of(case.spec, run["precision"], run["checkpoint"],
                        _cluster(DATA["moe"]["profile"]))
    assert abs(plan.estimate.peak_memory_bytes / GiB / run["allocated_gib"] - 1) \
        <= MEMORY_TOLERANCE
    slower = run["step_s"] / plan.estimate.step_time_s
    assert "moe" in DATA["known_misses"] and 1 < slower < MOE_MISS, slower
