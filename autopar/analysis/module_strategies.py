"""From per-op strategies to per-module ones: what the tensor-parallel pass applies.

The strategy solve decides for every traced op (``Plan.block_strategies``); the engine applies
parallel styles to modules (``ColwiseParallel`` on an ``nn.Linear``, ``SequenceParallel`` on a
norm). This module folds the first into the second, once, when the plan is made, so that the
passes read module names and never need the traced graph.

A module is listed when one of its ops reads a parameter (fused attention's own excepted). Its style (``autopar.core.layout.
Style``) is the strategy of the op holding its weights (``autopar.analysis.ops.is_weight_op``: a linear
layer's GEMM or an embedding: ``column``, ``row``, ``vocab``, ``replicated``); for any other module
(a norm, written as one op or as several) ``sequence`` when every op it owns runs over the
sequence split, ``replicated`` when every op runs whole, ``width`` when every op runs on the
width (heads) split of a column split's output and none reshapes it -- a per-head norm between
a column and a row split, Qwen3's ``q_norm`` over each head's features, run on the rank's heads
with its weight whole, the weight's gradient summed over the tp ranks -- and ``mixed`` otherwise
(a layout the engine's styles cannot express; the pass refuses it). (A tied embedding and head get one
layout in the solve itself: ``StrategySolver._tied_tables``.) Module names of the repeated blocks use
``*`` for the block index (``layers.*.attn.q_proj``). The loss is listed as ``LOSS``.
"""

from __future__ import annotations

from collections.abc import Mapping

from autopar.core.layout import Style
from autopar.analysis.graph import GraphIR
from autopar.analysis.ops import is_weight_op, kind_of
from autopar.core.roofline import OpKind

LOSS = "<loss>"
"""The key of the cross-entropy's strategy (``vocab``: ``loss_parallel``; ``replicated``)."""


def _pattern(graph: GraphIR, path: str) -> str:
    if graph.blocks is not None:
        first = graph.blocks.instances[0]
        if path == first or path.startswith(first + "."):
            return f"{graph.blocks.path}.*{path[len(first):]}"
    return path


def _keeps_shape(owned: list) -> bool:
    """Whether every op of a module keeps its input's shape but for the last dim (casts,
    elementwise ops, last-dim reductions kept as size 1): the engine runs such a module on a
    rank's width shard with its local shapes (``passes/tensor_parallel.WidthParallel``)."""
    first = owned[0].out
    return first is not None and all(
        n.out is not None and n.out.shape[:-1] == first.shape[:-1]
        and n.out.shape[-1] in (first.shape[-1], 1) for n in owned)


def module_strategies(graph: GraphIR, strategies: Mapping[str, str]
                      ) -> tuple[tuple[str, str], ...]:
    """(module pattern, style) for every module with parameters of block 0 and outside the
    blocks, in execution order, then the loss; ``strategies`` maps op names to strategy names
    (ops missing from it run replicated)."""
    nodes = [n for n in graph.nodes if n.block in (None, 0) and n.out is not None]
    # fused attention's own parameters (GPT-OSS's sinks) take no module style: the pass splits
    # them with the heads (``models.family.HEAD_PARAMS``)
    owners = [p for p in dict.fromkeys(n.module_path for n in nodes
                                       if n.params and kind_of(n) is not OpKind.ATTENTION) if p]
    out: list[tuple[str, str]] = []
    for path in owners:
        owned = [n for n in nodes if n.module_path == path]
        decisive = [Style(strategies.get(n.name, Style.REPLICATED)) for n in owned
                    if is_weight_op(n, graph)]
        if decisive:
            style = decisive[0]
        else:
            seen = {Style(strategies.get(n.name, Style.REPLICATED)) for n in owned}
            style = seen.pop() if len(seen) == 1 else Style.MIXED
            if style is Style.WIDTH and not _keeps_shape(owned):
                style = Style.MIXED
        out.append((_pattern(graph, path), style))
    losses = [Style(strategies.get(n.name, Style.REPLICATED)) for n in nodes
              if n.op == "cross_entropy"]
    if losses:
        out.append((LOSS, losses[-1]))
    return tuple(out)

