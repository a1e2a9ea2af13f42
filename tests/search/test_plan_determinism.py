"""Identical inputs give a byte-identical plan (API.md: ``plan.to_json()`` is byte-identical for
identical inputs): across calls, across freshly built models, across processes with different
hash seeds, through a JSON round trip, and whatever the time limit or worker count.

GPT-1.7B on 2 DGX A100 nodes, global batch 64 x 2048 tokens: it has runner-ups with tied step
times (dp x cp splits of the same tokens), so the tie-breaking is exercised too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import autopar
from autopar import ClusterSpec, Plan, TrainSpec
from autopar.search import ilp, tp_solve
from autopar.search.ilp_backends import Backend

REPO = Path(__file__).resolve().parents[2]
MODEL, CLUSTER, NODES, BATCH, SEQ = "gpt-1.7b", "dgx-a100-80g", 2, 64, 2048
SCRIPT = f"""
import sys, autopar
from autopar import ClusterSpec, TrainSpec
plan = autopar.optimize(autopar.models.build({MODEL!r}, device="meta"),
                        ClusterSpec.preset({CLUSTER!r}, nodes={NODES}),
                        TrainSpec(global_batch={BATCH}, seq_len={SEQ}))
sys.stdout.write(plan.to_json())
"""


def _optimize(**kwargs) -> Plan:
    return autopar.optimize(autopar.models.build(MODEL, device="meta"),
                            ClusterSpec.preset(CLUSTER, nodes=NODES),
                            TrainSpec(global_batch=BATCH, seq_len=SEQ), **kwargs)


@pytest.fixture(scope="module")
def plan_json() -> str:
    return _optimize().to_json()


def test_the_instance_has_runner_ups(plan_json: str) -> None:
    assert len(Plan.from_json(plan_json).alternatives) >= 2


def test_two_calls_give_byte_identical_json(plan_json: str) -> None:
    assert _optimize().to_json() == plan_json


def test_json_round_trip_is_byte_identical(plan_json: str) -> None:
    plan = Plan.from_json(plan_json)
    assert plan.to_json() == plan_json
    assert Plan.from_json(plan.to_json()) == plan


def test_same_json_in_a_process_with_another_hash_seed(plan_json: str) -> None:
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, check=True,
                         capture_output=True, text=True, timeout=300)
    assert out.stdout == plan_json


def test_a_generous_time_limit_does_not_change_the_plan(plan_json: str) -> None:
    assert _optimize(time_limit_s=600.0).to_json() == plan_json


@pytest.mark.parametrize("backend", [Backend.HIGHS, Backend.CP_SAT])
def test_worker_count_does_not_change_the_plan(plan_json: str, backend: Backend,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-op solves run with one worker (``tp_solve``); with 2 or 8 the plan is the same,
    for the default back end and for CP-SAT's portfolio, whose tie-break makes its optimum
    unique (``search/ilp.py``, "Determinism")."""
    plans, calls = {}, []
    for workers in (1, 2, 8):
        def solve(problem: ilp.BlockProblem, *, workers: int = workers, **_: object
                  ) -> ilp.Solution:
            calls.append(workers)
            return ilp.solve(problem, num_workers=workers, backend=backend,
                             time_limit_s=tp_solve.SOLVE_TIME_LIMIT_S)

        monkeypatch.setattr(tp_solve, "solve", solve)
        plans[workers] = _optimize().to_json()
    assert sorted(set(calls)) == [1, 2, 8]  # the solves ran with each worker count
    assert plans[2] == plans[1] and plans[8] == plans[1]
    if backend is Backend.HIGHS:
        assert plans[1] == plan_json
