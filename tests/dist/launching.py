"""Running an exported folder's ``launch.sh`` (torchrun, gloo CPU processes) and reading the
JSON log its ``train.py`` writes; shared by the export tests."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(folder: Path, *args: str, timeout: float = 120.0) -> tuple[float, str]:
    """``bash launch.sh ARGS``; returns (wall seconds, output for failure messages)."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()),
               RDZV_ID=f"test-{folder.name}",
               TORCHRUN=str(torchrun) if torchrun.exists() else shutil.which("torchrun") or "")
    start = time.monotonic()
    done = subprocess.run(["bash", str(folder / "launch.sh"), *args], env=env, timeout=timeout,
                          capture_output=True, text=True)
    output = f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return time.monotonic() - start, output


def losses_of(log: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return {r["step"]: r["loss"] for r in lines if "loss" in r}


def events(log: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if r.get("event") == kind]


def train_then_resume(tmp_path: Path, spec, train, plan_a, plan_b, *, rel: float,
                      save_b: bool = False) -> dict:
    """Plan ``spec`` under ``plan_a`` and ``plan_b`` (``ParallelConfig``) for 4 processes and
    export both; A trains 4 steps on the one-process reference's losses (within ``rel``),
    saving at step 2; B resumes A's step-2 checkpoint and its steps 3 and 4 are A's (B saves
    its step 4 when ``save_b``). Returns the plans, folders and each run's losses."""
    import math

    import pytest

    import autopar
    from autopar.costmodel.cluster import process_cluster
    from autopar.verify.run import reference

    model = spec.build("meta")
    plans = {k: autopar.plan_for(model, process_cluster(4), train, c, name=spec.label)
             for k, c in (("a", plan_a), ("b", plan_b))}
    folders = {k: p.export(tmp_path / k, spec) for k, p in plans.items()}
    log_a, log_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    wall_a, out_a = launch(folders["a"], "--steps", "4", "--save-every", "2",
                           "--checkpoint-dir", str(tmp_path / "ckpt-a"), "--log-file", str(log_a))
    print(f"plan A ({plans['a'].estimate.summary()}) run: {wall_a:.1f} s")
    losses_a = losses_of(log_a)
    assert sorted(losses_a) == [1, 2, 3, 4], out_a
    assert (tmp_path / "ckpt-a" / "step-2" / ".metadata").exists(), out_a
    expected = reference(spec, plans["a"], steps=4, seed=0).losses
    for step, ref in enumerate(expected, 1):
        assert losses_a[step] == pytest.approx(ref, rel=rel), (step, losses_a, expected)
    saving = ["--save-every", "2"] if save_b else []
    wall_b, out_b = launch(folders["b"], "--steps", "4", "--resume",
                           str(tmp_path / "ckpt-a" / "step-2"), *saving, "--checkpoint-dir",
                           str(tmp_path / "ckpt-b"), "--log-file", str(log_b))
    print(f"plan B ({plans['b'].estimate.summary()}) resumed run: {wall_b:.1f} s")
    assert [r["step"] for r in events(log_b, "resume")] == [2], out_b
    losses_b = losses_of(log_b)
    assert sorted(losses_b) == [3, 4], out_b
    for step in (3, 4):
        assert math.isfinite(losses_b[step])
        assert losses_b[step] == pytest.approx(losses_a[step], rel=rel), (losses_a, losses_b)
    return {"plans": plans, "folders": folders, "a": losses_a, "b": losses_b}


def resume_a_from_b(tmp_path: Path, spec, run: dict, *, rel: float) -> None:
    """...and back: plan A (of ``train_then_resume(..., save_b=True)``'s ``run``) reads B's
    step-4 checkpoint and trains steps 5 and 6 on the one-process reference's losses."""
    import pytest

    from autopar.verify.run import reference

    log_c = tmp_path / "c.jsonl"
    _, out_c = launch(run["folders"]["a"], "--steps", "6", "--resume",
                      str(tmp_path / "ckpt-b" / "step-4"), "--checkpoint-dir",
                      str(tmp_path / "ckpt-c"), "--log-file", str(log_c))
    losses_c = losses_of(log_c)
    assert sorted(losses_c) == [5, 6], out_c
    longer = reference(spec, run["plans"]["a"], steps=6, seed=0).losses
    for step in (5, 6):
        assert losses_c[step] == pytest.approx(longer[step - 1], rel=rel), (losses_c, longer)
