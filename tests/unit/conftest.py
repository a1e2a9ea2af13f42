from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_RUNS = REPO / "tests" / "data" / "published_runs.json"


@pytest.fixture(scope="session")
def published_runs_path() -> Path:
    if not SHARED_RUNS.exists():
        pytest.fail(f"{SHARED_RUNS} is missing: the published runs live in tests/data/")
    return SHARED_RUNS
