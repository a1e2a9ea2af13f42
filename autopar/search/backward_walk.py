"""A layer's backward, op by op: what its working set holds while each op runs its backward.

The engine's peak inside a block's backward is not the recomputed activations alone (the dry run
of the emitted program, ``bench/results/memory_grid.md``): while a linear layer of a 405B block
runs its input-gradient GEMM under tp 8 with sequence parallelism, the rank holds the gradient of
its output, the whole-sequence gradient of its gathered input -- twice when two layers read that
input (gate and up projections: autograd keeps the first gradient and adds the second) -- the
recomputed activations the ops still to run will read, and the weight gradients made so far.

``backward_moments`` walks the strategy graph of a solved layer (``block_tables.strategy_graph``
and the solve's choice) in reverse, as autograd runs it:

* the gradient of the layer's output arrives first, in the layout the layer emits it;
* an op's backward reads the gradient of its output and makes one of each differentiable input,
  in the layout it reads that input in (``Strategy.inputs``: a column split's gathered input
  gets a whole gradient, partial sums until the reduction); that gradient becomes the buffer of
  the producer's output, in the producer's layout, or is added to the buffer already there (the
  sum is in place; the new addend is alive while the op runs);
* views, forks and additions of same-shaped tensors pass the gradient through without
  allocating (autograd returns the same tensor);
* the gradient of an op's output is released once its backward ran, and so is every saved
  tensor whose savers have all run (a tensor saved by several ops lives until the one earliest
  in the forward);
* a weight op's backward makes its weight's gradient (FSDP2 reduces or accumulates the unit's
  gradients after its whole backward, ``passes/data_parallel.py``).

Each op that allocates gives one ``costmodel.workload.BackwardMoment``; sizes stay element
counts with their ``Shard``, so the cost model sizes them for any micro-batch, cp and precision
(``costmodel.memory.backward_peak``), and a checkpointing policy decides which saved tensors
the recomputation rebuilt.
"""

from __future__ import annotations

from dataclasses import replace

from typing import TYPE_CHECKING

from autopar.core.layout import Layout, Strategy, shard_of
from autopar.costmodel.workload import BackwardMoment, LayerCost, OpKind, SavedTensor
from autopar.analysis.graph import GraphIR
from autopar.analysis.ops import kind_of, storage_of

if TYPE_CHECKING:
    from .block_tables import StrategyGraph


def saved_as_held(graph: GraphIR, sg: StrategyGraph, chosen: list[Strategy],
                  saved: tuple[SavedTensor, ...]
                  ) -> tuple[tuple[SavedTensor, ...], dict[int, set[str]]]:
    """The layer's saved activations as its ops hold them, and when each is released.

    ``saved`` sizes each tensor in the layout its producer emits it in; an op keeps it in the
    layout it reads it in, so a column split under sequence parallelism keeps its gathered
    input whole (DTensor's linear saves what it multiplies; Megatron instead saves the
    sequence-split input and gathers it again in the backward). An activation gets one entry
    per layout its savers hold it in (``name@layout``). Everything else -- the layer's input,
    which the layer does not make, the matmuls policy's cached partial sums, statistics and
    log-probabilities (sized by ``block_tables._saved_shard``), what the loss holds only while
    it runs -- keeps its entry. The solved block records them (``LayerCost.held``): what a
    stage keeps under ``none`` and ``selective`` is sized by these entries, the gathered
    inputs under sequence parallelism included (2 bytes x s x b x h x (1 - 1/tp) each);
    ``matmuls`` keeps ``LayerCost.saved``'s entries it marks, in the producer's layout.

    The second value maps an op's index to the entries released once its backward ran: those
    whose earliest saver (``SavedTensor.savers``, recorded by ``autopar.analysis.workload``) in the
    forward's order it is (a tensor no node keeps, a cache of the matmuls policy, goes with
    the node its name starts with); the layer's input is never released inside the layer."""
    inside = frozenset(op.node.name for op in sg.ops if op.node is not None)
    position = {op.node.name: j for j, op in enumerate(sg.ops) if op.node is not None}
    reads = {j: {storage_of(graph, t, inside): chosen[j].inputs[k]
                 for k, t in enumerate(op.tensors) if k < len(chosen[j].inputs)}
             for j, op in enumerate(sg.ops) if op.node is not None}
    released: dict[int, set[str]] = {}
    out: list[SavedTensor] = []
    for t in saved:
        savers = [position[n] for n in t.savers if n in position]
        if t.name.partition(".")[0] not in inside:
            out.append(t)  # the layer's input: kept under every policy
            continue
        if not (t.without_checkpoint and not t.transient and t.per_token and "." not in t.name
                and savers):
            out.append(t)
            j = savers[0] if savers else position.get(t.name.partition(".")[0])
            if j is not None:
                released.setdefault(j, set()).add(t.name)
            continue
        first: dict[Layout, int] = {}  # each layout it is kept in -> its earliest saver
        for j in savers:
            first.setdefault(reads[j].get(t.name, chosen[j].output), j)
        for layout, j in first.items():
            key = f"{t.name}@{layout.value}"
            out.append(replace(t, name=key, shard=shard_of(layout)))
            released.setdefault(j, set()).add(key)
    return tuple(out), released


