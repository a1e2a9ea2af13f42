"""Property-based verification in CI: a fixed-seed sample of random small models and plans
(``autopar.verify.cases``), each of which must pass ``autopar verify`` or be refused before
any process starts, with its reason. ``bench/fuzz_verify.py`` runs the longer sample recorded
in ``bench/results/fuzz_verify.md``; this one fits the CI budget (about a minute)."""

from __future__ import annotations

import pytest

from autopar import AutoparError
from autopar.verify.cases import Outcome, draw_cases, plan_case, run_case

SEED = 20261123
CASES = draw_cases(SEED, 10)


@pytest.mark.parametrize("case", CASES, ids=[f"case{c.index}" for c in CASES])
def test_a_random_plan_passes_or_is_refused_up_front(case):
    result = run_case(case, steps=2)
    assert result.outcome in (Outcome.PASSED, Outcome.REFUSED), \
        f"{case.describe()}: {result.outcome.value}: {result.reason}"
    if result.outcome is Outcome.REFUSED:
        assert "Where:" in result.reason and "What to do:" in result.reason, result.reason


def test_the_sample_holds_programs_to_run_and_plans_to_refuse():
    """Planning alone (no process): most of the sample runs, and some of it is refused -- a
    sample of refusals only would test nothing."""
    refused = 0
    for case in CASES:
        try:
            plan_case(case)
        except AutoparError:
            refused += 1
    assert 1 <= refused <= len(CASES) - 5, refused
