"""The error raised when no candidate fits: the smallest footprint found and what would fit."""

from __future__ import annotations

from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.errors import AutoparError
from autopar.costmodel.estimate import Estimate

GIB = 2**30


class InfeasibleError(AutoparError):
    """No plan fits in memory; ``smallest`` is the candidate with the least peak memory."""

    def __init__(self, what: str, *, where: str = "", fix: str = "",
                 smallest: Estimate | None = None) -> None:
        self.smallest = smallest
        super().__init__(what, where=where, fix=fix)


def infeasible_error(smallest: Estimate | None, cluster: ClusterSpec,
                     constraints: dict[str, object]) -> InfeasibleError:
    """Say how far the smallest candidate is from fitting and what would close the gap."""
    if smallest is None:
        return InfeasibleError(
            "no parallel configuration is valid for this model, cluster and batch",
            where="constraints " + (str(constraints) if constraints else "(none)"),
            fix="relax the constraints, or choose a GPU count and global batch that the "
                "degrees can divide")
    usable = cluster.usable_hbm_bytes
    b = smallest.memory_breakdown
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in b.items() if v > 0)
    what = (f"no plan fits in memory: the smallest footprint found, {_summary(smallest)}, "
            f"needs {smallest.peak_memory_bytes / GIB:.1f} GiB per GPU ({parts} GiB) but "
            f"{usable / GIB:.1f} GiB is usable")
    return InfeasibleError(what, where=f"{cluster.name}, {cluster.num_gpus} GPUs",
                           fix="use more GPUs, full recomputation, a smaller micro-batch or "
                               "optimizer offload", smallest=smallest)


def _summary(est: Estimate) -> str:
    c = est.config
    return (f"dp{c.dp} tp{c.tp} pp{c.pp} cp{c.cp} ep{c.ep} zero{c.zero} mb{c.micro_batch} "
            f"ckpt:{c.checkpoint}{' offload' if c.offload else ''}")
