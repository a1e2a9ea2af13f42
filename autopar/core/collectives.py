"""The collectives, one vocabulary: what the cost model prices, the profile measures, the
search's resharding issues and the dry run counts, each named by ``Collective``.

The names are NCCL's operations as people write them (``all-reduce``); a ``StrEnum``, so a
member is its name wherever a string is expected (a profile file's keys, a plan's JSON).
``COLLECTIVE_OPS`` reads torch's op names -- functional collectives (``all_gather_into_tensor``)
and a process group's (``_allgather_base_``) -- as the collective each runs, for the dry run.
"""

from __future__ import annotations

from enum import StrEnum


class Collective(StrEnum):
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    SEND_RECV = "send-recv"
    """One point-to-point transfer (a pipeline's activations): a send on one rank, a receive
    on the other; the dry run counts each side."""
    BROADCAST = "broadcast"
    """Not priced: the dry run counts it (a checkpoint load's, an initialisation's)."""


COLLECTIVE_OPS: dict[str, Collective] = {
    "all_gather_into_tensor": Collective.ALL_GATHER, "_allgather_base_": Collective.ALL_GATHER,
    "allgather_": Collective.ALL_GATHER,
    "all_gather_into_tensor_coalesced": Collective.ALL_GATHER,
    "allgather_into_tensor_coalesced_": Collective.ALL_GATHER,
    "reduce_scatter_tensor": Collective.REDUCE_SCATTER,
    "_reduce_scatter_base_": Collective.REDUCE_SCATTER,
    "reduce_scatter_": Collective.REDUCE_SCATTER,
    "reduce_scatter_tensor_coalesced": Collective.REDUCE_SCATTER,
    "reducescatter_": Collective.REDUCE_SCATTER,
    "all_reduce": Collective.ALL_REDUCE, "allreduce_": Collective.ALL_REDUCE,
    "allreduce_coalesced_": Collective.ALL_REDUCE,
    "all_to_all_single": Collective.ALL_TO_ALL, "alltoall_base_": Collective.ALL_TO_ALL,
    "alltoall_": Collective.ALL_TO_ALL,
    "send": Collective.SEND_RECV, "recv_": Collective.SEND_RECV,
    "broadcast_": Collective.BROADCAST, "broadcast": Collective.BROADCAST,
}
"""torch's collective op names (functional and process-group) by the collective they run."""
