"""The mesh axes, their order and their sizes: one vocabulary for the cost model and the engine.

Axes, outermost first (``ORDER``): ``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``; ranks
are numbered with the last axis fastest (Megatron's and torchtitan's order: tensor parallelism
innermost, inside a node; pipeline stages outermost). A plan's ``dp`` ranks sit on
``dp_replicate`` for ZeRO-0 (parameters replicated, gradients all-reduced) and on ``dp_shard``
for ZeRO 1-3 (FSDP2 shards); the other of the two has size 1, so both ZeRO paths are one
``fully_shard`` on the (``dp_replicate``, ``dp_shard``) sub-mesh (torchtitan's layout).

The experts have a mesh of their own, folded over the same ranks (Megatron-Core's MoE Parallel
Folding, arXiv 2504.14960): a stage's ``ParallelConfig.expert_ranks`` -- its dp x cp x tp ranks
under sequence parallelism, its dp x cp ranks without -- taken in the attention mesh's order
and cut into (``EXPERT_ORDER``) expert dp, ``ep``, ``etp``, ``etp`` fastest: with tp 2, dp 4
and ep 8 one ep group is the 8 ranks of a stage's dp x tp; with tp 4, etp 1 and ep 2 each ep
group is two neighbouring tp ranks. Without the fold the tp ranks are not in the experts' mesh:
each holds its dp x cp rank's experts whole (``expert_strides``).

The cost model (``costmodel.topology``) places its communication groups by these strides, and
the engine (``passes.mesh``) builds its ``DeviceMesh`` from the same sizes.
"""

from __future__ import annotations

from enum import StrEnum

from autopar.core.specs import ParallelConfig


class MeshAxis(StrEnum):
    """A parallel dimension; its value is the ``DeviceMesh`` dimension name."""

    PP = "pp"
    DP_REPLICATE = "dp_replicate"
    DP_SHARD = "dp_shard"
    CP = "cp"
    TP = "tp"
    EP = "ep"
    """The experts' mesh's (``EXPERT_ORDER``), not a dimension of the attention's (``ORDER``)."""


ORDER: tuple[MeshAxis, ...] = (MeshAxis.PP, MeshAxis.DP_REPLICATE, MeshAxis.DP_SHARD,
                               MeshAxis.CP, MeshAxis.TP)
"""The mesh's dimensions, outermost first; the last varies fastest over the ranks."""

DATA_PARALLEL: tuple[MeshAxis, MeshAxis] = (MeshAxis.DP_REPLICATE, MeshAxis.DP_SHARD)
"""The two dimensions holding the plan's ``dp`` ranks (one of them has size 1)."""


def mesh_sizes(config: ParallelConfig) -> dict[MeshAxis, int]:
    """The size of each dimension of ``ORDER`` for ``config`` (in that order)."""
    replicate, shard = (config.dp, 1) if config.zero == 0 else (1, config.dp)
    return {MeshAxis.PP: config.pp, MeshAxis.DP_REPLICATE: replicate,
            MeshAxis.DP_SHARD: shard, MeshAxis.CP: config.cp, MeshAxis.TP: config.tp}


def mesh_strides(config: ParallelConfig) -> dict[MeshAxis, int]:
    """How far apart, in rank numbers, two neighbours along each dimension of ``ORDER`` are."""
    sizes = mesh_sizes(config)
    strides: dict[MeshAxis, int] = {}
    stride = 1
    for axis in reversed(ORDER):
        strides[axis] = stride
        stride *= sizes[axis]
    return strides


EXPERT_ORDER: tuple[str, ...] = ("edp", "ep", "etp")
"""The experts' mesh dimensions, outermost first (Megatron-Core's expert rank order
``etp``-``ep``-``edp``, fastest first); ``passes.expert_parallel`` names its mesh so."""


def expert_sizes(config: ParallelConfig) -> dict[str, int]:
    """The size of each dimension of ``EXPERT_ORDER`` for ``config``."""
    return {"edp": config.edp, "ep": config.ep, "etp": config.etp}


def expert_strides(config: ParallelConfig) -> dict[str, int]:
    """How far apart, in rank numbers, two neighbours along each of the experts' dimensions
    are: the fold runs over ranks that are ``tp`` apart without sequence parallelism (the dp x
    cp ranks), over neighbouring ranks with it (dp x cp x tp)."""
    stride = 1 if config.experts_fold_tp else config.tp
    sizes = expert_sizes(config)
    strides: dict[str, int] = {}
    for name in reversed(EXPERT_ORDER):
        strides[name] = stride
        stride *= sizes[name]
    return strides
