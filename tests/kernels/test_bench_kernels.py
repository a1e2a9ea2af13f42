"""bench/fused_kernels.py without a GPU: a clear refusal, and its tables from given measurements."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_parity import BENCH_SCRIPT, bench_module  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_bench_without_a_gpu_exits_2_with_a_message_not_a_traceback():
    run = subprocess.run([sys.executable, str(BENCH_SCRIPT)], capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 2
    assert "needs a CUDA GPU" in run.stderr and "Traceback" not in run.stderr


def test_bench_refuses_an_op_it_does_not_time_on_any_machine():
    run = subprocess.run([sys.executable, str(BENCH_SCRIPT), "--only", "rms_norm,softmax"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 2 and "unknown ops ['softmax']" in run.stderr


def test_bench_markdown_judges_the_targets():
    bench = bench_module()
    rows = [
        bench.Row("rms_norm", "16384x8192 bf16", "fwd", 0.30, 0.60, 0.32, 2900.0, 0.90),
        bench.Row("rope", "q ...", "fwd", 0.30, 0.60, 0.28, 2900.0, 0.90),  # slower than compile
        bench.Row("linear_cross_entropy", "8192 tokens", "fwd+bwd", 30.0, 33.0, 31.0, None, None),
    ]
    text = bench.markdown(rows, (6_300_000_000, 700_000_000, 1_100_000_000), "NVIDIA H100",
                          3.0e12, "torch 2.13")
    lines = text.splitlines()
    assert lines[0] == "# Fused Triton kernels on NVIDIA H100"
    assert any("GPU: NVIDIA H100" in line for line in lines)
    rms, rope, loss = (next(line for line in lines if line.startswith(f"| {op} |"))
                       for op in ("rms_norm", "rope", "linear_cross_entropy"))
    assert rms.endswith("| 90.0 | 2.00x | 1.07x | met |")
    assert rope.endswith("| 0.93x | NOT met |")
    assert "| - | - |" in loss
    assert lines[-1] == "| 6.30 | 0.70 | 1.10 | 1/9.0 | met |"
