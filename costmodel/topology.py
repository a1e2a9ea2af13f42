"""Where the mesh axes sit: which communication groups stay inside an NVLink domain (a node,
or several hosts joined by NVLink: GB200 NVL72's 72 GPUs).

The axes, their order and strides are ``autopar.core.mesh``'s, the ones the engine's
``DeviceMesh`` is built with: tensor parallelism innermost, then cp, dp, pipeline outermost.
The experts' mesh (expert dp, ep, etp) folds over a stage's dp x cp x tp ranks under sequence
parallelism, its dp x cp ranks without (``core.mesh.expert_strides``), etp fastest: an ep group
of 8 with tp 2 and etp 1 is 8 neighbouring ranks, one node of 8 GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .cluster import ClusterSpec
from .collectives import Group
from autopar.core.mesh import MeshAxis, expert_strides, mesh_strides
from autopar.core.specs import ParallelConfig


@lru_cache(maxsize=4096)
def placed_group(size: int, stride: int, gpus_per_node: int) -> Group:
    """A group of ``size`` ranks ``stride`` apart, placed on domains of ``gpus_per_node``
    consecutive ranks: its ranks in one domain (``per_node``), a divisor of ``size``
    (remembered: the search places the same few groups for thousands of candidates)."""
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
    """Ranks holding the same expert shards: ``ParallelConfig.edp`` of them."""
    pp_crosses_node: bool
    etp: Group = Group(1, 1)
    """Ranks splitting each expert (expert tensor parallelism)."""


def mesh_groups(config: ParallelConfig, cluster: ClusterSpec) -> MeshGroups:
    """The groups of ``config`` on ``cluster``, placed by the mesh's strides
    (``autopar.core.mesh``): a group whose ranks fit inside an NVLink domain (a node, or a
    multi-node domain: ``ClusterSpec.domain_gpus``) talks over NVLink; a group's ``per_node``
    counts its ranks in one domain. Remembered by config: the search asks for the groups of
    one candidate many times."""
    return _groups(config, cluster.domain_gpus)


@lru_cache(maxsize=4096)
def _groups(config: ParallelConfig, gpn: int) -> MeshGroups:
    stride = mesh_strides(config)
    tp = placed_group(config.tp, stride[MeshAxis.TP], gpn)
    cp = placed_group(config.cp, stride[MeshAxis.CP], gpn)
    dp = placed_group(config.dp, stride[MeshAxis.DP_SHARD], gpn)  # dp_shard inside dp_replicate
    pp = placed_group(config.pp, stride[MeshAxis.PP], gpn)
    # cp and dp are adjacent in the order; their union is contiguous from cp's stride.
    inner = stride[MeshAxis.CP]
    dp_cp = placed_group(config.dp * config.cp, inner, gpn)
    estride = expert_strides(config)
    ep = placed_group(config.ep, estride["ep"], gpn)
    etp = placed_group(config.etp, estride["etp"], gpn)
    expert_dp = placed_group(config.edp, estride["edp"], gpn)
    pp_cross = config.pp > 1 and stride[MeshAxis.PP] * config.pp > gpn
    return MeshGroups(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, dp_cp=dp_cp, expert_dp=expert_dp,
                      pp_crosses_node=pp_cross, etp=etp)


def domain_notes(config: ParallelConfig, cluster: ClusterSpec, g: MeshGroups) -> list[str]:
    """Where each communication group of ``config`` sits on a cluster whose NVLink domain
    spans several hosts (``ClusterSpec.nvlink_domain``): inside one domain (NVLink) or across
    how many; nothing on a cluster whose domain is a host (the node is the domain there)."""
    if not cluster.nvlink_domain:
        return []
    domain = cluster.domain_gpus
    parts = []
    for name, group in (("tp", g.tp), ("cp", g.cp), ("ep", g.ep), ("etp", g.etp),
                        ("dp", g.dp_cp), ("pp", g.pp)):
        if group.size == 1:
            continue
        where = ("inside one domain (" + cluster.intra_node.name + ")" if group.nodes == 1
                 else f"across {group.nodes} domains, {group.per_node} a domain")
        parts.append(f"{name} {group.size} {where}")
    size = cluster.nvlink_domain
    used = f", {domain} of them used" if domain < size else ""
    return [f"NVLink domains of {size} GPUs ({size // cluster.gpus_per_node} nodes of "
            f"{cluster.gpus_per_node}{used}): " + "; ".join(parts)] if parts else []
