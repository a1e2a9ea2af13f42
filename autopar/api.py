"""The public entry points. This module only orchestrates: trace -> workload -> strategy solve ->
cost model; ``estimate``, ``plan_for`` and ``optimize`` price a configuration by one path
(``search.planner.config_estimate``): ``estimate`` is ``plan_for``'s estimate."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import torch.nn as nn

from autopar.analysis.admissibility import ModelFacts, check, facts_of, positions_problem
from autopar.costmodel.cluster import ClusterSpec
from autopar.core.errors import AutoparError
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autopar.core.estimate import Estimate
from autopar.costmodel.memory import activation_bytes_per_element
from autopar.core.specs import ParallelConfig, Precision, TrainSpec
from autopar.costmodel.step import COMPUTE_DTYPE, check_world, estimate_step
from autopar.costmodel.workload import Workload
from autopar.analysis.graph import GraphIR
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.search.planner import ProgressFn, plan_config, plan_search
from autopar.search.replan import Replan, batches, cluster_for
from autopar.analysis.trace_cache import traced
from autopar.analysis.workload import build_workload


def workload_of(model: nn.Module | GraphIR, train: TrainSpec, fusions: tuple[str, ...] = ()
                ) -> Workload:
    """Trace ``model`` (unless given a ``GraphIR``) and build the cost model's base tables
    (tp = 1: ``autopar.analysis.workload``); ``estimate`` prices another tp through the strategy
    solve."""
    graph = traced(model, train, cache=False)
    return build_workload(graph, activation_bytes_per_element(train.precision),
                          name=type(model).__name__ if not isinstance(model, GraphIR) else "",
                          fusions=fusions)


def as_cluster(cluster: ClusterSpec | str) -> ClusterSpec:
    """``cluster`` itself, or the one-node preset it names (``ClusterSpec.preset``)."""
    if isinstance(cluster, ClusterSpec):
        return cluster
    if isinstance(cluster, str):
        return ClusterSpec.preset(cluster)
    raise AutoparError(f"cluster must be a ClusterSpec or a preset name, not a "
                       f"{type(cluster).__name__}", where="cluster",
                       fix="pass ClusterSpec.preset(name, nodes=N), ClusterSpec.from_file(path) "
                           "or a preset name such as 'hgx-h100-80g' (one node)")


def as_config(config: ParallelConfig) -> ParallelConfig:
    """``config`` itself where it is a ``ParallelConfig``; ``AutoparError`` for anything else
    (``None`` included: a configuration to price is what ``estimate`` and ``plan_for`` take;
    ``optimize`` is the search)."""
    if isinstance(config, ParallelConfig):
        return config
    raise AutoparError(f"config must be a ParallelConfig, not {type(config).__name__}",
                       where="config", fix="pass ParallelConfig(dp=..., tp=..., ...), or call "
                                           "autopar.optimize(model, cluster, train) to search "
                                           "for the configuration")


def model_facts(model: nn.Module | GraphIR | Workload) -> ModelFacts:
    """What the admissibility check knows of ``model``: from its config and module tree, or
    only the blocks and layers of a traced graph."""
    if isinstance(model, nn.Module):
        return facts_of(model)
    if isinstance(model, GraphIR):
        return ModelFacts(num_blocks=model.num_blocks, layers=model.layers,
                          num_experts=graph_experts(model))
    if isinstance(model, Workload):
        return ModelFacts(num_blocks=model.num_blocks)
    raise AutoparError(f"model must be an nn.Module, a GraphIR or a Workload, not a "
                       f"{type(model).__name__}", where="model",
                       fix="pass the model object, e.g. autopar.models.build('gpt-1.7b')")


def graph_experts(graph: GraphIR) -> int | None:
    """Experts per MoE layer of a traced model: the first dimension of the stacked expert
    weights its MoE layers hold (``GraphIR.moe_modules``); ``None`` for a dense model or
    experts kept as a list of modules."""
    for name, meta in graph.params.items():
        if len(meta.shape) == 3 and any(name.startswith(m + ".") for m in graph.moe_modules):
            return int(meta.shape[0])
    return None


def _before_trace(model: nn.Module | GraphIR | Workload, train: TrainSpec) -> ModelFacts:
    """The model's facts, refusing up front a sequence longer than its positions (the trace
    would otherwise fail inside the model)."""
    if not isinstance(train, TrainSpec):
        raise AutoparError(f"train must be a TrainSpec, not a {type(train).__name__}",
                           where="train", fix="pass TrainSpec(global_batch=..., seq_len=...)")
    facts = model_facts(model)
    problem = positions_problem(facts, train.seq_len)
    if problem is not None:
        raise problem.error()
    return facts


def estimate(
    model: nn.Module | GraphIR | Workload,
    cluster: ClusterSpec | str,
    train: TrainSpec,
    config: ParallelConfig,
    *,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    split_weights: bool = False,
    trace_cache: bool = False,
) -> Estimate:
    """Predicted step time and memory of ``model`` on ``cluster`` under ``config``: the estimate
    of the plan ``optimize`` returns when every ``ParallelConfig`` field is fixed to
    ``config``'s, priced by the same path -- the per-op strategies solved for ``config.tp``
    (with ``split_weights``, ``plan_for``'s default, every linear layer the engine can split is
    split), the stages cut as the search cuts them: ``plan_for(...).estimate``. Refuses (``AutoparError``) a
    configuration that could not run for this model (``autopar.analysis.admissibility``), or whose
    solved strategies the engine could not run.

    A ``Workload`` (``workload_of``) is priced as given, which holds for tp = 1 only: it records
    no strategies, so nothing in it divides by tp. With ``config.tp > 1`` it is refused; pass
    the model or its ``GraphIR`` instead. ``trace_cache``: as ``optimize``'s."""
    config = as_config(config)
    if not isinstance(model, Workload):
        return plan_for(model, cluster, train, config, efficiency=efficiency,
                        split_weights=split_weights, trace_cache=trace_cache).estimate
    cluster = as_cluster(cluster)
    check_world(config, cluster)
    check(_before_trace(model, train), config, train)
    return estimate_step(model, cluster, train, config, efficiency=efficiency)  # refuses tp > 1


