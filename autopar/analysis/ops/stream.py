"""The residual stream of a layer, recognised by the graph rather than by a tensor's width.

A decoder block reads the stream (its input), normalises it, runs attention and the MLP from
weight GEMMs to weight GEMMs, and adds their outputs back to it. A tensor is on the stream when
it lies on the path from the layer's input to its output without passing through a weight GEMM
(or an embedding table): reachable forward from the input (the norms, the residual adds) or
backward from the output (the residual adds, a dropout or a gate scaling a row split's output
before its add) through other ops only -- and as wide as the stream, rank 3 or less (a heads
split is never the stream). An MLP's inner product ``act(gate) * up`` lies between two weight
GEMMs and is never on the stream, whatever its width: a shared expert or a dense MLP whose
intermediate size equals the hidden size keeps its column -> row split
(``ops/elementwise.py``'s rule reads this set).
"""

from __future__ import annotations

from autopar.analysis.graph import GraphIR, NodeInfo
from autopar.analysis.ops.registry import is_weight_op


def residual_stream(graph: GraphIR, nodes: list[NodeInfo], layer_input: str | None,
                    layer_output: str) -> frozenset[str]:
    """The names of ``nodes`` on the residual stream from ``layer_input`` (a tensor produced
    outside the layer; None: the layer reads no floating-point activation, so it has no stream)
    to ``layer_output`` (the tensor the next layer reads)."""
    if layer_input is None or not graph.has_node(layer_input):
        return frozenset()
    stream_out = graph.node(layer_input).out
    if stream_out is None:
        return frozenset()
    if not stream_out.shape:
        return frozenset()
    width = stream_out.shape[-1]
    by_name = {n.name: n for n in nodes}
    readers: dict[str, list[str]] = {}
    for n in nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n.name)

    def passes(name: str) -> bool:  # a weight GEMM or a table ends the stream
        return name in by_name and not is_weight_op(by_name[name], graph)

    forward, todo = set(), [layer_input]
    while todo:
        for r in readers.get(todo.pop(), ()):
            if r not in forward and passes(r):
                forward.add(r)
                todo.append(r)
    backward, todo = set(), [layer_output] if passes(layer_output) else []
    backward.update(todo)
    while todo:
        for i in by_name[todo.pop()].inputs:
            if i not in backward and passes(i):
                backward.add(i)
                todo.append(i)
    return frozenset(name for name in forward | backward
                     if (out := by_name[name].out) is not None and 1 <= len(out.shape) <= 3
                     and out.shape[-1] == width)