def _elements(graph: GraphIR, sg: StrategyGraph, i: int, layer: LayerCost) -> float | None:
    """Elements per sequence of op ``i``'s output, None when it carries no gradient."""
    op = sg.ops[i]
    name = op.node.name if op.node is not None else (op.tensors[0] if op.tensors else None)
    if name is None:  # the layer's input, pinned by a source
        return layer.input_elements
    out = graph.node(name).out
    if out is None or not out.dtype.is_floating_point:
        return None
    return out.numel / graph.batch


def _passes_through(graph: GraphIR, sg: StrategyGraph, j: int) -> bool:
    """Whether op ``j``'s backward hands its output's gradient on without allocating."""
    node = sg.ops[j].node
    if node is None or kind_of(node) is OpKind.FREE:
        return True
    if node.op == "add" and node.out is not None:
        return all(graph.has_node(i) and graph.node(i).out is not None
                   and graph.node(i).out.numel == node.out.numel for i in node.inputs)
    return False


def backward_moments(graph: GraphIR, sg: StrategyGraph, chosen: list[Strategy],
                     layer: LayerCost, held: tuple[SavedTensor, ...],
                     released: dict[int, set[str]], share: dict[str, float]
                     ) -> tuple[BackwardMoment, ...]:
    """The moments of ``layer``'s backward under the strategies ``chosen`` for ``sg.ops``
    (``layer`` re-priced under them); ``held`` and ``released``: its saved tensors as the ops
    hold them (``saved_as_held``); ``share``: parameters of each node on one tp rank."""
    by_name = {t.name: t for t in held}
    holding = {name for names in released.values() for name in names}
    total = sum(share.values())

    def grad(i: int, layout: Layout, label: str) -> SavedTensor | None:
        elements = _elements(graph, sg, i, layer)
        if elements is None:
            return None
        return SavedTensor(label, elements, shard_of(layout), without_checkpoint=False,
                           transient=True)

    buffers: dict[int, SavedTensor] = {}
    first = grad(sg.output, chosen[sg.output].output, f"grad:{sg.ops[sg.output].name}")
    if first is not None:
        buffers[sg.output] = first
    made = 0.0
    moments: list[BackwardMoment] = []
    for j in reversed(range(len(sg.ops))):
        if j not in buffers:  # no gradient reaches this op (a sink, a mask, an unused output)
            continue
        op = sg.ops[j]
        new: list[tuple[int, SavedTensor]] = []
        for k, i in enumerate(op.inputs):
            layout = chosen[j].inputs[k] if k < len(chosen[j].inputs) else chosen[i].output
            g = grad(i, layout, f"grad:{op.name}->{sg.ops[i].name}")
            if g is not None:
                new.append((i, g))
        if op.node is not None:
            made += share.get(op.node.name, 0.0)
        if not _passes_through(graph, sg, j):
            moments.append(BackwardMoment(
                op.name, tuple(buffers.values()) + tuple(g for _, g in new),
                tuple(by_name[n] for n in sorted(holding) if n in by_name),
                made / total if total else 0.0))
        del buffers[j]
        for i, g in new:
            if i not in buffers:
                buffers[i] = grad(i, chosen[i].output, f"grad:{sg.ops[i].name}") or g
        holding -= released.get(j, set())
    return tuple(moments)
