"""Cost tables of one layer for the per-op strategy solve, and the solved layer back as costs.

``strategy_graph`` turns a layer's traced nodes into the ops the solve chooses for: one per node
with an output tensor (metadata nodes are dropped), a ``fork`` after every tensor read by several
ops (so that the gradient of a tensor read by several column splits is reduced once, not once per
reader, as DTensor and Megatron do), and ``source``/``sink`` ops that pin the layouts a layer
receives from and hands to its neighbours. ``block_problem`` prices every strategy with the cost
model's roofline (``estimate_op_s``) and every edge with the collectives of ``reshard`` on the
candidate's tp group, giving the ``ilp.BlockProblem`` the solver takes. ``solved_layer`` turns
the chosen strategies into the ``LayerCost`` the step model prices: which ops and saved tensors
divide by tp, which parameters are split, and the collectives of every resharding edge.
"""

from __future__ import annotations

from collections.abc import Mapping

import math
from dataclasses import dataclass, replace

from autopar.costmodel.cluster import ClusterSpec
from autopar.core.collectives import Collective
from autopar.costmodel.collectives import Group
from autopar.costmodel.compute import Split, estimate_op_s
from autopar.costmodel.efficiency import Efficiency
from autopar.costmodel.step import tp_collective_s
from autopar.core.layout import Layout, Shard, Strategy, Style, shard_of
from autopar.costmodel.workload import LayerCost, OpCost, Phase, SavedTensor, TPCollective
from autopar.analysis.graph import GraphIR, NodeInfo
from autopar.analysis.ops import kept_by_matmuls, outer_regions, strategies_for
from autopar.analysis.ops.loss import LOSS_PARALLEL_TRANSIENT_BYTES
from autopar.analysis.ops.stream import residual_stream
from autopar.search.backward_walk import backward_moments, saved_as_held
from autopar.search.ilp_types import BlockProblem, Edge, StrategyTable
from autopar.search.reshard import conversion
from autopar.search.forced import forced_splits

IMPOSSIBLE = math.inf
"""Resharding time of a conversion that cannot be done: the solver forbids the pair."""

LOSS_PARALLEL_REDUCTIONS = 3
"""A vocabulary-split cross-entropy all-reduces the max, the sum of exponentials and the target
logit of every token (Megatron's ``vocab_parallel_cross_entropy``), in fp32."""


@dataclass(frozen=True)
class StratOp:
    """One op of the strategy graph."""

    name: str
    strategies: tuple[Strategy, ...]
    inputs: tuple[int, ...]
    """Index of the producer op of each activation input."""
    tensors: tuple[str, ...]
    """The tensor each input reads (the producer node's output)."""
    node: NodeInfo | None = None
    """The traced node; None for forks, sources and sinks (an op without a strategy rule has
    the one replicated strategy, and the layer's ``no_rule_ops`` lists it)."""


def _fork(name: str, producer: int | None, tensor: str, sp: bool) -> StratOp:
    """A fork of ``tensor`` for its readers; ``producer`` None: the layer's input, joined to the
    previous block's output by a boundary edge."""
    layouts = [Layout.R, Layout.S] + ([Layout.Q] if sp else [])
    strategies = [Strategy(lay, (lay,), lay, divides=False) for lay in layouts]
    rp = Layout.R_PARTIAL_GRAD
    strategies.append(Strategy(rp, (rp,), rp, divides=False))
    if producer is None:
        return StratOp(name, tuple(strategies), (), ())
    return StratOp(name, tuple(strategies), (producer,), (tensor,))


def _pinned(name: str, layout: Layout, producer: int | None = None, tensor: str = ""
            ) -> StratOp:
    if producer is None:  # a source: no input, output in ``layout``
        return StratOp(name, (Strategy(layout, (), layout, divides=False),), (), ())
    return StratOp(name, (Strategy(layout, (layout,), layout, divides=False),),
                   (producer,), (tensor,))


@dataclass(frozen=True)
class StrategyGraph:
    ops: tuple[StratOp, ...]
    output: int
    """The op whose output leaves the layer."""
    stream_in: int | None
    """The op receiving the layer's input activation (a fork), if any."""
    output_tensor: str = ""
    """The traced node whose output leaves the layer."""
    stream_tensor: str | None = None
    """The tensor the layer receives from outside (the previous layer's output)."""


