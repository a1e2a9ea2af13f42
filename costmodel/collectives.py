"""Collective communication time on a two-level topology (NVLink inside a node, network between).

A group of ranks is described by its size and how many of its ranks share a node. Collectives
are priced as NCCL's hierarchical algorithms run them: the part inside a node at NVLink bus
bandwidth, the part between nodes bound by the network bandwidth of each GPU (one NIC per GPU,
as in DGX/HGX rail-optimised fabrics), each hop paying the link's latency.

Sizes (``nbytes``):
* all-reduce: the buffer reduced;
* all-gather: the gathered (full) output; reduce-scatter: the full input;
* all-to-all: what one rank holds and scatters to the group (its own share included);
* send/recv: what is sent.

With a measured profile (``ClusterSpec.profile``) a collective whose group layout and size were
measured takes the measured time (``profile.Profile.collective_s``); the rest is priced here.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.core.collectives import Collective

from .cluster import ClusterSpec
from .efficiency import Efficiency
from .profile import note


@dataclass(frozen=True)
class Group:
    """A communication group: ``size`` ranks, ``per_node`` of them in each node."""

    size: int
    per_node: int

    def __post_init__(self) -> None:
        if self.size < 1 or self.per_node < 1 or self.size % self.per_node:
            raise ValueError(f"bad group: size {self.size}, {self.per_node} per node")

    @property
    def nodes(self) -> int:
        return self.size // self.per_node


def _half_ring(nbytes: float, group: Group, cluster: ClusterSpec, eff: Efficiency) -> float:
    """Reduce-scatter (or all-gather) of ``nbytes``: inside the node first, then across nodes."""
    g, k = group.per_node, group.nodes
    t = 0.0
    if g > 1:
        bw = cluster.intra_node.bytes_per_s * eff.nvlink
        t += (g - 1) / g * nbytes / bw + (g - 1) * cluster.intra_node.latency_s
    if k > 1:
        bw = cluster.inter_node.bytes_per_s * eff.network
        t += (k - 1) / k * (nbytes / g) / bw + (k - 1) * cluster.inter_node.latency_s
    return t


def estimate_collective_s(
    kind: Collective, nbytes: float, group: Group, cluster: ClusterSpec, eff: Efficiency
) -> float:
    """Seconds one collective of ``nbytes`` takes on ``group`` (0 for a group of one)."""
    if group.size == 1 or nbytes <= 0:
        return 0.0
    if cluster.profile is not None:
        t = cluster.profile.collective_s(str(kind), nbytes, group.size, group.per_node)
        note(str(kind), t is not None)
        if t is not None:
            return t
    if kind in (Collective.REDUCE_SCATTER, Collective.ALL_GATHER):
        return _half_ring(nbytes, group, cluster, eff)
    if kind is Collective.ALL_REDUCE:
        return 2.0 * _half_ring(nbytes, group, cluster, eff)
    if kind is Collective.ALL_TO_ALL:
        n, g, k = group.size, group.per_node, group.nodes
        intra = (g - 1) / n * nbytes / (cluster.intra_node.bytes_per_s * eff.nvlink)
        inter = (n - g) / n * nbytes / (cluster.inter_node.bytes_per_s * eff.network)
        latency = (g - 1) * cluster.intra_node.latency_s + (k - 1) * cluster.inter_node.latency_s
        return max(intra, inter) + latency
    if kind is Collective.SEND_RECV:
        link = cluster.inter_node if group.nodes > 1 else cluster.intra_node
        factor = eff.network if group.nodes > 1 else eff.nvlink
        return nbytes / (link.bytes_per_s * factor) + link.latency_s
    raise ValueError(f"unknown collective {kind!r}")
