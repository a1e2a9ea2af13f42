"""A new plan when nodes are lost (``autopar replan``, ``autopar.api.replan``): the same model
and batch on fewer GPUs -- the cluster and the batches to try; ``api.replan`` runs the search.

The exported ``train.py`` keys its DCP checkpoints by the model's own parameter names and
reshards them on load (``exports/train_template.py``), so a run checkpointed under one plan
resumes under any other plan of the same model: re-planning is a search on the GPUs left.

* the cluster: the plan's own (a preset by name, or the ``<preset>-<n>gpu`` one-node cluster of
  a plan made for CPU processes), or the one given, with the new GPU count;
* the model: the one the plan records (``Plan.model_spec``);
* the batch: the plan's global batch where the new GPU count admits a plan of it, else the
  nearest one that does (``BATCH_TRIES`` candidates, closest first), said in the result.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autopar.core.errors import AutoparError
from autopar.core.plan import Plan
from autopar.costmodel.cluster import ClusterSpec, preset_names, process_cluster

BATCH_TRIES = 8
"""Global batches tried when the plan's own admits no plan on the new GPUs."""

_PROCESS = re.compile(r"^(?P<like>.+)-(?P<n>\d+)gpu$")


@dataclass(frozen=True)
class Replan:
    plan: Plan
    note: str
    """What changed beside the GPUs (the global batch), or empty."""


def cluster_for(plan: Plan, gpus: int, cluster: ClusterSpec | None = None) -> ClusterSpec:
    """``plan``'s cluster (or ``cluster``) with ``gpus`` GPUs, whole nodes."""
    if cluster is None:
        found = _PROCESS.match(plan.cluster)
        if found and found["like"] in preset_names():
            return process_cluster(gpus, found["like"])
        if plan.cluster not in preset_names():
            raise AutoparError(f"the plan's cluster {plan.cluster!r} is no preset",
                               where="the plan's cluster",
                               fix="give the cluster again: --cluster NAME or a cluster file")
        cluster = ClusterSpec.preset(plan.cluster)
    per = cluster.gpus_per_node
    if gpus < 1 or gpus % per:
        raise AutoparError(f"{gpus} GPUs are not whole nodes of {per}", where="--gpus/--nodes",
                           fix=f"give a multiple of {per} GPUs, or --nodes N")
    return cluster.with_nodes(gpus // per)


def batches(global_batch: int, gpus: int) -> list[int]:
    """The plan's global batch, then the multiples of ``gpus``, ``gpus / 2``, ``gpus / 4``...
    nearest to it, closest first."""
    near, unit = {global_batch}, gpus
    while unit >= 1 and gpus % unit == 0:
        k = max(1, round(global_batch / unit))
        near |= {unit * max(1, k - 1), unit * k, unit * (k + 1)}
        unit //= 2
    return sorted(near, key=lambda b: (abs(b - global_batch), b))[:BATCH_TRIES]
