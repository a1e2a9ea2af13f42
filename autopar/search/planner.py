"""From a traced graph to a ``Plan``: workload, search, and the plan with its runner-ups.

This module orchestrates the search stage only; the decisions are made in ``optimize`` (outer
candidates, branch and bound) and the per-candidate solves it calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from autopar.analysis.admissibility import ModelFacts, Problem, check_plan, styles_problems
from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.efficiency import Efficiency
from autopar.core.errors import AutoparError
from autopar.core.estimate import Estimate
from autopar.costmodel.memory import activation_bytes_per_element
from autopar.core.specs import TrainSpec
from autopar.analysis.graph import GraphIR
from autopar.core.model_spec import ModelSpec
from autopar.analysis.module_strategies import module_strategies
from autopar.core.plan import Plan, SolverInfo
from autopar.search.infeasible import infeasible_error
from autopar.search.optimize import search, stage_partition
from autopar.costmodel.memory import state_bytes_per_param
from autopar.costmodel.pipeline import StagePartition
from autopar.core.specs import ParallelConfig
from autopar.costmodel.step import estimate_step, split_of
from autopar.costmodel.topology import mesh_groups
from autopar.costmodel.workload import Workload
from autopar.search.block_tables import Pricing
from autopar.search.space import check_constraints
from autopar.search.tp_solve import StrategyResult, StrategySolver
from autopar.core.layout import Style
from autopar.analysis.ops import ops_without_rules
from autopar.analysis.workload import build_workload, without_attention_core

ProgressFn = Callable[[int, int], None]
"""Called as ``progress(done, total)`` while candidates are priced."""


@dataclass
class Strategies:
    """Each candidate's workload under the per-op strategies solved for its tp split."""

    solver: StrategySolver
    cluster: ClusterSpec
    train: TrainSpec
    efficiency: Efficiency
    facts: ModelFacts | None = None
    """When given, a candidate whose solved strategies the engine cannot run is refused."""
    _styles: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    _problem: dict[int, Problem | None] = field(default_factory=dict)
    _results: dict[ParallelConfig, StrategyResult] = field(default_factory=dict)
    _by_key: dict[tuple, StrategyResult] = field(default_factory=dict)

    def result(self, config: ParallelConfig) -> StrategyResult | None:
        """The solved strategies (None with tp = 1: every op runs whole on its GPU); the
        search asks for each candidate's twice (its bound, its pricing), and candidates of one
        split alike (``_solve_key``) share it."""
        if config.tp == 1:
            return None
        if config not in self._results:
            key = self._solve_key(config)
            if key not in self._by_key:
                self._by_key[key] = self._solve(config)
            self._results[config] = self._by_key[key]
        return self._results[config]

    def _solve_key(self, config: ParallelConfig) -> tuple:
        """What of ``config`` its solve reads (``_solve``, ``StrategySolver.solve``): the tp
        split, sequence parallelism, the fusions (the FP8 casts' kind), whether experts are
        split (their load), the tp group's placement; not the micro-batch, cp, ep's degree,
        dp, pp, ZeRO or the schedule."""
        return (config.tp, config.sequence_parallel, config.fusions, config.ep > 1,
                mesh_groups(config, self.cluster).tp)

    def _solve(self, config: ParallelConfig) -> StrategyResult:
        train, cluster, eff = self.train, self.cluster, self.efficiency
        split = replace(split_of(config, train, self.solver.base.seq_len), ep=1, etp=1)
        sb = state_bytes_per_param(train.precision, train.optimizer)
        param_s = (2 * sb.optimizer + sb.grads + sb.weights) / (
            cluster.gpu.hbm_bytes_per_s * eff.memory)
        scale = eff.moe_load_imbalance if config.ep > 1 else 1.0
        groups = mesh_groups(config, cluster)
        pricing = Pricing(split, groups.tp, cluster, eff, expert_scale=scale,
                          param_step_s=param_s)
        return self.solver.solve(pricing, config.sequence_parallel)

    def module_styles(self, result: StrategyResult) -> tuple[tuple[str, str], ...]:
        """The per-module styles of ``result`` (``module_strategies``), folded once per result
        (results are memoised by the solver)."""
        if id(result) not in self._styles:
            self._styles[id(result)] = module_strategies(self.solver.graph, dict(
                result.block_strategies + result.outer_strategies))
        return self._styles[id(result)]

    def __call__(self, config: ParallelConfig) -> Workload:
        """The candidate's workload; ``AutoparError`` when its strategies cannot run."""
        result = self.result(config)
        if result is None:
            return self.solver.whole()
        if self.facts is not None:
            if id(result) not in self._problem:
                found = styles_problems(self.facts, self.module_styles(result), config.tp)
                self._problem[id(result)] = found[0] if found else None
            problem = self._problem[id(result)]
            if problem is not None:
                raise AutoparError(problem.what, where="the strategy solve", fix=problem.fix)
        return result.workload


