"""Strategy rules: how an op may run on the tensor-parallel mesh axis, and the helpers they share.

A strategy (``autopar.core.layout.Strategy``) says, for one op, the layout it needs of each
activation input, the layout of its output, whether its work is divided over the ``tp`` ranks
and whether its parameters are. Each op family of the registry declares its rule (a function of
the node and a ``RuleContext`` returning the candidate strategies); the search never names
Megatron's pattern: the column->row split of attention and MLP is what the per-block solve
(``search.block_tables`` + ``search.ilp``) finds cheapest among these rules, as in Alpa's and
XLA's auto-sharding. An op without a rule runs replicated (``replicated``) and is listed in the
plan's report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from autopar.core.layout import LAYOUT_STYLE, Layout, Strategy, Style, splittable
from autopar.analysis.graph import GraphIR, NodeInfo


@dataclass(frozen=True)
class RuleContext:
    """What a rule may look at besides the node."""

    graph: GraphIR
    activation_inputs: tuple[str, ...]
    """The node's inputs that are activations produced by graph nodes."""
    sequence_parallel: bool
    stream: frozenset[str] = frozenset()
    """The layer's nodes on the residual stream (``ops.stream.residual_stream``)."""
    tp: int = 1
    """The tensor-parallel degree: a split is offered only where it divides the weight
    (``autopar.core.layout.splittable``)."""
    forced: frozenset[str] = frozenset()
    """The weight GEMMs that must be split over the tp ranks (column or row), for a plan whose
    tp degree the user fixed, e.g. to verify the sharded program (``search.forced``)."""
    outer: Mapping[str, tuple[bool, bool]] = field(default_factory=dict)
    """For the weight GEMMs of the layer's ``GraphIR.outer_layers``: (a weight GEMM of their
    module runs before, one runs after) -- ``ops.gemm.outer_regions``."""

    def can_split(self, node: NodeInfo, style: Style) -> bool:
        """Whether the engine can split ``node``'s layer by ``style`` (an ``nn.Linear`` by
        column or row, an ``nn.Embedding`` by vocabulary) evenly over the tp ranks."""
        layer = self.graph.layers.get(node.module_path)
        return layer is not None and splittable(layer[0], layer[1], style, self.tp)


Rule = Callable[[NodeInfo, RuleContext], list[Strategy]]
"""A family's rule: the candidate strategies of one node."""


def rank(ctx: RuleContext, name: str) -> int:
    node = ctx.graph.node(name)
    return len(node.out.shape) if node.out is not None else 0


def numel(ctx: RuleContext, name: str) -> int:
    node = ctx.graph.node(name)
    return node.out.numel if node.out is not None else 0


def width_splittable(node: NodeInfo) -> bool:
    """An op that mixes along the last dim keeps a width split only when the tensor has a
    separate heads dim (rank 4: batch, heads, sequence, head dim in some order)."""
    return node.out is not None and len(node.out.shape) >= 4


def replicated(node: NodeInfo, ctx: RuleContext) -> Strategy:
    """Every rank runs the whole op: what an op without a rule gets."""
    return Strategy(Style.REPLICATED, tuple(Layout.R for _ in ctx.activation_inputs), Layout.R,
                    divides=False)


def follow(node: NodeInfo, ctx: RuleContext, layouts: list[Layout], *,
           broadcasts: bool = True) -> list[Strategy]:
    """Strategies that keep one layout through the op. With ``broadcasts`` (elementwise ops),
    an input with fewer elements than the output is broadcast and read replicated when the
    layout is a width split; a join (``cat``) has no broadcast inputs."""
    out_numel = node.out.numel if node.out is not None else 0
    strategies = []
    for layout in layouts:
        ins = []
        for i in ctx.activation_inputs:
            small = broadcasts and numel(ctx, i) < out_numel
            ins.append(Layout.R if (small and layout is Layout.S) else layout)
        strategies.append(Strategy(LAYOUT_STYLE[layout], tuple(ins), layout,
                                   divides=layout is not Layout.R))
    return strategies


def seq(ctx: RuleContext) -> list[Layout]:
    """The sequence split, when the candidate enables sequence parallelism."""
    return [Layout.Q] if ctx.sequence_parallel else []


def whole(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """The op runs whole on every rank, by its family's reasoned choice (a convolution, a gate
    or a pad the engine cannot split; each family's docstring says why). Unlike an op without a
    rule, which also runs replicated, the plan does not list it as unknown."""
    return [replicated(node, ctx)]
