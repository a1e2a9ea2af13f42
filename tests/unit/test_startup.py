"""Start-up stays light: ``import autopar`` and ``autopar --help`` load neither torch nor
matplotlib (each seconds to import; ``bench/startup.py`` times them, tests do not time)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "matplotlib", "ortools", "networkx", "triton")

_PROBE = """
import json, runpy, sys
args = {args!r}
if args:
    sys.argv = ["autopar", *args]
    try:
        runpy.run_module("autopar", run_name="__main__")
    except SystemExit as done:
        assert done.code == 0, done.code
else:
    import autopar
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def _modules(args: list[str]) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _PROBE.format(args=args)], capture_output=True,
                          text=True, timeout=120, check=True)
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("args", [[], ["--help"], ["plan", "--help"], ["compare", "--help"]],
                         ids=["import autopar", "autopar --help", "autopar plan --help",
                              "autopar compare --help"])
def test_start_up_loads_no_heavy_package(args: list[str]) -> None:
    loaded = _modules(args)
    assert "autopar" in loaded
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert heavy == [], f"{heavy[:5]} loaded"


def test_the_probe_sees_a_heavy_import() -> None:
    """The check can fail: a module that imports matplotlib is caught."""
    done = subprocess.run([sys.executable, "-c", "import sys, json, matplotlib.figure; "
                           "print(json.dumps(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=120, check=True)
    assert any(m.split(".")[0] in HEAVY for m in json.loads(done.stdout))
