"""Where the mesh axes sit: which communication groups stay inside a node.

Ranks are numbered with the first axis of ``order`` fastest (Megatron's default order,
tp-cp-(ep)-dp-pp: tensor parallelism innermost, pipeline outermost). Expert parallelism is carved
from the dp x cp ranks (Megatron, torchtitan): its groups take the innermost ``ep`` of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import ClusterSpec
from .collectives import Group
from autopar.core.specs import ParallelConfig

DEFAULT_ORDER: tuple[str, ...] = ("tp", "cp", "dp", "pp")


def _group(size: int, stride: int, gpus_per_node: int) -> Group:
    if stride >= gpus_per_node:
        per_node = 1
    else:
        per_node = max(1, min(size, gpus_per_node // stride))
        while size % per_node:
            per_node -= 1
    return Group(size=size, per_node=per_node)


@dataclass(frozen=True)
class MeshGroups:
    """The communication group of each parallel dimension."""

    tp: Group
    cp: Group
    dp: Group
    pp: Group
    ep: Group
    dp_cp: Group
    """Ranks holding the same dense weights: gradients reduce over dp x cp."""
    expert_dp: Group
    """Ranks holding the same experts: (dp x cp) / ep."""
    pp_crosses_node: bool


def mesh_groups(
    config: ParallelConfig, cluster: ClusterSpec, order: tuple[str, ...] = DEFAULT_ORDER
) -> MeshGroups:
    sizes = {"tp": config.tp, "cp": config.cp, "dp": config.dp, "pp": config.pp}
    stride: dict[str, int] = {}
    s = 1
    for axis in order:
        stride[axis] = s
        s *= sizes[axis]
    gpn = cluster.gpus_per_node
    groups = {a: _group(sizes[a], stride[a], gpn) for a in sizes}
    # dp and cp are adjacent in the default order; their union is contiguous there.
    inner = min(stride["dp"], stride["cp"])
    dp_cp = _group(config.dp * config.cp, inner, gpn)
    ep = _group(config.ep, inner, gpn)
    expert_dp = _group(config.dp * config.cp // config.ep, inner * config.ep, gpn)
    pp_cross = config.pp > 1 and stride["pp"] * config.pp > gpn
    return MeshGroups(
        tp=groups["tp"], cp=groups["cp"], dp=groups["dp"], pp=groups["pp"], ep=ep,
        dp_cp=dp_cp, expert_dp=expert_dp, pp_crosses_node=pp_cross,
    )
