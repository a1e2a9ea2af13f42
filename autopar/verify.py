"""``autopar verify``: prove that a plan's sharded program computes what the model computes.

Starts ``nproc`` CPU processes with gloo (``autopar.verify_worker``; the same environment
protocol as ``torchrun``), trains ``steps`` steps of the plan from the same seed, weights and
tokens as one plain process doing the same steps, and compares: the loss of every step, every
gradient of the last step, and every parameter after the last optimizer step.

Tolerances (``TOLERANCES``), per precision. In fp32 the sharded program does the same
arithmetic in another order -- all-reduces, reduce-scatters, matmuls split over ranks, losses
averaged per micro-batch -- so the differences are rounding. Measured on the tiny models
(tests/dist): losses within 2e-7 relative, gradients within 8e-5 of each tensor's largest
entry (the most with GPT's tied embedding and micro-batches of one), parameters within 1e-3
optimizer moves. The bounds sit above that with room for other shapes, and far below what a
wrong program gives (a missing all-reduce, a wrong scale or a misplaced shard changes
gradients by O(1) relative). Gradients are compared relative to the
largest entry of each tensor, so a tensor of small values is not judged by noise in its zeros.
Parameters are compared in units of the optimizer's largest move, ``lr x steps`` (AdamW moves
a weight by at most about ``lr`` per step, whatever the gradient's scale): a relative measure
would judge zero-initialised biases, whose values after a few steps are themselves a few
``lr``, by the rounding of gradients that Adam divides by their own size.

bf16 and fp16 runs compare against a reference that computes on a low-precision copy of fp32
master weights, as FSDP's ``MixedPrecisionPolicy`` does; their gradients are rounded to 8 bits
of mantissa on different batch slices, so the bounds are bf16's: the loss within 1e-3
(measured ~6e-6), gradients within 10 % of each tensor's largest entry (measured ~2 %). The
parameter bound there is one full optimizer move (of at most two): Adam turns a bf16-rounded
near-zero gradient into a full-size step of either sign, so in low precision the check rests
on the loss and the gradients.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.errors import AutoparError
from autopar.costmodel.specs import Precision
from autopar.admissibility import facts_of
from autopar.passes.export import build_model
from autopar.passes.mesh import check_executable
from autopar.plan import Plan
from autopar.training import (
    LOSS_SCALING,
    OPTIMIZER,
    ModelSpec,
    logits_of,
    optimizer,
    synthetic_batch,
    vocab_size,
)


class ParamMeasure(StrEnum):
    """How parameters after the last step are compared with the reference's."""

    MOVES = "/ (lr x steps)"
    """Largest |param - reference| over ``lr x steps``, the optimizer's largest move."""
    UPDATE = "/ |update|"
    """Largest, over the tensors, of |param - reference| / |reference - initial| (L2 norms):
    the relative error of the tensor's whole update."""


@dataclass(frozen=True)
class Tolerance:
    loss_rel: float
    """Largest |loss - reference| / |reference| over the steps."""
    grad_rel: float
    """Largest |grad - reference| / max|reference| over the tensors."""
    params: float
    """Bound on the parameters' ``param_measure``."""
    param_measure: ParamMeasure = ParamMeasure.MOVES


_LOW = Tolerance(loss_rel=1e-3, grad_rel=1e-1, params=0.5, param_measure=ParamMeasure.UPDATE)
TOLERANCES = {
    Precision.FP32: Tolerance(loss_rel=1e-5, grad_rel=1e-3, params=1e-2),
    Precision.BF16: _LOW,
    Precision.FP16: _LOW,
    Precision.BF16_PURE: _LOW,
}
"""Bounds per precision; see the module docstring."""


@dataclass(frozen=True)
class Diff:
    max_abs: float
    measure: float
    """What the tolerance bounds (see ``Tolerance``)."""
    where: str
    """The tensor with the largest measure."""