def _plan(est: Estimate, name: str, cluster: ClusterSpec, train: TrainSpec,
          strategies: Strategies,
          alternatives: tuple[Plan, ...] = (), solver: SolverInfo | None = None,
          spec: ModelSpec | None = None) -> Plan:
    c = est.config
    facts = strategies.facts
    if facts is not None and facts.unsplittable is not None:  # the report says why pp is 1
        est = replace(est, notes=(*est.notes, "pp = 1 only: the passes cannot cut this model "
                                  f"into pipeline stages ({facts.unsplittable})"))
    if facts is not None and facts.unsplittable_tp is not None:  # and why tp is 1
        est = replace(est, notes=(*est.notes, "tp = 1 only: the passes cannot split this model "
                                  f"by tensor parallelism ({facts.unsplittable_tp})"))
    result = strategies.result(c)
    graph = strategies.solver.graph
    ops = result.block_strategies if result is not None else tuple(
        (n.name, Style.REPLICATED) for n in graph.block_nodes(0) if n.out is not None)
    modules = strategies.module_styles(result) if result is not None else module_strategies(
        graph, dict(ops))
    return Plan(model=name, cluster=cluster.name, nodes=cluster.nodes,
                gpus_per_node=cluster.gpus_per_node, train=train, config=c, estimate=est,
                stage_blocks=tuple(sm.blocks for sm in est.stage_memory), block_strategies=ops,
                module_strategies=modules,
                ops_without_rules=ops_without_rules(graph.nodes), alternatives=alternatives,
                solver=solver, model_spec=spec)


def strategies_of(graph: GraphIR, facts: ModelFacts, name: str, cluster: ClusterSpec,
                  train: TrainSpec, *, efficiency: Efficiency, fusions: tuple[str, ...] = (),
                  split_weights: bool = False) -> Strategies:
    """The workload of every configuration of ``graph`` under the per-op strategies solved for
    its tp split (memoised per split): what the search and ``plan_config`` price."""
    act = activation_bytes_per_element(train.precision)
    work = build_workload(graph, act, name=name, fusions=fusions)
    if not facts.attention_core_hook:  # selective runs such a model's cores whole
        work = without_attention_core(work)
    solver = StrategySolver(graph, work, act, split_weights=split_weights)
    # context parallelism gathers the K/V of a fused attention op: the traced graph says whether
    # there is one, which the module tree alone (``facts_of``) cannot
    fused = any(op.kv_elements > 0 for op in work.block.ops)
    return Strategies(solver, cluster, train, efficiency, replace(facts, fused_attention=fused))


def config_estimate(strategies: Strategies, config: ParallelConfig,
                    partition: StagePartition | None = None) -> Estimate:
    """``config`` priced as the search prices the candidate: its workload under the strategies
    solved for its tp split, its pipeline stages cut as the search cuts them (balanced by
    compute for 1F1B and GPipe, equal chunks for the interleaved schedule), or as
    ``partition`` gives them. Raises ``AutoparError`` when the solved strategies could not
    run."""
    work = strategies(config)
    cluster, train, eff = strategies.cluster, strategies.train, strategies.efficiency
    part = partition if partition is not None or config.pp == 1 else \
        stage_partition(work, config, train, cluster, eff)
    return estimate_step(work, cluster, train, config, efficiency=eff, partition=part)


def plan_config(graph: GraphIR, facts: ModelFacts, name: str, cluster: ClusterSpec,
                train: TrainSpec, config: ParallelConfig, *, efficiency: Efficiency,
                split_weights: bool, spec: ModelSpec | None = None,
                partition: StagePartition | None = None) -> Plan:
    """The plan of one given configuration (no search): its per-op strategies solved, its
    step priced as the search prices that candidate (``config_estimate``; its stages as
    ``partition`` cuts them where given); it may not fit (``plan.estimate.fits``). Raises
    ``AutoparError`` when the plan could not run (``admissibility.check_plan``)."""
    strategies = strategies_of(graph, facts, name, cluster, train, efficiency=efficiency,
                               fusions=config.fusions, split_weights=split_weights)
    est = config_estimate(strategies, config, partition)
    plan = _plan(est, name, cluster, train, strategies, spec=spec)
    check_plan(strategies.facts, plan)
    return plan


def plan_search(graph: GraphIR, facts: ModelFacts, name: str, cluster: ClusterSpec,
                train: TrainSpec, constraints: Mapping[str, object], *, keep: int,
                time_limit_s: float | None, efficiency: Efficiency,
                progress: ProgressFn | None, split_weights: bool = False,
                spec: ModelSpec | None = None) -> Plan:
    """Search and build the ``Plan``; raise ``InfeasibleError`` when nothing fits. The search
    offers only candidates ``facts`` admits, and the plan is checked again
    (``admissibility.check_plan``) before it is returned."""
    constraints = dict(constraints)
    check_constraints(constraints)
    fusions = tuple(constraints.get("fusions", ()) or ())  # type: ignore[arg-type]
    strategies = strategies_of(graph, facts, name, cluster, train, efficiency=efficiency,
                               fusions=fusions, split_weights=split_weights)
    facts = strategies.facts
    result = search(strategies, facts, cluster, train, constraints, keep=keep,
                    efficiency=efficiency, progress=progress, time_limit_s=time_limit_s)
    if not result.best:
        raise infeasible_error(result.smallest, cluster, constraints, train=train, facts=facts,
                               refused=result.stats.refused)
    alts = tuple(_plan(e, name, cluster, train, strategies)
                 for e in result.best[1:])
    gap = max([result.gap, *(r.gap for r in strategies.solver.cache.values())])
    info = SolverInfo(status="optimal" if gap == 0 else "feasible", gap=gap,
                      candidates=result.priced, pruned=result.stats.total_pruned,
                      wall_s=result.wall_s)
    plan = _plan(result.best[0], name, cluster, train, strategies, alts,
                 info, spec)
    check_plan(facts, plan)
    return plan
