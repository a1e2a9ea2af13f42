"""``autopar verify``: prove that a plan's sharded program computes what the model computes.

Starts ``nproc`` processes (``autopar.verify.worker``; the same environment protocol as
``torchrun``) -- CPU ranks with gloo, or with ``device="cuda"`` one GPU per rank with NCCL --,
trains ``steps`` steps of the plan from the same seed, weights and
tokens as one plain process doing the same steps (``autopar.verify.reference``), and compares
the loss of every step, every gradient of the last step and every parameter after the last
optimizer step, each against a written bound (``autopar.verify.measures``, which explains the
measures and where the bounds come from). Everything that can be checked is checked before a
process starts: the model builds, and the plan is admissible for it and executable.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from autopar.core.errors import AutoparError
from autopar.core.specs import Precision
from autopar.core.model_spec import ModelSpec
from autopar.passes.mesh import executable_spec
from autopar.core.plan import Plan
from autopar.models.training import OPTIMIZER
from autopar.verify.dropout import without_dropout
from autopar.verify.measures import (
    TOLERANCES,
    Diff,
    VerifyResult,
    compare,
    measure_run,
)
from autopar.verify.launcher import (ProgramFailed, check_device, kill_ranks, start_ranks,
                                     wait_ranks)
from autopar.verify.reference import reference

__all__ = ["TOLERANCES", "Diff", "ProgramFailed", "VerifyResult", "compare", "reference",
           "verify"]


def verify(spec: ModelSpec | None, plan: Plan, *, steps: int = 3, seed: int = 0,
           timeout_s: float = 300.0, folder: str | os.PathLike[str] | None = None,
           device: str = "cpu") -> VerifyResult:
    """Run ``plan`` on ``plan.config.world_size`` processes and one reference process;
    compare (see the module docstring). ``spec`` defaults to the model the plan records
    (``Plan.spec_for``). Everything that can be checked is checked before a process starts:
    the model builds and the plan is admissible for it and executable
    (``passes.mesh.check_executable``), and ``device="cuda"`` finds a GPU per rank. Both sides
    run with the model's dropout switched off (``autopar.verify.dropout``; the result lists
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
        kill_ranks(procs)
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