@dataclass
class VerifyResult:
    plan: Plan
    model: str
    nproc: int
    steps: int
    reference_losses: list[float]
    losses: list[float]
    loss: Diff
    grads: Diff
    params: Diff
    tolerance: Tolerance
    wall_s: float
    missing: list[str] = field(default_factory=list)
    """Reference parameters the sharded program did not report (a failure)."""

    @property
    def passed(self) -> bool:
        t = self.tolerance
        return (not self.missing and self.loss.measure <= t.loss_rel
                and self.grads.measure <= t.grad_rel and self.params.measure <= t.params)

    def table(self, width: int = 110) -> str:
        buf = io.StringIO()
        console = Console(file=buf, width=width, force_terminal=False, color_system=None)
        t = Table(title=f"autopar verify: {self.model}, {self.plan.summary()}, "
                        f"{self.nproc} processes, {self.steps} steps ({self.wall_s:.1f} s)")
        for col in ("compared", "max abs diff", "measured as", "value", "tolerance", "worst",
                    "ok"):
            t.add_column(col, justify="left" if col in ("compared", "worst", "measured as")
                         else "right")
        rows = (("loss per step", self.loss, "relative", self.tolerance.loss_rel),
                ("gradients (last step)", self.grads, "/ tensor max", self.tolerance.grad_rel),
                ("parameters (after step)", self.params, self.tolerance.param_measure.value,
                 self.tolerance.params))
        for label, d, how, tol in rows:
            t.add_row(label, f"{d.max_abs:.3e}", how, f"{d.measure:.3e}", f"{tol:.0e}", d.where,
                      "yes" if d.measure <= tol else "NO")
        console.print(t)
        steps = "  ".join(f"{r:.6f}/{s:.6f}" for r, s in zip(self.reference_losses, self.losses))
        console.print(f"losses (reference/sharded): {steps}")
        if self.missing:
            console.print(f"missing parameters: {', '.join(self.missing)}")
        console.print("PASSED" if self.passed else "FAILED")
        return buf.getvalue()


def compare_updates(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
                    initial: dict[str, torch.Tensor]) -> Diff:
    """``ParamMeasure.UPDATE`` over the tensors ``got`` and ``ref`` share."""
    worst, where, max_abs = 0.0, "-", 0.0
    for name, r in ref.items():
        if name not in got:
            continue
        err = got[name] - r
        max_abs = max(max_abs, err.abs().max().item())
        update = (r - initial[name]).norm().item()
        measure = err.norm().item() / max(update, 1e-30)
        if measure > worst or where == "-":
            worst, where = measure, name
    return Diff(max_abs, worst, where)


def compare(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
            unit: float | None = None) -> Diff:
    """Largest difference over the tensors ``ref`` and ``got`` share: over ``unit`` when
    given, else over each reference tensor's largest entry."""
    worst, where, max_abs = 0.0, "-", 0.0
    for name, r in ref.items():
        if name not in got:
            continue
        d = (got[name] - r).abs().max().item()
        scale = unit if unit is not None else max(r.abs().max().item(), 1e-30)
        max_abs = max(max_abs, d)
        if d / scale > worst or where == "-":
            worst, where = d / scale, name
    return Diff(max_abs, worst, where)


def microbatches(plan: Plan, rows: int) -> list[slice]:
    """The row slices of one global batch as the ranks run them: data-parallel rank ``r``
    reads rows ``r * R .. (r + 1) * R`` (``R = rows / dp``) and runs them in micro-batches of
    ``micro_batch`` rows, in order -- ``dp x num_microbatches`` consecutive slices."""
    c = plan.config
    n = c.dp * c.microbatches(plan.train)
    size = rows // n
    return [slice(k * size, (k + 1) * size) for k in range(n)]