def strategy_graph(graph: GraphIR, nodes: list[NodeInfo], sp: bool, *,
                   input_layout: Layout | None = None, output_layout: Layout | None = None,
                   split_weights: bool = False, output_tensor: str | None = None,
                   fixed: Mapping[str, str] | None = None, tp: int = 1) -> StrategyGraph:
    """The ops the solve chooses for. ``input_layout`` pins the layout the layer receives its
    activation input in (a ``source``); without it the input is a fork the caller joins to the
    previous block's output. ``output_layout`` adds a ``sink`` requiring that layout of the
    layer's output: the output of ``output_tensor`` when given (the tensor the next layer
    reads; a transformers model computes masks and rotary tables after its embedding), else of
    the layer's last op. ``split_weights`` leaves the linear layers only their split
    strategies where every one of a module's can take its split (``search.forced``);
    ``fixed`` names the one strategy some ops must take (a table tied to a solved head); only
    splits ``tp`` divides are offered."""
    real = [n for n in nodes if n.out is not None]
    forced = forced_splits(graph, real, tp) if split_weights else frozenset()
    outer = outer_regions(graph, real)
    names = {n.name for n in real}
    readers: dict[str, int] = {}
    for n in real:
        for i in n.inputs:
            if i in names or graph.has_node(i):
                readers[i] = readers.get(i, 0) + 1
    ops: list[StratOp] = []
    index: dict[str, int] = {}
    external = next((i for n in real for i in n.inputs
                     if i not in names and graph.has_node(i) and graph.node(i).out is not None
                     and graph.node(i).out.dtype.is_floating_point), None)
    stream_in = None
    leaving = output_tensor if output_tensor in names | {external} else real[-1].name
    stream = residual_stream(graph, real, external, leaving)
    if external is not None:
        if input_layout is not None:
            ops.append(_pinned("source", input_layout))
            index[external] = len(ops) - 1
        else:
            ops.append(_fork(f"fork:{external}", None, external, sp))
            stream_in = len(ops) - 1
            index[external] = stream_in
    for n in real:
        producers, tensors = [], []
        for i in n.inputs:
            if i in index:
                producers.append(index[i])
                tensors.append(i)
        strategies = strategies_for(n, graph, sp, stream, tp, forced, outer)
        if fixed and n.name in fixed:
            strategies = [st for st in strategies if st.name == fixed[n.name]] or strategies
        # rules see every graph-node input; keep the layouts of the ones inside this layer
        kept = [k for k, i in enumerate(x for x in n.inputs if graph.has_node(x)) if i in index]
        strategies = [s if len(kept) == len(s.inputs) and kept == list(range(len(kept)))
                      else replace(s, inputs=tuple(s.inputs[k] for k in kept))
                      for s in strategies]
        ops.append(StratOp(n.name, tuple(strategies), tuple(producers), tuple(tensors), n))
        index[n.name] = len(ops) - 1
        if readers.get(n.name, 0) > 1:
            ops.append(_fork(f"fork:{n.name}", index[n.name], n.name, sp))
            index[n.name] = len(ops) - 1
    output = index[leaving]
    if output_layout is not None:
        ops.append(_pinned("sink", output_layout, output, leaving))
    return StrategyGraph(tuple(ops), output, stream_in, leaving, external)


@dataclass(frozen=True)
class Pricing:
    """What one candidate's tables depend on."""

    split: Split
    tp_group: Group
    cluster: ClusterSpec
    eff: Efficiency
    expert_scale: float = 1.0
    param_step_s: float = 0.0
    """Seconds one GPU spends per parameter it holds on each step outside the forward and
    backward (the optimizer's read and write of the states). Charged to every strategy for the
    parameters it keeps on a GPU, once per micro-batch priced: the solve sees one micro-batch, so
    this is an upper bound that leans towards splitting weights, never away from it."""


def conversion_collectives(graph: GraphIR, tensor: str, src: Layout, dst: Layout,
                           act_bytes: float, tp: int, label: str = ""
                           ) -> list[TPCollective] | None:
    """The tp collectives turning ``tensor`` from ``src`` into ``dst`` (None: impossible), sized
    per sequence in activation-dtype elements as ``costmodel.step.tp_comm_s`` prices them: an
    integer tensor moves its own itemsize, an all-to-all what one rank holds."""
    out = graph.node(tensor).out
    assert out is not None
    floating = out.dtype.is_floating_point
    conv = conversion(src, dst, has_grad=floating)
    if conv is None:
        return None
    size = act_bytes if floating else out.dtype.itemsize
    elements = out.numel / graph.batch * size / act_bytes
    return [TPCollective(label, elements / tp if kind is Collective.ALL_TO_ALL else elements,
                         phase, str(kind))
            for phase, kinds in ((Phase.FORWARD, conv[0]), (Phase.BACKWARD_ACT, conv[1]))
            for kind in kinds]


def loss_parallel_collectives(graph: GraphIR, node: NodeInfo, act_bytes: float
                              ) -> list[TPCollective]:
    """A vocabulary-split loss's all-reduces of one fp32 value per token."""
    logits = graph.node(node.inputs[0]).out if node.inputs and graph.has_node(
        node.inputs[0]) else None
    tokens = logits.numel / logits.shape[-1] / graph.batch if logits is not None else 0.0
    return [TPCollective(f"{node.name}.loss{r}", tokens * 4.0 / act_bytes, Phase.FORWARD)
            for r in range(LOSS_PARALLEL_REDUCTIONS)]


