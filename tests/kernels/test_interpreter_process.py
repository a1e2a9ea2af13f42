"""The interpreter tests in a fresh process, when this one imported Triton without it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autopar.kernels._launch import interpreting

HERE = Path(__file__).resolve().parent


def test_kernel_suite_passes_in_a_fresh_interpreter_process():
    if interpreting():
        pytest.skip("this process runs the kernels in Triton's interpreter itself")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(HERE / "test_kernels.py")],
        env=env, capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    summary = run.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, summary
