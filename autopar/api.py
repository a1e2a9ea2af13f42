"""The public entry points. This module only orchestrates: trace -> workload -> cost model."""

from __future__ import annotations

from collections.abc import Mapping

import torch.nn as nn

from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autopar.costmodel.estimate import Estimate
from autopar.costmodel.memory import activation_bytes_per_element
from autopar.costmodel.specs import ParallelConfig, TrainSpec
from autopar.costmodel.step import check_world, estimate_step
from autopar.costmodel.workload import Workload
from autopar.graph import GraphIR
from autopar.plan import Plan
from autopar.search.planner import ProgressFn, plan_config, plan_search
from autopar.tracing import trace
from autopar.workload import build_workload


def workload_of(model: nn.Module | GraphIR, train: TrainSpec, fusions: tuple[str, ...] = ()
                ) -> Workload:
    """Trace ``model`` (unless given a ``GraphIR``) and build the cost model's tables."""
    graph = model if isinstance(model, GraphIR) else trace(model, train)
    return build_workload(graph, activation_bytes_per_element(train.precision),
                          name=type(model).__name__ if not isinstance(model, GraphIR) else "",
                          fusions=fusions)


def estimate(
    model: nn.Module | GraphIR | Workload,
    cluster: ClusterSpec,
    train: TrainSpec,
    config: ParallelConfig,
    *,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
) -> Estimate:
    """Predicted step time and memory of ``model`` on ``cluster`` under ``config``."""
    # Fail on a configuration that cannot run before spending a trace on it.
    check_world(config, cluster)
    config.microbatches(train)
    work = model if isinstance(model, Workload) else workload_of(model, train, config.fusions)
    return estimate_step(work, cluster, train, config, efficiency=efficiency)


def optimize(
    model: nn.Module | GraphIR,
    cluster: ClusterSpec,
    train: TrainSpec,
    constraints: Mapping[str, object] | None = None,
    *,
    keep: int = 4,
    time_limit_s: float | None = None,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    progress: ProgressFn | None = None,
    name: str | None = None,
    split_weights: bool = False,
) -> Plan:
    """The fastest plan that fits, with up to ``keep - 1`` runner-ups.

    ``constraints`` fix any ``ParallelConfig`` field (``{"tp": 8, "checkpoint": "full"}``).
    Raises ``AutoparError`` (an ``InfeasibleError``) naming the smallest footprint found and what
    would make it fit when no candidate fits. ``split_weights`` makes every weight GEMM split
    (column or row) when tp > 1, leaving the solve only the choice between them.
    """
    graph = model if isinstance(model, GraphIR) else trace(model, train)
    name = name or graph.model_name or type(model).__name__
    return plan_search(graph, model, name, cluster, train, constraints or {}, keep=keep,
                       time_limit_s=time_limit_s, efficiency=efficiency, progress=progress,
                       split_weights=split_weights)


def plan_for(
    model: nn.Module | GraphIR,
    cluster: ClusterSpec,
    train: TrainSpec,
    config: ParallelConfig,
    *,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    name: str | None = None,
    split_weights: bool = True,
) -> Plan:
    """The ``Plan`` of one given configuration, with no search: its per-op strategies solved
    (by default every weight GEMM split, since a tp degree was asked for) and its step priced.
    What ``autopar verify`` and ``export`` run when a plan is given as flags."""
    check_world(config, cluster)
    config.microbatches(train)
    graph = model if isinstance(model, GraphIR) else trace(model, train)
    name = name or graph.model_name or type(model).__name__
    return plan_config(graph, name, cluster, train, config, efficiency=efficiency,
                       split_weights=split_weights)