def _priced_s(collectives: list[TPCollective], pricing: Pricing) -> float:
    """Seconds of ``collectives`` for one micro-batch on the tp group."""
    return sum(tp_collective_s(c, pricing.split, pricing.tp_group, pricing.cluster, pricing.eff)
               for c in collectives)


def edge_s(graph: GraphIR, tensor: str, producer: Layout, consumer: Layout,
           pricing: Pricing) -> float:
    cols = conversion_collectives(graph, tensor, producer, consumer, pricing.split.act_bytes,
                                  pricing.split.tp)
    return IMPOSSIBLE if cols is None else _priced_s(cols, pricing)


def _op_time(cost: OpCost | None, s: Strategy, graph: GraphIR, node: NodeInfo | None,
             pricing: Pricing) -> float:
    """Forward + backward seconds of one op under ``s``, its collectives and its share of the
    optimizer step included."""
    total = 0.0
    if cost is not None:
        op = replace(cost, shard=Shard.TP if s.divides else Shard.REPLICATED)
        t = estimate_op_s(op, pricing.split, pricing.cluster, pricing.eff,
                          expert_scale=pricing.expert_scale)
        total = t.forward + t.backward
    if node is not None and node.params and pricing.param_step_s:
        held = sum(graph.params[p].numel / (pricing.split.tp if _is_split(graph, p, s) else 1)
                   for p in node.params if p in graph.params)
        total += held * pricing.param_step_s
    if s.loss_parallel and node is not None:
        total += _priced_s(loss_parallel_collectives(graph, node, pricing.split.act_bytes),
                           pricing)
    return total


def head_node(cost: OpCost) -> str:
    """The node an op cost belongs to: itself, or the first node of a fused chain (named
    ``pattern:first`` by ``workload.op_costs``)."""
    return cost.name.split(":", 1)[1] if ":" in cost.name else cost.name


def costs_by_node(layer: LayerCost) -> dict[str, OpCost]:
    """The layer's op costs keyed by the node that heads them."""
    return {head_node(c): c for c in layer.ops}


def block_problem(graph: GraphIR, sg: StrategyGraph, layer: LayerCost, pricing: Pricing,
                  *, repeat: int = 1, boundary: bool = False) -> BlockProblem:
    """The solver's tables for ``sg`` priced for one candidate. With ``boundary`` the layer's
    output feeds its own input fork in the next instance (a repeated block)."""
    by_node = costs_by_node(layer)
    tables = []
    for op in sg.ops:
        times = tuple(_op_time(by_node.get(op.name), s, graph, op.node, pricing)
                      for s in op.strategies)
        tables.append(StrategyTable(names=tuple(s.name for s in op.strategies),
                                    compute_s=times, op=op.name))
    edges = [Edge(i, j, tuple(tuple(edge_s(graph, tensor, a.output, b.inputs[k], pricing)
                                    for b in op.strategies) for a in sg.ops[i].strategies))
             for j, op in enumerate(sg.ops)
             for k, (i, tensor) in enumerate(zip(op.inputs, op.tensors))]
    boundary_edges = []
    if boundary and sg.stream_in is not None:
        fork = sg.ops[sg.stream_in]
        boundary_edges.append(Edge(sg.output, sg.stream_in, tuple(
            tuple(edge_s(graph, sg.output_tensor, a.output, b.inputs[0], pricing)
                  for b in fork.strategies) for a in sg.ops[sg.output].strategies)))
    return BlockProblem(ops=tuple(tables), edges=tuple(edges), repeat=repeat,
                        boundary_edges=tuple(boundary_edges))


def _is_split(graph: GraphIR, param: str, s: Strategy) -> bool:
    """Whether ``s`` divides ``param`` over the tp ranks: every weight matrix of a split op, a
    bias only under a column split (a row split adds it once, after the reduction)."""
    return s.shards_params and (len(graph.params[param].shape) >= 2 or s.name is Style.COLUMN)


@dataclass(frozen=True)
class SolvedLayer:
    layer: LayerCost
    strategies: tuple[tuple[str, str], ...]
    """(node, strategy) of every traced op."""
    input_layout: Layout | None
    output_layout: Layout


