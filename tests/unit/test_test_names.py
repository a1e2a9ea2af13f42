"""Every test module has a basename of its own across tests/: pytest imports test modules by
basename (rootdir-relative, no packages), so two ``test_x.py`` in different folders stop the
whole run at collection (it happened twice: tests/unit and tests/dist)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path


def test_no_two_test_modules_share_a_basename() -> None:
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = defaultdict(list)
    for path in tests.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(tests)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
