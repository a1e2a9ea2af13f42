"""``device_mesh(plan)``: the torch.distributed ``DeviceMesh`` a plan runs on.

Its dimensions, their order and sizes are ``autopar.core.mesh``'s, the ones the cost model
places its groups by (``costmodel.topology``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autopar.admissibility import ModelFacts, check_plan, facts_of, microbatch_problem
from autopar.core.errors import AutoparError
from autopar.core.mesh import DATA_PARALLEL, ORDER, MeshAxis, mesh_sizes
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan


AXES: tuple[MeshAxis, ...] = tuple(a for a in ORDER if a is not MeshAxis.CP)
"""The engine's mesh dimensions, outermost first: ``autopar.core.mesh.ORDER`` without ``cp``,
which the passes do not apply yet (``check_executable`` refuses cp > 1)."""


def check_executable(plan: Plan, facts: ModelFacts | None = None) -> None:
    """Refuse, with what to do, a plan this version cannot run: the admissibility check for the
    model of ``facts`` (``autopar.admissibility.check_plan``; without ``facts``, the checks that
    need no model), then the passes' own limits -- fused kernels that exist (and
    ``linear_cross_entropy`` at tp 1), no context parallelism yet (expert parallelism runs:
    ``passes/expert_parallel.py``)."""
    from autopar.passes.fuse import check_fusions  # the kernels' import, only when checking

    c = plan.config
    if facts is not None:
        check_plan(facts, plan)
    else:
        problem = microbatch_problem(c, plan.train)
        if problem is not None:
            raise problem.error()
    check_fusions(c.fusions, c.tp)
    for axis, value in (("cp", c.cp),):
        if value > 1:
            raise AutoparError(
                f"the plan uses {axis}={value}; the execution passes do not yet apply "
                f"{'context' if axis == 'cp' else 'expert'} parallelism",
                where=f"plan.config.{axis}",
                fix=f"re-plan with the constraint {axis}=1 (autopar plan --{axis} 1)")


def executable_spec(plan: Plan, given: ModelSpec | None = None) -> ModelSpec:
    """The model to run ``plan`` with (``Plan.spec_for``), built on the meta device and the plan
    checked against it (``check_executable``): what ``verify`` and ``export`` check before any
    process starts or file is written."""
    spec = plan.spec_for(given)
    check_executable(plan, facts_of(spec.build("meta")))
    return spec


def mesh_shape(plan: Plan) -> tuple[int, ...]:
    """Sizes of ``AXES`` for ``plan`` (``autopar.core.mesh.mesh_sizes``)."""
    sizes = mesh_sizes(plan.config)
    return tuple(sizes[a] for a in AXES)


def default_device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def device_mesh(plan: Plan, device_type: str | None = None) -> DeviceMesh:
    """The mesh of ``plan`` over the default process group (``torchrun`` started it, or the
    caller did): raises ``AutoparError`` when the world size is not the plan's."""
    check_executable(plan)
    if not dist.is_initialized():
        raise AutoparError("no process group: autopar.device_mesh runs on each rank",
                           where="autopar.device_mesh",
                           fix="launch with torchrun (see `autopar export`) or call "
                               "torch.distributed.init_process_group first")
    world = dist.get_world_size()
    if world != plan.config.world_size:
        raise AutoparError(
            f"the plan needs {plan.config.world_size} processes "
            f"(dp {plan.config.dp} x tp {plan.config.tp} x pp {plan.config.pp}), "
            f"{world} were started", where="the process group",
            fix=f"launch {plan.config.world_size} processes (torchrun --nproc-per-node ...)")
    return init_device_mesh(device_type or default_device_type(), mesh_shape(plan),
                            mesh_dim_names=tuple(a.value for a in AXES))


def dp_rank(mesh: DeviceMesh) -> int:
    """This rank's index among the data-parallel replicas (which slice of the batch it reads)."""
    replicate, shard = (mesh[a.value] for a in DATA_PARALLEL)
    return replicate.get_local_rank() * shard.size() + shard.get_local_rank()
