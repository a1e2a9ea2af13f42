"""The mesh axes, their order and their sizes: one vocabulary for the cost model and the engine.

Axes, outermost first (``ORDER``): ``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``; ranks
are numbered with the last axis fastest (Megatron's and torchtitan's order: tensor parallelism
innermost, inside a node; pipeline stages outermost). A plan's ``dp`` ranks sit on
``dp_replicate`` for ZeRO-0 (parameters replicated, gradients all-reduced) and on ``dp_shard``
for ZeRO 1-3 (FSDP2 shards); the other of the two has size 1, so both ZeRO paths are one
``fully_shard`` on the (``dp_replicate``, ``dp_shard``) sub-mesh (torchtitan's layout). ``ep``
is no axis of its own: expert groups are carved from the ``dp_shard`` x ``cp`` ranks, taking
the innermost ``ep`` of them (Megatron, torchtitan).

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
    """Carved from ``dp_shard`` x ``cp``: not a dimension of the mesh (``ORDER``)."""


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
