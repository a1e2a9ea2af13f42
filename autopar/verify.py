"""``autopar verify``: prove that a plan's sharded program computes what the model computes.

Starts ``nproc`` processes (``autopar.verify_worker``; the same environment protocol as
``torchrun``) -- CPU ranks with gloo, or with ``device="cuda"`` one GPU per rank with NCCL --,
trains ``steps`` steps of the plan from the same seed, weights and
tokens as one plain process doing the same steps (``autopar.verify_reference``), and compares
the loss of every step, every gradient of the last step and every parameter after the last
optimizer step, each against a written bound (``autopar.verify_measures``, which explains the
measures and where the bounds come from). Everything that can be checked is checked before a
process starts: the model builds, and the plan is admissible for it and executable.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from autopar.core.errors import AutoparError
from autopar.core.specs import Precision
from autopar.core.model_spec import ModelSpec
from autopar.passes.mesh import executable_spec
from autopar.core.plan import Plan
from autopar.training import OPTIMIZER
from autopar.verify_dropout import without_dropout
from autopar.verify_measures import (
    TOLERANCES,
    Diff,
    VerifyResult,
    compare,
    measure_run,
)
from autopar.verify_reference import reference

__all__ = ["TOLERANCES", "Diff", "ProgramFailed", "VerifyResult", "compare", "reference",
           "verify"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WORKER = ("-m", "autopar.verify_worker")
"""What the ranks run (``python WORKER JOB.json``): ``autopar.verify_worker``, whose ``main``
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
            _kill(procs)
            _raise_failure(folder, nproc, sorted(folder.glob("rank*.error")), timeout_s)
        time.sleep(0.05)


def _kill(procs: list[subprocess.Popen]) -> None:
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


def verify(spec: ModelSpec | None, plan: Plan, *, steps: int = 3, seed: int = 0,
           timeout_s: float = 300.0, folder: str | os.PathLike[str] | None = None,
           device: str = "cpu") -> VerifyResult:
    """Run ``plan`` on ``plan.config.world_size`` processes and one reference process;
    compare (see the module docstring). ``spec`` defaults to the model the plan records
    (``Plan.spec_for``). Everything that can be checked is checked before a process starts:
    the model builds and the plan is admissible for it and executable
    (``passes.mesh.check_executable``), and ``device="cuda"`` finds a GPU per rank. Both sides
    run with the model's dropout switched off (``autopar.verify_dropout``; the result lists
    what was).

    ``device`` is where the ranks run; the reference is the model run eagerly in this process
    on the CPU either way, so a GPU program is held to the same written bounds against the
    same one-process answer (in low precision those bounds are ratios to the one-process
    rounding error, which the GPU's own kernels -- flash attention, cuBLAS -- err by about as
    much as the CPU's; ``verify_measures``)."""
    if steps < 1:
        raise AutoparError(f"steps={steps}", where="--steps", fix="run at least one step")
    nproc = plan.config.world_size
    check_device(device, nproc)
    spec, dropout_off = without_dropout(executable_spec(plan, spec))
    start = time.monotonic()
    keep = folder is not None
    work = Path(folder) if keep else Path(tempfile.mkdtemp(prefix="autopar-verify-"))
    work.mkdir(parents=True, exist_ok=True)
    job = {"plan": plan.to_dict(), "model": spec.to_dict(), "steps": steps, "seed": seed,
           "device": device, "backend": "nccl" if device == "cuda" else "gloo"}
    # CPU ranks run the fused kernels in Triton's CPU interpreter (also on a GPU machine)
    interpret = plan.config.fusions and device == "cpu"
    procs = start_ranks(job, nproc, work, env={"TRITON_INTERPRET": "1"} if interpret else None)
    precision = plan.train.precision
    try:
        refs = [reference(spec, plan, steps, seed)]
        exact = None
        if precision is not Precision.FP32:  # the exact answer, a second rounding sample
            exact = reference(spec, plan, steps, seed, Precision.FP32)
            refs.append(reference(spec, plan, steps, seed, resample=True))
    except BaseException:
        _kill(procs)
        raise
    ranks = wait_ranks(procs, work, timeout_s)
    if not keep:  # a failure raised above and left the folder for its logs
        shutil.rmtree(work, ignore_errors=True)
    losses = []
    for step in range(steps):
        per_dp = {r["dp_rank"]: r["losses"][step] for r in ranks if r["losses"] is not None}
        losses.append(sum(per_dp.values()) / len(per_dp))
    grads: dict[str, torch.Tensor] = {}
    params: dict[str, torch.Tensor] = {}
    for r in ranks:
        grads.update(r.get("grads", {}))
        params.update(r.get("params", {}))
    loss, grad, param = measure_run(losses, grads, params, refs, exact, precision,
                                    OPTIMIZER["lr"], steps)
    return VerifyResult(
        plan=plan, model=spec.label, nproc=nproc, steps=steps, reference_losses=refs[0].losses,
        losses=losses, loss=loss, grads=grad, params=param, tolerance=TOLERANCES[precision],
        wall_s=time.monotonic() - start, missing=sorted(set(refs[0].params) - set(params)),
        ep_busiest_share=max((r["ep_busiest_share"] for r in ranks
                              if r.get("ep_busiest_share") is not None), default=None),
        dropout_off=dropout_off)