def reference(spec: ModelSpec, plan: Plan, steps: int, seed: int
              ) -> tuple[list[float], dict[str, torch.Tensor], dict[str, torch.Tensor],
                         dict[str, torch.Tensor]]:
    """One process, whole model, the global batch in the ranks' micro-batches: losses, last
    gradients, initial and final parameters.

    The batch is run micro-batch by micro-batch as the ranks run it (``microbatches``), each
    loss averaged over them: the same arithmetic up to the order of the sums, and the same
    tokens in each forward, which a model whose forward mixes the tokens of a batch needs
    (a mixture of experts computes its experts' capacity from the tokens of the call).

    For bf16/fp16 plans it does what FSDP's ``MixedPrecisionPolicy`` does: each step runs
    forward and backward on a low-precision copy of the fp32 master weights, and the
    gradients, cast to fp32, update the masters. fp16 scales the loss as the program does
    (``torch.amp.GradScaler`` with ``training.LOSS_SCALING``, ``passes/loss_scaling.py``)."""
    torch.set_flush_denormal(True)
    model = spec.build("cpu", seed)
    train = plan.train
    if train.precision is Precision.BF16_PURE:
        model = model.to(torch.bfloat16)
    low = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(train.precision)
    scaler = (torch.amp.GradScaler("cpu", **LOSS_SCALING)
              if train.precision is Precision.FP16 else None)
    opt = optimizer(list(model.parameters()))
    vocab = vocab_size(model)
    losses, grads = [], {}
    named = dict(model.named_parameters(remove_duplicate=False))
    initial = {n: p.detach().float().clone() for n, p in named.items()}
    chunks = microbatches(plan, train.global_batch)
    for step in range(steps):
        tokens, targets = synthetic_batch(step, train.global_batch, train.seq_len, vocab, seed)
        runner = copy.deepcopy(model).to(low) if low is not None else model
        total = 0.0
        for rows in chunks:
            loss = F.cross_entropy(logits_of(runner, tokens[rows]).float().flatten(0, 1),
                                   targets[rows].flatten(0, 1))
            scaled = loss / len(chunks)
            (scaled if scaler is None else scaler.scale(scaled)).backward()
            total += loss.item()
        if runner is not model:
            for master, p in zip(model.parameters(), runner.parameters()):
                master.grad = None if p.grad is None else p.grad.float()
        if scaler is not None:
            scaler.unscale_(opt)
        losses.append(total / len(chunks))
        if step == steps - 1:
            grads = {n: p.grad.detach().float().clone() for n, p in named.items()
                     if p.grad is not None}
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)
    params = {n: p.detach().float().clone() for n, p in named.items()}
    return losses, grads, initial, params


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(job: dict, nproc: int, folder: Path) -> list[subprocess.Popen]:
    """Start the ranks (they run while the caller computes the reference)."""
    (folder / "job.json").write_text(json.dumps(job))
    port = _free_port()
    procs = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        if job["plan"]["config"]["fusions"] and not torch.cuda.is_available():
            env.setdefault("TRITON_INTERPRET", "1")  # the fused kernels' CPU interpreter
        with open(folder / f"rank{rank}.log", "w") as log:  # the child keeps its own handle
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "autopar.verify_worker", str(folder / "job.json")],
                env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def _wait(procs: list[subprocess.Popen], folder: Path, timeout_s: float) -> list[dict]:
    """The ranks' results, read from the files they write (not their exit codes); kills them
    all and raises when one failed (after a grace for the others to report) or time ran out."""
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
    raise AutoparError(f"the sharded program did not run: {detail}",
                       where=f"autopar verify (logs in {folder})",
                       fix="run again with --debug; if the plan came from an older version, "
                           "re-plan it")


def verify(spec: ModelSpec | None, plan: Plan, *, steps: int = 3, seed: int = 0,
           timeout_s: float = 300.0, folder: str | os.PathLike[str] | None = None
           ) -> VerifyResult:
    """Run ``plan`` on ``plan.config.world_size`` CPU processes and one reference process;
    compare (see the module docstring). ``spec`` defaults to the model the plan records
    (``Plan.spec_for``). Everything that can be checked is checked before a process starts:
    the model builds and the plan is admissible for it and executable
    (``passes.mesh.check_executable``)."""
    if steps < 1:
        raise AutoparError(f"steps={steps}", where="--steps", fix="run at least one step")
    spec = plan.spec_for(spec)
    check_executable(plan, facts_of(build_model(spec)))
    nproc = plan.config.world_size
    start = time.monotonic()
    keep = folder is not None
    work = Path(folder) if keep else Path(tempfile.mkdtemp(prefix="autopar-verify-"))
    work.mkdir(parents=True, exist_ok=True)
    job = {"plan": plan.to_dict(), "model": spec.to_dict(), "steps": steps, "seed": seed}
    procs = _start(job, nproc, work)
    try:
        ref_losses, ref_grads, initial, ref_params = reference(spec, plan, steps, seed)
    except BaseException:
        _kill(procs)
        raise
    ranks = _wait(procs, work, timeout_s)
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
    tolerance = TOLERANCES[plan.train.precision]
    loss_abs = max(abs(a - b) for a, b in zip(losses, ref_losses))
    loss_rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, ref_losses))
    return VerifyResult(
        plan=plan, model=spec.label, nproc=nproc, steps=steps, reference_losses=ref_losses,
        losses=losses, loss=Diff(loss_abs, loss_rel, "-"), grads=compare(grads, ref_grads),
        params=(compare(params, ref_params, unit=OPTIMIZER["lr"] * steps)
                if tolerance.param_measure is ParamMeasure.MOVES
                else compare_updates(params, ref_params, initial)),
        tolerance=tolerance,
        wall_s=time.monotonic() - start, missing=sorted(set(ref_params) - set(params)))


def process_cluster(nproc: int, like: str = "hgx-h100-80g") -> ClusterSpec:
    """A one-node cluster of ``nproc`` GPUs of preset ``like``: what a plan given as flags is
    priced on when it is verified on ``nproc`` CPU processes."""
    base = ClusterSpec.preset(like, nodes=1)
    return replace(base, name=f"{like}-{nproc}gpu", gpus_per_node=nproc)
