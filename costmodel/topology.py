"""Where the mesh axes sit: which communication groups stay inside a node.

The axes, their order and strides are ``autopar.core.mesh``'s, the ones the engine's
``DeviceMesh`` is built with: tensor parallelism innermost, then cp, dp, pipeline outermost.
Expert parallelism is carved from the dp x cp ranks (Megatron, torchtitan): its groups take the
innermost ``ep`` of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from .cluster import ClusterSpec
from .collectives import Group
from autopar.core.mesh import MeshAxis, expert_strides, mesh_strides
from autopar.core.specs import ParallelConfig

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
    """Ranks holding the same expert shard: ``ParallelConfig.edp``."""
    pp_crosses_node: bool


def mesh_groups(config: ParallelConfig, cluster: ClusterSpec) -> MeshGroups:
    """The groups of ``config`` on ``cluster``, placed by the mesh's strides
    (``autopar.core.mesh``): a group whose ranks fit inside a node talks over NVLink."""
    stride = mesh_strides(config)
    gpn = cluster.gpus_per_node
    tp = _group(config.tp, stride[MeshAxis.TP], gpn)
    cp = _group(config.cp, stride[MeshAxis.CP], gpn)
    dp = _group(config.dp, stride[MeshAxis.DP_SHARD], gpn)  # dp_shard inside dp_replicate
    pp = _group(config.pp, stride[MeshAxis.PP], gpn)
    # cp and dp are adjacent in the order; their union is contiguous from cp's stride.
    inner = stride[MeshAxis.CP]
    dp_cp = _group(config.dp * config.cp, inner, gpn)
    experts = expert_strides(config)  # the experts' mesh folded over the stage's ranks
    ep = _group(config.ep, experts["ep"], gpn)
    expert_dp = _group(config.edp, experts["edp"], gpn)
    pp_cross = config.pp > 1 and stride[MeshAxis.PP] * config.pp > gpn
    return MeshGroups(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, dp_cp=dp_cp, expert_dp=expert_dp,
                      pp_crosses_node=pp_cross)