def optimize(
    model: nn.Module | GraphIR,
    cluster: ClusterSpec | str,
    train: TrainSpec,
    constraints: Mapping[str, object] | None = None,
    *,
    keep: int = 4,
    time_limit_s: float | None = None,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    progress: ProgressFn | None = None,
    name: str | None = None,
    split_weights: bool = False,
    model_spec: ModelSpec | None = None,
    precisions: Sequence[str] = (),
    trace_cache: bool = False,
) -> Plan:
    """The fastest plan that fits, with up to ``keep - 1`` runner-ups.

    ``precisions`` searches the precision too (``("bf16", "fp8")``: ``autopar plan --precision
    auto``): each is searched with ``train``'s other fields, the fastest plan that fits is
    returned, and each other precision's best plan is among its runner-ups; a precision the cluster's GPU
    has no peak for (fp8 on an A100) or with no plan that fits is left out, said in the plan's
    notes. Empty: ``train.precision`` only.

    ``constraints`` fix any ``ParallelConfig`` field (``{"tp": 8, "checkpoint": "full"}``).
    Raises ``AutoparError`` (an ``InfeasibleError``) naming the smallest footprint found and what
    would make it fit when no candidate fits. ``split_weights`` makes every weight GEMM split
    (column or row) when tp > 1, leaving the solve only the choice between them. The plan
    records ``model_spec`` (by default the zoo or transformers model's own, ``ModelSpec.of``)
    so that ``verify`` and ``export`` can rebuild the model. ``trace_cache`` reads the traced
    graph from the on-disk cache, and stores it there, where ``autopar plan`` does
    (``analysis/trace_cache.py``).
    """
    cluster = as_cluster(cluster)
    facts = _before_trace(model, train)
    graph = traced(model, train, cache=trace_cache)
    name = name or graph.model_name or type(model).__name__
    spec = model_spec or ModelSpec.of(model)

    def search_in(t: TrainSpec) -> Plan:
        return plan_search(graph, facts, name, cluster, t, constraints or {}, keep=keep,
                           time_limit_s=time_limit_s, efficiency=efficiency, progress=progress,
                           split_weights=split_weights, spec=spec)

    if not precisions:
        return search_in(train)
    return _best_precision(search_in, train, cluster, precisions, keep)


