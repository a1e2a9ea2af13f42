"""``device_mesh(plan)``: the torch.distributed ``DeviceMesh`` a plan runs on.

Its dimensions, their order and sizes are ``autopar.core.mesh``'s, the ones the cost model
places its groups by (``costmodel.topology``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autopar.analysis.admissibility import ModelFacts, check_plan, facts_of, microbatch_problem
from autopar.core.errors import AutoparError
from autopar.core.mesh import DATA_PARALLEL, ORDER, MeshAxis, mesh_sizes
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan


AXES: tuple[MeshAxis, ...] = ORDER
"""The engine's mesh dimensions, outermost first: ``autopar.core.mesh.ORDER``."""


def check_executable(plan: Plan, facts: ModelFacts | None = None) -> None:
    """Refuse, with what to do, a plan this version cannot run: the admissibility check for the
    model of ``facts`` (``autopar.analysis.admissibility.check_plan``; without ``facts``, the checks that
    need no model), then the passes' own limits: fused kernels that exist (and
    ``linear_cross_entropy`` at tp 1). Context and expert parallelism run, together too, and
    expert tensor parallelism where the model's family says how to split an expert
    (``passes/context_parallel.py``, ``passes/expert_parallel.py``)."""
    from autopar.passes.fuse import check_fusions  # the kernels' import, only when checking

    c = plan.config
    if facts is not None:
        check_plan(facts, plan)
    else:
        problem = microbatch_problem(c, plan.train)
        if problem is not None:
            raise problem.error()
    check_fusions(c.fusions, c.tp)


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
            f"(dp {plan.config.dp} x tp {plan.config.tp} x pp {plan.config.pp} x cp "
            f"{plan.config.cp}), "
            f"{world} were started", where="the process group",
            fix=f"launch {plan.config.world_size} processes (torchrun --nproc-per-node ...)")
    return init_device_mesh(device_type or default_device_type(), mesh_shape(plan),
                            mesh_dim_names=tuple(a.value for a in AXES))


def dp_rank(mesh: DeviceMesh) -> int:
    """This rank's index among the data-parallel replicas (which slice of the batch it reads)."""
    replicate, shard = (mesh[a.value] for a in DATA_PARALLEL)
    return replicate.get_local_rank() * shard.size() + shard.get_local_rank()


def data_parallel_mesh(mesh: DeviceMesh, zero: int) -> DeviceMesh:
    """The mesh FSDP2 reduces the gradients over: the dp ranks and, under context parallelism,
    the cp ranks too (they hold the same weights and different tokens). ZeRO-0: a 2-D
    (replicate, shard) mesh, the shard dimension of size 1 -- under cp, ``dp_replicate`` x
    ``dp_shard`` x ``cp`` flattened, unflattened into (``dp_replicate_cp``, a dimension of 1);
    ZeRO 1-3: ``dp_shard`` x ``cp`` flattened into one (torchtitan's ``dp_shard_cp``). Made
    with ``DeviceMesh._flatten``/``_unflatten`` (no group of our own), and the flattened mesh
    used as returned, not sliced from the root again (torch deprecates that)."""
    replicate, shard = (a.value for a in DATA_PARALLEL)
    cp = MeshAxis.CP.value
    if mesh[cp].size() == 1:
        return mesh[(replicate, shard)] if zero == 0 else mesh[shard]
    if zero == 0:
        flat = mesh[(replicate, shard, cp)]._flatten(f"{replicate}_{shard}_{cp}")
        return flat._unflatten(0, (flat.size(), 1), (f"{replicate}_{cp}", f"{shard}_1"))
    return mesh[(shard, cp)]._flatten(f"{shard}_{cp}")
