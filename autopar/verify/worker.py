"""One rank of ``autopar verify``: ``python -m autopar.verify.worker JOB.json``.

Reads the rendezvous from the environment as ``torchrun`` sets it (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``), builds the model on the meta device, applies the plan and
draws only this rank's shards (``passes/materialize.py``, as an exported ``train.py`` does: the
comparison with the one-process reference so also checks that sharded initialisation), trains
``steps`` steps on its slice of the synthetic batches and writes ``rank<R>.pt`` into the job's
folder: its losses (ranks holding the last stage), and the full gradients of the last step and
the full parameters after it of the parameters no lower rank holds (``_first_held``: a
stage's on its first tp and dp rank; a list of experts that expert parallelism split, each
expert's on the first rank holding it). Gloo
ranks can abort while the interpreter shuts down (../shared/design/FINDINGS.md), so each rank
ends with a barrier and ``os._exit``, and the launcher reads these files rather than trusting
exit codes. ``main`` is the rank side of ``autopar.verify.launcher.start_ranks``/``wait_ranks`` for any
``work(job)`` (``tests/dist/test_sharded_init.py`` runs its own checks through it).
"""

from __future__ import annotations

import faulthandler
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autopar.core.errors import AutoparError
from autopar.passes import device_mesh, parallelize
from autopar.passes.expert_parallel import ep_load
from autopar.passes.materialize import materialize
from autopar.passes.program import ParallelProgram
from autopar.core.mesh import MeshAxis
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.models.training import end_rank, optimizer, synthetic_inputs


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole of ``t`` (gathered where it is a DTensor), detached, on the CPU, in its
    dtype: a copy."""
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu().clone()


def sharded_program(model: nn.Module, plan: Plan, spec: ModelSpec, seed: int,
                    device: str = "cpu") -> ParallelProgram:
    """This rank's program, as an exported ``train.py`` starts it: ``model`` (``spec``'s, built
    on the meta device) parallelized under ``plan`` on ``device`` (``cpu``, or ``cuda``: this
    rank's GPU, ``rank_device``), then only this rank's shards drawn from ``seed`` -- which
    must equal the one-process build's (verify_reference.py)."""
    where = rank_device(device)  # before the mesh, which NCCL binds to the current GPU
    return materialize(parallelize(model, plan, device_mesh(plan, device), where), spec, seed)


def rank_device(device: str) -> torch.device:
    """This rank's device of type ``device``: for ``cuda`` its GPU (the local rank's, made the
    current one, as torchrun's ranks pick theirs)."""
    if device != "cuda":
        return torch.device(device)
    index = dist.get_rank() % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def run(job: dict) -> dict:
    plan = Plan.from_dict(job["plan"])
    spec = ModelSpec.from_dict(job["model"])
    steps, seed = int(job["steps"]), int(job["seed"])
    model = spec.build("meta")
    program = sharded_program(model, plan, spec, seed, job.get("device", "cpu"))
    mesh = program.mesh
    opt = optimizer(program.parameters())
    train, c = plan.train, plan.config
    rows = train.global_batch // c.dp
    losses, grads = [], {}
    for step in range(steps):
        tokens, targets = synthetic_inputs(model, step, train.global_batch, train.seq_len, seed)
        mine = slice(program.dp_rank * rows, (program.dp_rank + 1) * rows)
        loss = program.step(tokens[mine], targets[mine])
        losses.append(None if loss is None else float(loss))
        if step == steps - 1:
            program.unscale_([opt])  # fp16: the true gradients
            grads = {n: full(p.grad).float() for n, p in program.named_parameters(False)
                     if p.grad is not None}
        program.optimizer_step([opt])
    params = {n: full(p).float() for n, p in program.named_parameters(False)}
    mine = _first_held(params)
    result = {"rank": dist.get_rank(), "dp_rank": program.dp_rank,
              "ep_busiest_share": ep_load(program.modules),
              "tp_rank": mesh.get_local_rank(MeshAxis.TP.value),
              "pp_rank": mesh.get_local_rank(MeshAxis.PP.value),
              "losses": losses if program.holds_last else None}
    if mine:
        result.update(grads={n: g for n, g in grads.items() if n in mine},
                      params={n: p for n, p in params.items() if n in mine})
    return result


def _first_held(params: dict[str, torch.Tensor]) -> set[str]:
    """The names of ``params`` (this rank's, whole) that no lower rank holds: each tensor is
    reported once, by the first rank holding it -- a stage's first tp and dp rank, and for a
    list of experts expert parallelism split (``models/generic/experts.py``), the first rank
    of each ep coordinate. One ``all_gather_object`` of the names."""
    everyone: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, sorted(params))
    first: dict[str, int] = {}
    for rank, names in enumerate(everyone):
        for name in names or ():
            first.setdefault(name, rank)
    return {name for name in params if first[name] == dist.get_rank()}


def main(argv: list[str], work: Callable[[dict], object] = run) -> None:
    """One rank: ``work`` on the job of the file ``argv[0]`` under a process group of the job's
    ``backend`` (default gloo), its
    result saved as ``rank<R>.pt`` next to the job, or its failure as ``rank<R>.error``.
    Under nccl, CPU tensors (the profile's timings, votes) ride gloo beside it: one group with
    a backend per device type (``"cuda:nccl,cpu:gloo"``)."""
    faulthandler.enable()  # a native crash leaves its Python stack in the rank's log
    job_path = Path(argv[0])
    job = json.loads(job_path.read_text())
    out = job_path.parent
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    backend = job.get("backend", "gloo")
    dist.init_process_group("cuda:nccl,cpu:gloo" if backend == "nccl" else backend)
    rank = dist.get_rank()
    code = 0
    try:
        torch.save(work(job), out / f"rank{rank}.pt")
    except AutoparError as err:  # a person can act on it: its paragraph, no traceback
        (out / f"rank{rank}.error").write_text(err.paragraph())
        code = 1
    except BaseException:  # reported to the launcher, which prints it
        (out / f"rank{rank}.error").write_text(traceback.format_exc())
        code = 1
    end_rank(code)


if __name__ == "__main__":
    main(sys.argv[1:])
