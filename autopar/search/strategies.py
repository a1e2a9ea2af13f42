"""The strategy registry: how each op family may run on the tensor-parallel mesh axis.

A strategy says, for one op, the layout it needs of each activation input, the layout of its
output, whether its work is divided over the ``tp`` ranks and whether its parameters are. The
search never names Megatron's pattern: the column->row split of attention and MLP is what the
per-block solve (``block_tables`` + ``ilp``) finds cheapest among these rules, as in Alpa's and
XLA's auto-sharding.

Layouts of an activation over the ``tp`` ranks (``Layout``):

* ``R``: replicated, every rank holds the whole tensor;
* ``S``: sharded along the model width (attention heads, ffn features, vocabulary);
* ``Q``: sharded along the sequence (Megatron's sequence parallelism), only when the candidate
  enables it;
* ``P``: partial sums, every rank holds a full-shape addend (the output of a row split);
* ``R*`` (an input requirement): replicated input whose gradient comes back as partial sums, as a
  column split's does; the ``fork`` of a tensor read by several column splits reduces it once.

Rules are registered per op family with ``@rule("family", ops...)``; ``rule_of`` finds the rule
of a node and returns ``None`` for an op the registry does not know, which then runs replicated
and is listed in the plan's report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum

from autopar.admissibility import splittable
from autopar.graph import GraphIR, NodeInfo
from autopar.workload import GEMM_OPS, classify_tp, is_weight_gemm


class Layout(StrEnum):
    R = "R"
    S = "S"
    Q = "Q"
    P = "P"
    R_PARTIAL_GRAD = "R*"


@dataclass(frozen=True)
class Strategy:
    """One way to run an op over the tp ranks."""

    name: str
    inputs: tuple[Layout, ...]
    """Required layout of each activation input (inputs that are graph nodes), in order."""
    output: Layout
    divides: bool
    """The op's work is divided over the tp ranks."""
    shards_params: bool = False
    """The op's weight matrices are divided over the tp ranks (and its bias, for a column
    split)."""
    loss_parallel: bool = False
    """A vocabulary-sharded loss: three all-reduces of one fp32 value per token."""


@dataclass(frozen=True)
class RuleContext:
    """What a rule may look at besides the node."""

    graph: GraphIR
    activation_inputs: tuple[str, ...]
    """The node's inputs that are activations produced by graph nodes."""
    sequence_parallel: bool
    stream_width: int | None = None
    """Last dim of the residual stream (the layer's input), if known."""
    tp: int = 1
    """The tensor-parallel degree: a split is offered only where it divides the weight
    (``autopar.admissibility.splittable``)."""
    forced: frozenset[str] = frozenset()
    """The weight GEMMs that must be split over the tp ranks (column or row), for a plan whose
    tp degree the user fixed, e.g. to verify the sharded program (``forced_splits``)."""

    def can_split(self, node: NodeInfo, style: str) -> bool:
        """Whether the engine can split ``node``'s layer by ``style`` (an ``nn.Linear`` by
        column or row, an ``nn.Embedding`` by vocabulary) evenly over the tp ranks."""
        layer = self.graph.layers.get(node.module_path)
        return layer is not None and splittable(layer[0], layer[1], style, self.tp)


Rule = Callable[[NodeInfo, RuleContext], list[Strategy]]
RULES: dict[str, Rule] = {}
FAMILY_OF_OP: dict[str, str] = {}


def rule(family: str, *ops: str) -> Callable[[Rule], Rule]:
    """Register ``fn`` as the strategy rule of ``family``, for ``ops``."""
    def register(fn: Rule) -> Rule:
        RULES[family] = fn
        for op in ops:
            FAMILY_OF_OP[op] = family
        return fn
    return register


def family_of(node: NodeInfo, graph: GraphIR) -> str | None:
    if node.op in GEMM_OPS:
        return "weight_gemm" if is_weight_gemm(node, graph) else "batched_matmul"
    return FAMILY_OF_OP.get(node.op)


def rule_of(node: NodeInfo, graph: GraphIR) -> Rule | None:
    family = family_of(node, graph)
    return RULES.get(family) if family else None


def _rank(ctx: RuleContext, name: str) -> int:
    node = ctx.graph.node(name)
    return len(node.out.shape) if node.out is not None else 0


def _numel(ctx: RuleContext, name: str) -> int:
    node = ctx.graph.node(name)
    return node.out.numel if node.out is not None else 0


def _width_splittable(node: NodeInfo) -> bool:
    """An op that mixes along the last dim keeps a width split only when the tensor has a
    separate heads dim (rank 4: batch, heads, sequence, head dim in some order)."""
    return node.out is not None and len(node.out.shape) >= 4


