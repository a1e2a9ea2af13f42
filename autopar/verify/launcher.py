"""The ranks of a run on this machine: start ``nproc`` processes of a worker on a job, wait for
them, and say how they failed. ``autopar verify`` (``autopar.verify.run``) and ``autopar profile``
(``autopar.measure.profiling``) both start their ranks here; the protocol is ``torchrun``'s
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from autopar.core.errors import AutoparError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORKER = ("-m", "autopar.verify.worker")
"""What the ranks run (``python WORKER JOB.json``): ``autopar.verify.worker``, whose ``main``
is the rank side of ``start_ranks`` and ``wait_ranks``."""


def start_ranks(job: dict, nproc: int, folder: Path, *, worker: tuple[str, ...] = WORKER,
                env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Write ``job`` to ``folder/job.json`` and start ``nproc`` gloo ranks of ``worker`` on it
    with the environment torchrun gives (``env`` adds defaults; each rank's output in
    ``rank<R>.log``). They run while the caller goes on; ``wait_ranks`` collects them."""
    (folder / "job.json").write_text(json.dumps(job))
    port = _free_port()
    procs = []
    for rank in range(nproc):
        rank_env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                        WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        for key, value in (env or {}).items():
            rank_env.setdefault(key, value)
        with open(folder / f"rank{rank}.log", "w") as log:  # the child keeps its own handle
            procs.append(subprocess.Popen(
                [sys.executable, *worker, str(folder / "job.json")],
                env=rank_env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def wait_ranks(procs: list[subprocess.Popen], folder: Path, timeout_s: float) -> list[dict]:
    """The ranks' results, read from the files they write (``rank<R>.pt``, not their exit
    codes); kills them all and raises ``ProgramFailed`` when one failed (after a grace for the
    others to report) or time ran out."""
    nproc = len(procs)
    deadline = time.monotonic() + timeout_s
    failed_at = None
    while True:
        done = all((folder / f"rank{r}.pt").exists() for r in range(nproc))
        exited = all(p.poll() is not None for p in procs)
        if done and exited:
            return [torch.load(folder / f"rank{r}.pt") for r in range(nproc)]
        errors = sorted(folder.glob("rank*.error"))
        if errors and failed_at is None:
            failed_at = time.monotonic()
        grace_over = failed_at is not None and time.monotonic() - failed_at > 3.0
        if grace_over or exited or time.monotonic() > deadline:
            kill_ranks(procs)
            _raise_failure(folder, nproc, sorted(folder.glob("rank*.error")), timeout_s)
        time.sleep(0.05)


def kill_ranks(procs: list[subprocess.Popen]) -> None:
    """Kill the ranks still running and reap them."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


class ProgramFailed(AutoparError):
    """The sharded program started and a rank failed or hung: a finding, not a refusal."""


def _raise_failure(folder: Path, nproc: int, errors: list[Path], timeout_s: float) -> None:
    if errors:
        # the first rank to fail is the cause; the others mostly lost a peer
        first = min(errors, key=lambda e: e.stat().st_mtime)
        text = first.read_text().strip().splitlines()
        detail = f"{first.stem} failed: " + " | ".join(text[-6:])
    else:
        logs = [(folder / f"rank{r}.log").read_text()[-600:] for r in range(nproc)]
        detail = (f"not every rank finished within {timeout_s:.0f} s; last output: "
                  + " | ".join(line for line in logs if line))
    raise ProgramFailed(f"the sharded program did not run: {detail}",
                       where=f"autopar verify (logs in {folder})",
                       fix="run again with --debug; if the plan came from an older version, "
                           "re-plan it")


DEVICES = ("cpu", "cuda")
"""Where the ranks run: CPU processes with gloo, or one CUDA GPU per rank with NCCL."""


def check_device(device: str, nproc: int, *, what: str = "the plan's",
                 fix: str = "verify on CPU processes (--device cpu, the default), or on a "
                            "machine with a GPU per rank") -> None:
    """Refuse (``AutoparError``, with ``fix``) a ``device`` that ``nproc`` processes started by
    ``start_ranks`` cannot run on: not one of ``DEVICES``, or ``cuda`` with fewer GPUs than
    processes. ``what`` names whose processes they are (``autopar profile`` says its own)."""
    if device not in DEVICES:
        raise AutoparError(f"unknown device {device!r}", where="--device",
                           fix=f"use one of {', '.join(DEVICES)}")
    if device == "cuda" and torch.cuda.device_count() < nproc:
        have = torch.cuda.device_count()
        raise AutoparError(
            (f"{what} {nproc} ranks on CUDA need a GPU each; " if nproc > 1
             else f"{what} one rank on CUDA needs a GPU; ")
            + (f"this machine has {have}" if have else "this machine has no CUDA GPU")
            + f" (torch {torch.__version__}, CUDA {torch.version.cuda or 'none'})",
            where="--device cuda", fix=fix)
