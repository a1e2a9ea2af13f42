"""Data-parallel communication per step: the gradient reduction by ZeRO stage and FSDP's
weight gathers, and what of them the backward hides (``dp_comm_s``); ``costmodel/step.py``
prices a stage's share with it, in the estimate and in the search's floor."""

from __future__ import annotations

import math

from .cluster import ClusterSpec
from .collectives import Collective, estimate_collective_s
from .efficiency import Efficiency
from .topology import MeshGroups
from autopar.core.specs import ParallelConfig

BUCKET_BYTES = 25 * 2**20
"""One gradient bucket: DDP's default ``bucket_cap_mb`` of 25 MiB."""

FSDP_GATHERS = 2
"""All-gathers of each FSDP unit per micro-batch: before its forward and before its backward.
A checkpointed unit's recomputation runs inside its backward, on the weights that backward
gathered, so it adds none: FSDP2 applied over the checkpointed block, as ``passes/`` (and
torchtitan) do it; ``tests/dist/test_comm_counts.py`` counts the engine's. Before 2026-11-28
the cost model priced a third under checkpointing, 1.5 times the gathers the engine runs."""
FSDP_UNIT_PARAMS = 10**8
"""Parameters of one FSDP unit when the caller does not give the layer size: the default
``min_num_params`` of PyTorch FSDP's ``size_based_auto_wrap_policy`` (1e8), which groups layers
into units of at least that many parameters."""


def dp_comm_s(
    dense: float, expert: float, grad_bytes: float, weight_bytes: float, config: ParallelConfig,
    m: int, backward_s: float, stage_compute_s: float, g: MeshGroups, cluster: ClusterSpec,
    eff: Efficiency, *, unit_params: float | None = None,
) -> float:
    """Exposed data-parallel communication per step for one stage's GPU.

    ZeRO 0 (DDP): one all-reduce per step, hidden under the last micro-batch's backward as
    bucketed reduction allows; the last bucket is reduced after the backward has finished.
    ZeRO 1 and 2 reduce-scatter the gradients instead -- ZeRO-1 once, in the last micro-batch's
    backward; ZeRO-2 in every micro-batch's, to drop the unsharded gradients -- each hidden
    under that backward but for its last bucket, and all-gather the updated weights after the
    optimizer step, which hides under the next step's first forward but for its first bucket
    (Megatron-LM's distributed optimizer with ``overlap_grad_reduce`` and
    ``overlap_param_gather``). So ZeRO-1 is never slower than ZeRO-0 (the same volume, more
    of it hidden) nor than ZeRO-2 (which repeats the reduce-scatter every micro-batch).
    ZeRO 3 (FSDP): see ``_fsdp_exposed_s``; ``unit_params`` is one FSDP unit on this GPU (the
    largest wrapped layer's parameters), ``FSDP_UNIT_PARAMS`` when not given.
    ``backward_s`` and ``stage_compute_s`` are one micro-batch's backward and whole compute,
    the recomputed forward included: it runs inside the backward, and the collectives
    overlap it as they overlap the rest of it.
    """
    def coll(kind: Collective, n_dense: float, n_expert: float, nbytes: float) -> float:
        return (estimate_collective_s(kind, n_dense * nbytes, g.dp_cp, cluster, eff)
                + estimate_collective_s(kind, n_expert * nbytes, g.expert_dp, cluster, eff))

    def bucket(kind: Collective, nbytes: float) -> float:
        return estimate_collective_s(kind, min(dense * nbytes, BUCKET_BYTES), g.dp_cp, cluster,
                                     eff)

    if config.zero == 0:
        ar = coll(Collective.ALL_REDUCE, dense, expert, grad_bytes)
        # the last bucket is reduced after the backward has finished: never hidden
        return max(ar - eff.dp_overlap * backward_s, bucket(Collective.ALL_REDUCE, grad_bytes))
    if config.zero <= 2:
        rs = coll(Collective.REDUCE_SCATTER, dense, expert, grad_bytes)
        ag = coll(Collective.ALL_GATHER, dense, expert, weight_bytes)
        forward_s = stage_compute_s - backward_s
        reduce = max(rs - eff.dp_overlap * backward_s, bucket(Collective.REDUCE_SCATTER,
                                                              grad_bytes))
        gather = max(ag - eff.dp_overlap * forward_s, bucket(Collective.ALL_GATHER, weight_bytes))
        return (1 if config.zero == 1 else m) * reduce + gather
    if unit_params is None:
        unit_params = FSDP_UNIT_PARAMS
    per_mb = _fsdp_exposed_s(dense, expert, min(unit_params, dense), grad_bytes, weight_bytes,
                             FSDP_GATHERS, stage_compute_s, g, cluster, eff)
    return m * per_mb


def _fsdp_exposed_s(
    dense: float, expert: float, unit: float, grad_bytes: float, weight_bytes: float,
    gathers: int, compute_s: float, g: MeshGroups, cluster: ClusterSpec, eff: Efficiency,
) -> float:
    """Exposed FSDP (ZeRO-3) communication of one micro-batch.

    FSDP all-gathers the weights of one unit (a wrapped layer) before each use -- forward and
    backward (``FSDP_GATHERS``: ``gathers``) -- and reduce-scatters each unit's
    gradients after its backward: one collective per unit and pass, each paying its latency
    (Zhao et al., "PyTorch FSDP", VLDB 2023, sec. 3; FSDP2's ``fully_shard`` per transformer
    block with ``reshard_after_forward``). Prefetching overlaps the all-gather of the next unit
    with the compute of this one (sec. 3.3), but two collectives have nothing to hide under:
    the forward's first all-gather, issued before any compute exists, and the backward's last
    reduce-scatter, issued after all of it. The rest hides under the micro-batch's compute as
    far as ``dp_overlap`` of it allows. Before this, every collective was taken as hidden, which
    made ZeRO-3 tie ZeRO-1 in time and win on memory for any model.
    """
    units = max(1, math.ceil(dense / unit)) if dense > 0 else 0
    ag_unit = estimate_collective_s(Collective.ALL_GATHER, unit * weight_bytes, g.dp_cp,
                                    cluster, eff)
    rs_unit = estimate_collective_s(Collective.REDUCE_SCATTER, unit * grad_bytes, g.dp_cp,
                                    cluster, eff)
    ag_expert = estimate_collective_s(Collective.ALL_GATHER, expert * weight_bytes, g.expert_dp,
                                      cluster, eff)
    rs_expert = estimate_collective_s(Collective.REDUCE_SCATTER, expert * grad_bytes,
                                      g.expert_dp, cluster, eff)
    total = units * (gathers * ag_unit + rs_unit) + gathers * ag_expert + rs_expert
    edges = ag_unit + rs_unit
    return edges + max(0.0, total - edges - eff.dp_overlap * compute_s)