def _best_precision(search_in: Callable[[TrainSpec], Plan], train: TrainSpec,
                    cluster: ClusterSpec, precisions: Sequence[str], keep: int) -> Plan:
    """The fastest of each precision's best plan (``optimize``'s ``precisions``)."""
    plans, left_out = [], []
    for precision in dict.fromkeys(precisions):
        t = replace(train, precision=Precision(precision))
        # the peaks the precision's GEMMs run at: its compute dtype's, and FP8's under fp8
        needs = [COMPUTE_DTYPE[t.precision]] + (["fp8"] if t.precision is Precision.FP8 else [])
        missing = [d for d in needs if d not in cluster.gpu.peak_flop_per_s]
        if missing:
            left_out.append(f"{precision}: {cluster.gpu.name} has no {missing[0]} peak")
            continue
        try:
            plans.append(search_in(t))
        except AutoparError as err:
            left_out.append(f"{precision}: {err.what}")
    if not plans:
        raise AutoparError("no precision searched has a plan: " + "; ".join(left_out),
                           where="precisions", fix="allow another precision, or see each "
                           "precision's own error with --precision P")
    plans.sort(key=lambda p: p.estimate.step_time_s)
    best, others = plans[0], plans[1:]
    # each other precision's best is kept; the chosen precision's runner-ups fill the rest
    room = max(0, keep - 1 - len(others))
    alternatives = sorted((*best.alternatives[:room], *others),
                          key=lambda p: p.estimate.step_time_s)
    searched = ", ".join(f"{p.train.precision.value} {p.estimate.step_time_s:.3f} s"
                         for p in plans)
    note = (f"precision searched: {searched}"
            + (f"; left out: {'; '.join(left_out)}" if left_out else ""))
    estimate = replace(best.estimate, notes=(*best.estimate.notes, note))
    return replace(best, estimate=estimate, alternatives=tuple(alternatives))


def plan_for(
    model: nn.Module | GraphIR,
    cluster: ClusterSpec | str,
    train: TrainSpec,
    config: ParallelConfig,
    *,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    name: str | None = None,
    split_weights: bool = True,
    model_spec: ModelSpec | None = None,
    trace_cache: bool = False,
) -> Plan:
    """The ``Plan`` of one given configuration, with no search: its per-op strategies solved
    (by default every weight GEMM split, since a tp degree was asked for) and its step priced.
    What ``autopar verify`` and ``export`` run when a plan is given as flags. Refuses a
    configuration that could not run for this model (``autopar.analysis.admissibility``).
    ``trace_cache``: as ``optimize``'s."""
    cluster = as_cluster(cluster)
    config = as_config(config)
    check_world(config, cluster)
    facts = _before_trace(model, train)
    check(facts, config, train)
    graph = traced(model, train, cache=trace_cache)
    name = name or graph.model_name or type(model).__name__
    return plan_config(graph, facts, name, cluster, train, config, efficiency=efficiency,
                       split_weights=split_weights, spec=model_spec or ModelSpec.of(model))


def replan(plan: Plan, gpus: int, cluster: ClusterSpec | None = None, *, keep: int = 4,
           **search: object) -> Replan:
    """The fastest plan of ``plan``'s model and batch on ``gpus`` GPUs
    (``autopar/search/replan.py``): the plan's cluster (or ``cluster``) with that many GPUs,
    the plan's global batch or else the nearest one those GPUs admit a plan of, said in
    ``Replan.note``. ``search`` goes to ``optimize`` (``efficiency``, ``progress``...)."""
    if plan.model_spec is None:
        raise AutoparError("the plan records no model to re-plan", where="the plan's model_spec",
                           fix="re-plan with autopar plan --model ... on the GPUs left")
    sized = cluster_for(plan, gpus, cluster)
    model = plan.model_spec.build("meta")
    errors = []
    for batch in batches(plan.train.global_batch, sized.num_gpus):
        train = replace(plan.train, global_batch=batch)
        try:
            new = optimize(model, sized, train, keep=keep, name=plan.model,
                           model_spec=plan.model_spec, **search)
        except AutoparError as err:
            errors.append(f"global batch {batch}: {err.what}")
            continue
        note = ("" if batch == plan.train.global_batch else
                f"global batch {plan.train.global_batch} -> {batch}: the nearest "
                f"{sized.num_gpus} GPUs admit a plan of")
        return Replan(new, note)
    raise AutoparError(f"no plan of {plan.model} fits on {sized.num_gpus} GPUs: "
                       + "; ".join(errors[:3]), where="--gpus/--nodes",
                       fix="keep more GPUs, or re-plan with other constraints")
