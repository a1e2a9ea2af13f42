"""Expert parallelism's communication, priced as the engines run it.

Per MoE layer and micro-batch a GPU sends the rows it routed (its tokens, its sequence shard
under the fold of the experts over tp: ``Split.scale(Shard.SEQ)``, times top-k for a dropless
layer, the (E, C, h) slots of a capacity one) to the experts' owners and gets their outputs
back: dispatch and combine forward, their reverses backward, the forward's again when the block
is recomputed (``ep_alltoalls``); a dropless layer exchanges its per-expert counts first. The
busiest rank's rows are the mean times ``Efficiency.moe_load_imbalance`` (the share ``verify``
measures as ``ep_load``).

How the rows travel (``dispatch_s``):

* **all-to-all** (autopar's engine, Megatron-Core's ``alltoall`` dispatcher): one all-to-all
  over the ep group on the two-level topology (``collectives.estimate_collective_s``): the
  rows bound for the GPU's own node over NVLink, the rest over its NIC, the slower of the two;
* **per-node deduplication** (fusion ``deepep``: DeepEP, HybridEP): a token crosses the network
  once per *destination node*, not once per expert, and is forwarded to its experts' GPUs over
  NVLink there. With the ep group's experts spread evenly over its ``N`` nodes, a token's
  ``k`` experts (drawn without replacement from ``E``) miss a given node with probability
  ``C(E - E/N, k) / C(E, k)``, so it is sent to ``(N - 1) * (1 - that)`` other nodes on average;
  the NVLink leg carries every routed row once;
* **expert tensor parallelism** (etp > 1): the rows an owner receives are all-gathered over its
  etp group before the experts and their outputs reduce-scattered after (Megatron-Core's
  folding), each way in the backward too;
* **overlap** (fusion ``ep_a2a_overlap``): the dispatch and combine of one micro-batch run while
  another's forward or backward computes (Megatron-Core's EP-overlapped 1F1B, DualPipe): of
  the smaller of the two times, the fraction ``Efficiency.ep_overlap`` is hidden.
"""

from __future__ import annotations

import math

from autopar.core.collectives import Collective
from autopar.core.specs import DEEPEP, EP_A2A_OVERLAP, Checkpoint, ParallelConfig

from .cluster import ClusterSpec
from .collectives import Group, estimate_collective_s
from .compute import Split, reissues
from .efficiency import Efficiency
from .topology import MeshGroups
from .workload import LayerCost, Shard


def ep_reissues(policy: Checkpoint) -> bool:
    """Whether ``policy``'s recomputation runs the MoE layers' forward all-to-alls (and etp
    gathers) again in the backward: the block's (``compute.reissues``: ``full``, ``matmuls``)
    and ``moe``'s, which reruns the MoE layers whole, dispatch and combine included."""
    return reissues(policy) or policy is Checkpoint.MOE


def ep_alltoalls(layer: LayerCost, policy: Checkpoint) -> tuple[int, int]:
    """(forward, backward) all-to-alls one MoE layer runs per micro-batch under expert
    parallelism (``passes/expert_parallel.py``): dispatch and combine forward (after the
    per-expert counts when dropless), their reverses backward, and the forward's again in the
    backward when the block or the MoE layer is recomputed (``ep_reissues``)."""
    if layer.ep_alltoall_elements == 0:
        return (0, 0)
    forward = 3 if layer.ep_dropless else 2
    return forward, 2 + (forward if ep_reissues(policy) else 0)


def remote_nodes_per_token(experts: int, top_k: int, nodes: int,
                           groups: tuple[int, int] | None = None) -> float:
    """Other nodes a token's ``top_k`` experts sit on, on average, with ``experts`` spread
    evenly over ``nodes`` nodes and chosen without replacement (module docstring). With a
    group-limited router (``groups``: G contiguous expert groups, a token's experts within M
    of them) the token reaches the nodes of its M groups: ``G / nodes`` groups to a node
    where G is a multiple of the nodes (DeepSeek-V3: 8 groups on 8 nodes, 4 kept -- "at most
    4 nodes"), the nodes that M groups drawn from G span."""
    if nodes <= 1:
        return 0.0
    if groups is not None and groups[0] % nodes == 0:
        total, keep = groups
        per_node = total // nodes
        if keep > total - per_node:
            return float(nodes - 1)
        miss = math.comb(total - per_node, keep) / math.comb(total, keep)
        return (nodes - 1) * (1.0 - miss)
    per_node = experts // nodes
    if top_k > experts - per_node:
        return float(nodes - 1)
    miss = math.comb(experts - per_node, top_k) / math.comb(experts, top_k)
    return (nodes - 1) * (1.0 - miss)