def replicated(node: NodeInfo, ctx: RuleContext) -> Strategy:
    """Every rank runs the whole op: what an op without a rule gets."""
    return Strategy("replicated", tuple(Layout.R for _ in ctx.activation_inputs), Layout.R,
                    divides=False)


def _follow(node: NodeInfo, ctx: RuleContext, layouts: list[Layout], *,
            broadcasts: bool = True) -> list[Strategy]:
    """Strategies that keep one layout through the op. With ``broadcasts`` (elementwise ops),
    an input with fewer elements than the output is broadcast and read replicated when the
    layout is a width split; a join (``cat``) has no broadcast inputs."""
    out_numel = node.out.numel if node.out is not None else 0
    strategies = []
    for layout in layouts:
        ins = []
        for i in ctx.activation_inputs:
            small = broadcasts and _numel(ctx, i) < out_numel
            ins.append(Layout.R if (small and layout is Layout.S) else layout)
        name = {Layout.R: "replicated", Layout.S: "width", Layout.Q: "sequence"}[layout]
        strategies.append(Strategy(name, tuple(ins), layout, divides=layout is not Layout.R))
    return strategies


def _seq(ctx: RuleContext) -> list[Layout]:
    return [Layout.Q] if ctx.sequence_parallel else []


@rule("weight_gemm")
def weight_gemm_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """A linear layer (or stacked expert weights): replicated, split by output features
    (column: weight and bias split), or split by input features (row: weight split, bias
    added once after the reduction, output partial sums). A split is offered only where the
    engine can run it (``RuleContext.can_split``), and a row split only inside the repeated
    blocks: the engine runs one after a column split in the same module (attention, MLP), and
    outside the blocks there is none (the head is split by columns or not at all).

    Not offered: whole weights over a split sequence (DeepSpeed-Ulysses style). It needs the
    weight gradients all-reduced over the tp ranks and is not one of the engine's parallel styles
    (``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``) that the plan is applied
    with."""
    split = [s for s in (Strategy("column", (Layout.R_PARTIAL_GRAD,), Layout.S, divides=True,
                                  shards_params=True),
                         Strategy("row", (Layout.S,), Layout.P, divides=True,
                                  shards_params=True))
             if ctx.can_split(node, s.name) and (s.name == "column" or node.block is not None)]
    if split and node.name in ctx.forced:
        return split
    return [replicated(node, ctx), *split]


@rule("batched_matmul")
def batched_matmul_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """A product of two activations (attention scores, probabilities times values): batched
    over heads when both operands are split by heads."""
    out = [replicated(node, ctx)]
    if _width_splittable(node):
        out.append(Strategy("heads", tuple(Layout.S for _ in ctx.activation_inputs), Layout.S,
                            divides=True))
    return out


@rule("attention", "sdpa")
def attention_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Fused attention: replicated or split by heads (query, key and value all split; a mask
    or bias input is read replicated)."""
    heads = tuple(Layout.S if k < 3 else Layout.R for k in range(len(ctx.activation_inputs)))
    return [replicated(node, ctx), Strategy("heads", heads, Layout.S, divides=True)]


@rule("norm", "layer_norm", "rms_norm", "group_norm")
def norm_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Normalisation over the width: replicated, or over the sequence."""
    return _follow(node, ctx, [Layout.R, *_seq(ctx)])


@rule("elementwise", "add", "sub", "mul", "div", "neg", "gelu", "silu", "relu", "tanh",
      "sigmoid", "pow", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "dropout", "to", "float",
      "type_as", "cast", "clone", "contiguous", "copy", "masked_fill", "where", "clamp", "view",
      "bool", "long", "eq", "ne", "lt", "gt", "le", "ge", "fill")
def elementwise_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Elementwise ops and views keep any split (a view keeps the heads/width split because the
    space only lets tp divide the heads). Without sequence parallelism, compute on the residual
    stream (its width, not a view) stays whole: splitting it by width would be sequence
    parallelism under another name (a reduce-scatter and an all-gather around the norms) and
    would cut fused bias-dropout-add kernels across a layout change."""
    stream = (not ctx.sequence_parallel and node.op != "view" and node.out is not None
              and len(node.out.shape) <= 3 and ctx.stream_width is not None
              and node.out.shape[-1] == ctx.stream_width)
    # a view (expand included) has one activation input and keeps its split dim: it has no
    # small operand to broadcast, though expand's output has more elements than its input
    return _follow(node, ctx, [Layout.R, *([] if stream else [Layout.S]), *_seq(ctx)],
                   broadcasts=node.op != "view")


@rule("last_dim", "softmax", "log_softmax", "mean", "sum", "max", "min", "cumsum", "cat",
      "stack", "topk", "argmax", "sort", "argsort", "triu", "tril")
def last_dim_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Ops that reduce, scan or join along the last dim: a width split only with a separate
    heads dim (softmax over the keys of split heads)."""
    layouts = [Layout.R, *_seq(ctx)]
    if _width_splittable(node) and all(_rank(ctx, i) >= 4 for i in ctx.activation_inputs):
        layouts.insert(1, Layout.S)
    return _follow(node, ctx, layouts, broadcasts=False)


