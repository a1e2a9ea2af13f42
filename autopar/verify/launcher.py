"""The ranks of a run on this machine: start ``nproc`` processes of a worker on a job, wait for
them, and say how they failed. ``autopar verify`` (``autopar.verify.run``) and ``autopar profile``
(``autopar.measure.profiling``) both start their ranks here; the protocol is ``torchrun``'s
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).

The ranks are forked from a ``multiprocessing`` forkserver that has imported the workers once
(``WORKER_MODULES``: torch, torch.distributed, autopar's passes -- about 3 s of CPU a process
on the 2-core CI machine, paid once per session instead of once per rank); each rank sets
its environment, sends its output to its log and runs the worker module as ``__main__``,
as ``python -m`` would. Where a run needs an environment the forkserver's imports did not see
(``TRITON_INTERPRET`` for Triton's CPU interpreter, read when Triton is imported), where the
calling process's ``__main__`` is a script ``multiprocessing`` would run again in each rank,
or on a platform without fork, the ranks start as fresh interpreters instead.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import runpy
import signal
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


WORKER_MODULES = ("autopar.verify.worker", "autopar.measure.profiling_worker")
"""The worker modules the forkserver imports once (module docstring)."""


class ForkedRank:
    """A rank forked from the forkserver, with the part of ``subprocess.Popen``'s interface
    the launcher uses (``poll``, ``kill``, ``wait``)."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self.process = process

    def poll(self) -> int | None:
        return self.process.exitcode

    def kill(self) -> None:
        self.process.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        self.process.join(timeout)
        return self.process.exitcode


Rank = subprocess.Popen | ForkedRank
"""A started rank."""

_FORKSERVER: multiprocessing.context.BaseContext | None = None


def _main_is_safe() -> bool:
    """Whether a forked rank may import this process's ``__main__`` again, as
    ``multiprocessing`` does in every child: a module run with ``python -m`` (pytest,
    ``python -m autopar``, which multiprocessing leaves alone), an interactive session, or the
    ``autopar`` console script; a script of the user's may have no ``__main__`` guard and
    would run again in every rank."""
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    path = getattr(main, "__file__", None)
    return path is None or spec_name.endswith("__main__") or Path(path).name == "autopar"


def _forkserver() -> multiprocessing.context.BaseContext | None:
    """The forkserver context with the workers preloaded; ``None`` where fork is unavailable
    or this process's ``__main__`` is not safe to import again (``_main_is_safe``)."""
    global _FORKSERVER
    if not _main_is_safe():
        return None
    if _FORKSERVER is None:
        if "forkserver" not in multiprocessing.get_all_start_methods():
            return None
        _FORKSERVER = multiprocessing.get_context("forkserver")
        _FORKSERVER.set_forkserver_preload(list(WORKER_MODULES))
    return _FORKSERVER


def _forked_rank(module: str, job: str, env: dict[str, str], log: str) -> None:
    """A forked rank: its environment, its output to ``log``, ``module`` run as ``__main__``."""
    os.environ.clear()
    os.environ.update(env)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.argv = [module, job]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def start_ranks(job: dict, nproc: int, folder: Path, *, worker: tuple[str, ...] = WORKER,
                env: dict[str, str] | None = None) -> list[Rank]:
    """Write ``job`` to ``folder/job.json`` and start ``nproc`` gloo ranks of ``worker`` on it
    with the environment torchrun gives (``env`` adds defaults; each rank's output in
    ``rank<R>.log``). They run while the caller goes on; ``wait_ranks`` collects them."""
    (folder / "job.json").write_text(json.dumps(job))
    port = _free_port()
    # a default the parent's environment lacks would reach the ranks after the forkserver's
    # imports read it: such a run starts fresh interpreters
    fresh = any(k not in os.environ for k in (env or {}))
    ctx = None if fresh or worker[0] != "-m" or worker[1] not in WORKER_MODULES \
        else _forkserver()
    procs: list[Rank] = []
    for rank in range(nproc):
        rank_env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                        WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        for key, value in (env or {}).items():
            rank_env.setdefault(key, value)
        log = folder / f"rank{rank}.log"
        if ctx is not None:
            log.touch()  # there to read even if the rank dies before it opens it
            process = ctx.Process(target=_forked_rank, name=f"rank{rank}",
                                  args=(worker[1], str(folder / "job.json"), rank_env,
                                        str(log)))
            process.start()
            procs.append(ForkedRank(process))
            continue
        with open(log, "w") as out:  # the child keeps its own handle
            procs.append(subprocess.Popen(
                [sys.executable, *worker, str(folder / "job.json")],
                env=rank_env, stdout=out, stderr=subprocess.STDOUT))
    return procs


def wait_ranks(procs: list[Rank], folder: Path, timeout_s: float) -> list[dict]:
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
            crashed = _crashed(procs, folder)
            kill_ranks(procs)
            _raise_failure(folder, nproc, sorted(folder.glob("rank*.error")), timeout_s,
                           crashed)
        time.sleep(0.05)


def kill_ranks(procs: list[Rank]) -> None:
    """Kill the ranks still running and reap them."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


class ProgramFailed(AutoparError):
    """The sharded program started and a rank failed or hung: a finding, not a refusal."""


def _crashed(procs: list[Rank], folder: Path) -> dict[int, int]:
    """The ranks that ended with a failing exit code and no error file -- killed by a signal
    or aborted in native code, which no ``except`` sees -- and their exit codes."""
    return {r: p.poll() for r, p in enumerate(procs)
            if p.poll() not in (None, 0) and not (folder / f"rank{r}.error").exists()}


KILLED_BY_SIGNAL = "was killed by SIG"
"""How a failure names a rank a signal ended (``SIGABRT``, ``SIGSEGV``: a crash in native
code); ``tests/dist/conftest.py`` reruns a test once on it."""


def _exit_words(code: int) -> str:
    if code < 0:
        try:  # KILLED_BY_SIGNAL's words, with the signal's name
            return f"was killed by {signal.Signals(-code).name} (a crash in native code)"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def _raise_failure(folder: Path, nproc: int, errors: list[Path], timeout_s: float,
                   crashed: dict[int, int] | None = None) -> None:
    if crashed:
        # a rank that died in native code (its peers then report a lost connection) is the
        # cause; its log holds the faulthandler's traceback
        rank, code = min(crashed.items())
        tail = (folder / f"rank{rank}.log").read_text().strip().splitlines()[-8:]
        detail = (f"rank{rank} {_exit_words(code)} and wrote no error file; its log ends: "
                  + " | ".join(tail))
    elif errors:
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