def dispatch_s(rows_bytes: float, tokens_bytes: float, experts: int, top_k: int, group: Group,
               cluster: ClusterSpec, eff: Efficiency, *, dedup: bool,
               groups: tuple[int, int] | None = None) -> float:
    """One dispatch (or combine) of ``rows_bytes`` of routed rows from ``tokens_bytes`` of
    tokens over the ep ``group``: one all-to-all, or with ``dedup`` the token sent once per
    destination node and forwarded over NVLink (module docstring)."""
    if group.size == 1 or rows_bytes <= 0:
        return 0.0
    if not dedup or group.nodes == 1:
        return estimate_collective_s(Collective.ALL_TO_ALL, rows_bytes, group, cluster, eff)
    g, n = group.per_node, group.nodes
    inter = (tokens_bytes * remote_nodes_per_token(experts, top_k, n, groups)
             / (cluster.inter_node.bytes_per_s * eff.network))
    intra = rows_bytes * (g - 1) / g / (cluster.intra_node.bytes_per_s * eff.nvlink)
    latency = (g - 1) * cluster.intra_node.latency_s + (n - 1) * cluster.inter_node.latency_s
    return max(inter, intra) + latency


def ep_comm_s(layer: LayerCost, split: Split, policy: Checkpoint, config: ParallelConfig,
              g: MeshGroups, cluster: ClusterSpec, eff: Efficiency, compute_s: float) -> float:
    """Exposed seconds of one MoE layer's expert-parallel communication for one micro-batch:
    the all-to-alls of ``ep_alltoalls`` (``dispatch_s``), the etp gathers and scatters, the
    count exchanges; with ``ep_a2a_overlap`` less the part ``Efficiency.ep_overlap`` hides
    under ``compute_s`` (the layer's compute for a micro-batch, forward and backward, that
    another micro-batch's communication runs under)."""
    if layer.ep_alltoall_elements == 0 or (g.ep.size == 1 and g.etp.size == 1):
        return 0.0
    imbalance = eff.moe_load_imbalance if layer.ep_dropless else 1.0
    share = split.scale(Shard.SEQ)  # of one sequence's tokens, on this GPU
    rows = layer.ep_alltoall_elements * split.act_bytes * share * imbalance
    shape = next((op.expert_shape for op in layer.ops if op.expert_shape is not None), None)
    experts = shape[0] if shape is not None else config.ep
    top_k = max(1, round(layer.ep_alltoall_elements / max(1.0, layer.input_elements)))
    tokens = layer.input_elements * split.act_bytes * share
    one = dispatch_s(rows, tokens, experts, top_k, g.ep, cluster, eff,
                     dedup=DEEPEP in config.fusions, groups=layer.route_groups)
    forward, backward = ep_alltoalls(layer, policy)
    counts = 1 + ep_reissues(policy) if layer.ep_dropless else 0
    total = (forward + backward - counts) * one
    if counts and g.ep.size > 1:
        total += counts * estimate_collective_s(Collective.ALL_TO_ALL, 8.0 * g.ep.size, g.ep,
                                                cluster, eff)
    if g.etp.size > 1:  # the received rows gathered over etp, the outputs scattered back
        gathered = rows * g.etp.size
        pair = (estimate_collective_s(Collective.ALL_GATHER, gathered, g.etp, cluster, eff)
                + estimate_collective_s(Collective.REDUCE_SCATTER, gathered, g.etp, cluster, eff))
        total += pair * (2 + (1 if ep_reissues(policy) else 0))
    if EP_A2A_OVERLAP in config.fusions:
        return total - eff.ep_overlap * min(total, compute_s)
    return total