def solved_layer(graph: GraphIR, sg: StrategyGraph, layer: LayerCost, choice: tuple[int, ...],
                 act_bytes: float, tp: int, *, walk_backward: bool = False) -> SolvedLayer:
    """``layer`` re-priced under the chosen strategies (``choice[i]`` for ``sg.ops[i]``);
    ``walk_backward``: with its backward walked op by op (``LayerCost.backward``, what the
    memory model asks of the repeated block)."""
    chosen = [op.strategies[c] for op, c in zip(sg.ops, choice)]
    layout = {op.name: s.output for op, s in zip(sg.ops, chosen) if op.node is not None}
    if sg.stream_tensor is not None:
        layout[sg.stream_tensor] = chosen[sg.stream_in].output if sg.stream_in is not None \
            else sg.ops[0].strategies[0].output
    collectives: list[TPCollective] = []
    for j, op in enumerate(sg.ops):
        for k, (i, tensor) in enumerate(zip(op.inputs, op.tensors)):
            label = f"{sg.ops[i].name}->{op.name}"
            cols = conversion_collectives(graph, tensor, chosen[i].output, chosen[j].inputs[k],
                                          act_bytes, tp, label)
            if cols is None:
                raise RuntimeError(f"the strategy solve chose an impossible resharding at "
                                   f"{label}; please report this")
            collectives += cols
        if chosen[j].loss_parallel and op.node is not None:
            collectives += loss_parallel_collectives(graph, op.node, act_bytes)
    divides = {op.name: s.divides for op, s in zip(sg.ops, chosen) if op.node is not None}
    ops = tuple(replace(c, shard=Shard.TP if divides.get(head_node(c), False)
                        else Shard.REPLICATED) for c in layer.ops)
    rows = {op.name for op, s in zip(sg.ops, chosen) if op.node is not None
            and s.name is Style.ROW and kept_by_matmuls(op.node, graph)}
    saved = _cached_partials(tuple(_saved_shard(graph, s, layout) for s in layer.saved), rows)
    # expert weights (3-d) are divided by ep in the step model; no tp split reaches them
    split_params = {p for op, s in zip(sg.ops, chosen) if op.node is not None
                    for p in op.node.params if p in graph.params and _is_split(graph, p, s)
                    and len(graph.params[p].shape) != 3}
    params_tp = min(sum(graph.params[p].numel for p in split_params),
                    layer.params - layer.params_expert)
    vocab = {p for op, s in zip(sg.ops, chosen) if op.node is not None and s.name is Style.VOCAB
             for p in op.node.params if p in split_params}
    solved = replace(layer, ops=ops, saved=saved, params_tp=params_tp,
                     params_vocab=sum(graph.params[p].numel for p in vocab),
                     tp_collectives=tuple(collectives))
    if walk_backward:
        share = {op.node.name: sum(graph.params[p].numel / (tp if p in split_params else 1)
                                   for p in op.node.params if p in graph.params)
                 for op in sg.ops if op.node is not None}
        held, released = saved_as_held(graph, sg, chosen, saved)
        moments = backward_moments(graph, sg, chosen, solved, held, released, share)
        solved = replace(solved, held=held, backward=moments)
    strategies = tuple((op.name, s.name) for op, s in zip(sg.ops, chosen) if op.node is not None)
    stream = chosen[sg.stream_in].output if sg.stream_in is not None else None
    return SolvedLayer(solved, strategies, stream, chosen[sg.output].output)


def _cached_partials(saved: tuple[SavedTensor, ...], rows: set[str]) -> tuple[SavedTensor, ...]:
    """The matmuls policy caches a row-split linear's output before its reduction: a
    full-size partial sum on every tp rank, divided by neither tp nor SP, and not the reduced
    tensor a reader may keep for autograd. The mark of each such output (in ``rows``) moves to
    an entry of its own, ``<node>.partial``."""
    out: list[SavedTensor] = []
    added: list[SavedTensor] = []
    for t in saved:
        if t.name not in rows or not t.matmuls:
            out.append(t)
            continue
        partial = replace(t, name=t.name + ".partial", shard=Shard.REPLICATED,
                          without_checkpoint=False)
        if t.without_checkpoint:  # autograd keeps the reduced output too
            out.append(replace(t, matmuls=False))
            added.append(partial)
        else:
            out.append(partial)
    return (*out, *added)


def _saved_shard(graph: GraphIR, saved: SavedTensor, layout: dict[str, Layout]) -> SavedTensor:
    base, _, suffix = saved.name.partition(".")
    if suffix == "logprobs" and graph.has_node(base) and graph.node(base).inputs:
        base = graph.node(base).inputs[0]
    lay = layout.get(base)
    shard = shard_of(lay) if lay is not None else Shard.REPLICATED
    if suffix == "grad" and saved.transient and shard is Shard.TP:
        # the loss over vocabulary-split logits: loss_parallel's working set (ops/loss.py)
        return replace(saved, shard=shard, bytes_per_element=LOSS_PARALLEL_TRANSIENT_BYTES)
    return replace(saved, shard=shard)
