"""From a traced graph to a ``Plan``: workload, search, and the plan with its runner-ups.

This module orchestrates the search stage only; the decisions are made in ``optimize`` (outer
candidates, branch and bound) and the per-candidate solves it calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch.nn as nn

from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.efficiency import Efficiency
from autopar.costmodel.estimate import Estimate
from autopar.costmodel.memory import activation_bytes_per_element
from autopar.costmodel.pipeline import even_partition
from autopar.costmodel.specs import TrainSpec
from autopar.graph import GraphIR
from autopar.plan import Plan, SolverInfo
from autopar.search.infeasible import infeasible_error
from autopar.search.optimize import search
from autopar.search.space import check_constraints, shape_of
from autopar.workload import build_workload

ProgressFn = Callable[[int, int], None]
"""Called as ``progress(done, total)`` while candidates are priced."""


def _plan(est: Estimate, name: str, cluster: ClusterSpec, train: TrainSpec,
          ops_without_rules: tuple[str, ...], num_blocks: int,
          alternatives: tuple[Plan, ...] = (), solver: SolverInfo | None = None) -> Plan:
    c = est.config
    part = even_partition(num_blocks, c.pp, 1)
    return Plan(model=name, cluster=cluster.name, nodes=cluster.nodes,
                gpus_per_node=cluster.gpus_per_node, train=train, config=c, estimate=est,
                stage_blocks=tuple(part.blocks), ops_without_rules=ops_without_rules,
                alternatives=alternatives, solver=solver)


def plan_search(graph: GraphIR, model: nn.Module | GraphIR, name: str, cluster: ClusterSpec,
                train: TrainSpec, constraints: Mapping[str, object], *, keep: int,
                time_limit_s: float | None, efficiency: Efficiency,
                progress: ProgressFn | None) -> Plan:
    """Search and build the ``Plan``; raise ``InfeasibleError`` when nothing fits."""
    constraints = dict(constraints)
    check_constraints(constraints)
    fusions = tuple(constraints.get("fusions", ()) or ())  # type: ignore[arg-type]
    work = build_workload(graph, activation_bytes_per_element(train.precision), name=name,
                          fusions=fusions)
    shape = shape_of(model, graph.num_blocks)
    result = search(work, shape, cluster, train, constraints, keep=keep, efficiency=efficiency,
                    progress=progress)
    if not result.best:
        raise infeasible_error(result.smallest, cluster, constraints)
    no_rule = tuple(sorted(set(work.pre.no_rule_ops) | set(work.block.no_rule_ops)
                           | set(work.post.no_rule_ops)))
    alts = tuple(_plan(e, name, cluster, train, no_rule, graph.num_blocks)
                 for e in result.best[1:])
    info = SolverInfo(status="optimal", gap=0.0, candidates=result.priced,
                      pruned=result.stats.total_pruned, wall_s=result.wall_s)
    return _plan(result.best[0], name, cluster, train, no_rule, graph.num_blocks, alts, info)
