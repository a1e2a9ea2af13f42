"""The whole run priced (``costmodel/goodput.py``): time to train, checkpoints, failures."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from autopar import TrainSpec
from autopar.core.errors import AutoparError
from autopar.costmodel.goodput import (LLAMA3_DAYS, LLAMA3_GPUS, LLAMA3_INTERRUPTIONS,
                                       Reliability, checkpoint_bytes, goodput_of)

LLAMA3_405B_PARAMS = 405.9e9
TRAIN = TrainSpec(global_batch=2048, seq_len=8192)  # Llama 3 405B's 16M-token batches


def _llama3(**kw):
    # 7.1 s: autopar's plan of Meta's configuration (tp8 pp16 on 16,384 H100s, 2048 x 8192)
    return goodput_of(tokens=15.6e12, tokens_per_step=TRAIN.tokens_per_step, step_s=7.1,
                      gpus=LLAMA3_GPUS, params=LLAMA3_405B_PARAMS, train=TRAIN, **kw)


def test_llama3_405b_interruptions_and_goodput():
    """Meta's run: 419 unexpected interruptions in 54 days, > 90 % effective training time
    (Grattafiori et al. 2024, 3.3.4). The default rate is that run's, so the count is a
    consistency check of the arithmetic; the goodput is the model's own."""
    run = _llama3()
    assert run.interruptions_in(LLAMA3_DAYS) == pytest.approx(LLAMA3_INTERRUPTIONS, rel=0.3)
    assert run.goodput > 0.90
    assert run.mtbi_s == pytest.approx(3600 / (LLAMA3_GPUS * 1.97e-5), rel=0.01)


def test_checkpoint_is_master_weights_and_adam_moments():
    assert checkpoint_bytes(1e9, TRAIN) == 12e9  # fp32 master 4 + moments 8
    assert checkpoint_bytes(1e9, TrainSpec(global_batch=1, precision="bf16-pure")) == 6e9


def test_youngs_interval_minimises_the_overhead():
    run = _llama3(reliability=Reliability(relaunch_s=600.0, host_copy_bytes_per_s=1e9))
    assert run.interval_s > run.checkpoint_write_s  # Young's, not the write bound

    def overhead(tau):
        return run.checkpoint_blocking_s / tau + (tau / 2 + run.restart_s) / run.mtbi_s

    best = overhead(run.interval_s)
    assert best <= overhead(run.interval_s / 2) and best <= overhead(run.interval_s * 2)
    assert 1 / (1 + best) == pytest.approx(run.goodput)


def test_no_failures_leave_only_the_checkpoints_and_costs_scale():
    run = _llama3(reliability=Reliability(failure_rate_per_gpu_hour=0.0), gpu_hour_cost=2.0)
    assert run.interruptions == 0 and math.isinf(run.mtbi_s)
    assert run.goodput == pytest.approx(1.0, abs=1e-6)
    assert run.cost == pytest.approx(2.0 * run.gpu_hours)
    assert run.gpu_hours == pytest.approx(run.wall_s * LLAMA3_GPUS / 3600)


def test_a_less_reliable_cluster_takes_longer():
    base = _llama3()
    worse = _llama3(reliability=Reliability(failure_rate_per_gpu_hour=1e-4))
    assert worse.goodput < base.goodput and worse.wall_s > base.wall_s


def test_bad_input_is_a_clear_error():
    with pytest.raises(AutoparError, match="tokens"):
        goodput_of(tokens=0, tokens_per_step=1, step_s=1, gpus=1, params=1, train=TRAIN)
    with pytest.raises(AutoparError, match="failure_rate_per_gpu_hour"):
        Reliability(failure_rate_per_gpu_hour=-1)


def test_cli_prints_the_run_and_writes_it_to_json(tmp_path):
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "autopar", "plan", "--model", "gpt-1.7b", "--cluster",
           "hgx-h100-80g", "--nodes", "1", "--global-batch", "16", "--tokens", "1e10",
           "--gpu-hour-cost", "2", "--no-explain", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Time to train" in done.stdout and "goodput" in done.stdout
    run = json.loads(out.read_text())["goodput"]
    assert run["gpus"] == 8 and run["cost"] == pytest.approx(2 * run["gpu_hours"])
    without_tokens = [c for c in cmd if c not in ("--tokens", "1e10")]
    bad = subprocess.run(without_tokens, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "without --tokens" in bad.stderr


def test_sweep_sizes_double_in_whole_nodes():
    from autopar.cli.plan import sweep_sizes

    assert sweep_sizes("1024:16384", 8) == [1024, 2048, 4096, 8192, 16384]
    assert sweep_sizes("4:16", 8) == [8, 16]  # 4 GPUs are one node of 8
    with pytest.raises(AutoparError, match="A:B"):
        sweep_sizes("1024-16384", 8)


def test_cli_sweep_tabulates_each_size(tmp_path):
    out = tmp_path / "sweep.json"
    cmd = [sys.executable, "-m", "autopar", "plan", "--model", "gpt-1.7b", "--cluster",
           "hgx-h100-80g", "--global-batch", "64", "--tokens", "1e10", "--sweep-gpus", "8:32",
           "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Time to train against GPUs" in done.stdout
    sweep = json.loads(out.read_text())["sweep"]
    assert [row["gpus"] for row in sweep] == [8, 16, 32]
    days = [row["goodput"]["wall_s"] for row in sweep]
    assert days[0] > days[-1]  # more GPUs, fewer days


def test_the_cluster_carries_its_rates_and_a_file_sets_them(tmp_path):
    from autopar import ClusterSpec

    preset = ClusterSpec.preset("hgx-h100-80g", nodes=2)
    r = Reliability.of(preset)
    assert r.failure_rate_per_gpu_hour == pytest.approx(1.97e-5, rel=0.01)
    assert r.host_copy_bytes_per_s == preset.host_link.bytes_per_s
    path = tmp_path / "c.yaml"
    path.write_text("base: hgx-h100-80g\nnodes: 2\nfailure_rate_per_gpu_hour: 1e-4\n"
                    "checkpoint_bytes_per_s: 5e11\nrelaunch_s: 120\n")
    mine = ClusterSpec.from_file(path)
    assert Reliability.of(mine) == Reliability(1e-4, 5e11, preset.host_link.bytes_per_s, 120.0)
    assert ClusterSpec.from_dict(mine.to_dict()) == mine
    path.write_text("base: hgx-h100-80g\nrelaunch_s: -5\n")
    with pytest.raises(AutoparError, match="relaunch_s"):
        ClusterSpec.from_file(path)


def test_checkpoints_fall_between_steps():
    """A save runs between two steps: the interval is a whole number of them, at least one
    and at least the asynchronous write, the better of the two about Young's interval."""
    fast = _llama3()  # Young's interval (~10 s) near one 7.1 s step
    assert fast.interval_steps >= 1
    assert fast.interval_s == pytest.approx(fast.interval_steps * fast.step_s)
    assert fast.interval_s >= fast.checkpoint_write_s
    slow_write = _llama3(reliability=Reliability(storage_bytes_per_s=1e11))  # 49 s writes
    assert slow_write.interval_steps == math.ceil(slow_write.checkpoint_write_s / 7.1)
