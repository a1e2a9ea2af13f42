"""``device_mesh(plan)``: the torch.distributed ``DeviceMesh`` a plan runs on.

Axes, outermost first: ``pp``, ``dp_replicate``, ``dp_shard``, ``tp`` (ranks numbered with tp
fastest, as the cost model's ``topology.DEFAULT_ORDER`` assumes: tensor parallelism inside a
node, pipeline stages outermost). The plan's ``dp`` ranks sit on ``dp_replicate`` for ZeRO-0
(parameters replicated, gradients all-reduced) and on ``dp_shard`` for ZeRO 1-3 (FSDP2 shards);
the other of the two has size 1, so both ZeRO paths are one ``fully_shard`` call on the
(``dp_replicate``, ``dp_shard``) sub-mesh (torchtitan's layout).
"""

from __future__ import annotations

from enum import StrEnum

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autopar.admissibility import ModelFacts, check_plan, microbatch_problem
from autopar.core.errors import AutoparError
from autopar.core.plan import Plan


class Axis(StrEnum):
    PP = "pp"
    DP_REPLICATE = "dp_replicate"
    DP_SHARD = "dp_shard"
    TP = "tp"


AXES: tuple[Axis, ...] = (Axis.PP, Axis.DP_REPLICATE, Axis.DP_SHARD, Axis.TP)


def check_executable(plan: Plan, facts: ModelFacts | None = None) -> None:
    """Refuse, with what to do, a plan this version cannot run: the admissibility check for the
    model of ``facts`` (``autopar.admissibility.check_plan``; without ``facts``, the checks that
    need no model), then the passes' own limits -- fused kernels that exist (and
    ``linear_cross_entropy`` at tp 1), no context or expert parallelism yet."""
    from autopar.passes.fuse import check_fusions  # the kernels' import, only when checking

    c = plan.config
    if facts is not None:
        check_plan(facts, plan)
    else:
        problem = microbatch_problem(c, plan.train)
        if problem is not None:
            raise problem.error()
    check_fusions(c.fusions, c.tp)
    for axis, value in (("cp", c.cp), ("ep", c.ep)):
        if value > 1:
            raise AutoparError(
                f"the plan uses {axis}={value}; the execution passes do not yet apply "
                f"{'context' if axis == 'cp' else 'expert'} parallelism",
                where=f"plan.config.{axis}",
                fix=f"re-plan with the constraint {axis}=1 (autopar plan --{axis} 1)")


def mesh_shape(plan: Plan) -> tuple[int, int, int, int]:
    """Sizes of ``AXES`` for ``plan``."""
    c = plan.config
    replicate, shard = (c.dp, 1) if c.zero == 0 else (1, c.dp)
    return (c.pp, replicate, shard, c.tp)


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
    shard = mesh[Axis.DP_SHARD.value]
    return mesh[Axis.DP_REPLICATE.value].get_local_rank() * shard.size() + shard.get_local_rank()
