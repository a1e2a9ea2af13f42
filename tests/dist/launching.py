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