@rule("token_routing", "one_hot", "index", "index_select", "index_add", "index_put", "gather",
      "scatter", "scatter_add", "repeat", "new_zeros", "zeros_like", "ones_like", "histc",
      "bincount")
def token_routing_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Mixture-of-experts dispatch and combine (index, scatter, one-hot): replicated or over the
    tokens of the sequence; the expert weights themselves follow ``weight_gemm_rule``."""
    return _follow(node, ctx, [Layout.R, *_seq(ctx)])


@rule("constant", "arange", "zeros", "ones", "full", "empty", "rand", "randn")
def constant_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """A tensor made from nothing (positions, masks): every rank makes it, or its slice."""
    return _follow(node, ctx, [Layout.R, Layout.S, *_seq(ctx)])


@rule("embedding", "embedding")
def embedding_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """A lookup table: replicated, or split by vocabulary (each rank looks up its rows, the
    others' tokens give zeros, so the output is partial sums)."""
    ins = tuple(Layout.R for _ in ctx.activation_inputs)
    vocab = Strategy("vocab", ins, Layout.P, divides=False, shards_params=True)
    return [replicated(node, ctx), *([vocab] if ctx.can_split(node, "vocab") else [])]


@rule("loss", "cross_entropy")
def loss_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Cross-entropy: replicated, or over vocabulary-split logits (``loss_parallel``)."""
    rest = tuple(Layout.R for _ in ctx.activation_inputs[1:])
    return [replicated(node, ctx),
            Strategy("vocab", (Layout.S, *rest), Layout.R, divides=True, loss_parallel=True)]


def forced_splits(graph: GraphIR, nodes: list[NodeInfo], tp: int) -> frozenset[str]:
    """The weight GEMMs of ``nodes`` that ``split_weights`` forces: those the Megatron
    assignment splits (``workload.classify_tp``: column, then row, in one module -- attention,
    MLP; never a router, whose output feeds a top-k over every expert), in the modules where
    every such GEMM can take its split over ``tp``. Elsewhere (a width tp does not divide) the
    solve may keep them whole: a lone split could not run."""
    kinds = classify_tp(graph, nodes)
    by_module: dict[str, list[tuple[NodeInfo, str]]] = {}
    for n in nodes:
        kind = "column" if n.name in kinds.column else "row" if n.name in kinds.row else None
        if kind is not None and n.op != "embedding" and n.module_path in graph.layers:
            by_module.setdefault(n.module_path.rpartition(".")[0], []).append((n, kind))
    forced: set[str] = set()
    for members in by_module.values():
        if all(splittable(*graph.layers[n.module_path], kind, tp) for n, kind in members):
            forced.update(n.name for n, _ in members)
    return frozenset(forced)


def strategies_for(node: NodeInfo, graph: GraphIR, sequence_parallel: bool,
                   stream_width: int | None = None, tp: int = 1,
                   forced: frozenset[str] = frozenset()) -> tuple[list[Strategy], bool]:
    """(candidate strategies, whether a rule knew the op)."""
    ctx = RuleContext(graph, tuple(i for i in node.inputs if graph.has_node(i)),
                      sequence_parallel, stream_width, tp, forced)
    fn = rule_of(node, graph)
    if fn is None:
        return [replicated(node, ctx)], False
    return fn(node, ctx), True


def ops_without_rules(graph: GraphIR, nodes: Iterable[NodeInfo] | None = None
                      ) -> tuple[str, ...]:
    """The ops of ``graph`` (or of its ``nodes``) the registry has no rule for: they run
    replicated. The one owner of that list: the plan's report and the cost model's note
    (``autopar.workload.build_layer``'s ``no_rule_ops``) both come from here."""
    return tuple(sorted({n.op for n in (graph.nodes if nodes is None else nodes)
                         if n.out is not None and rule_of(n, graph) is None}))
