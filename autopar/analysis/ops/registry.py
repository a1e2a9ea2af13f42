"""The op registry's types and tables: every op family described once, and the questions asked of
it.

An ``OpFamily`` owns a few canonical op names (``NodeInfo.op``) and says, for each of them:

* **names**: the raw spellings the tracer maps to them (``aliases``: torch.nn leaf classes,
  functions, Tensor methods, ATen overload packets; together ``OP_NAMES``);
* **FLOPs and bytes** of the forward, from the node's operands (``forward_flop``,
  ``forward_bytes``); the cost model derives the backward from the ``kind``;
* **what autograd saves** for the backward (``saves``, told to a ``Saver``);
* **its strategies** over the tensor-parallel ranks (``rule``; ``None``: no rule, the op runs
  replicated and the plan reports it);
* **its fusion patterns** (``fusions``): the chains of ops, its own among them, that one kernel
  runs (``autopar.analysis.ops.fusion`` finds them).

FLOP conventions (forward only): a multiply-add counts 2; cheap ops count rough FLOPs per
output element (``flop_per_element``) or per element of the first input for reductions and
losses (``flop_per_input_element``); data movement counts 0. Bytes: every tensor operand read
(parameters and buffers included) plus every output written, unfused, unless the family says
otherwise (views move nothing; a lookup reads only the rows it gathers).

``register`` adds a family (the family modules of ``autopar.analysis.ops`` register theirs when the
package is imported), ``unregister`` removes one; the lookups below read the live tables, so a
family registered later is known to the tracer, the cost tables and the strategy solve alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from autopar.core.specs import FUSIONS, PRICED_LATER
from autopar.core.layout import Layout, Strategy, Style
from autopar.core.roofline import OpKind
from autopar.analysis.graph import GraphIR, NodeInfo, TensorMeta
from autopar.analysis.ops.rules import Rule, RuleContext, replicated

VIEW = "view"
"""The canonical op of everything that moves no data (views, reshapes, getitem, size reads)."""
WIDEN = "widen"
"""The canonical op of a cast to fp32 of a tensor traced in fp32 (``naming.canonical_op``): a
view there, a copy into 4-byte elements where the model runs in bf16 or fp16. What keeps its
output keeps that copy (``costmodel.workload.SavedTensor.widened``)."""


class Saver(Protocol):
    """Where a family's ``saves`` records what a node keeps for the backward pass
    (``autopar.analysis.workload.saved_tensors`` implements it)."""

    graph: GraphIR

    def keep(self, name: str) -> None:
        """Keep the output of node ``name`` (counted once per storage, through views)."""

    def extra(self, key: str, elements: float, size: float | None, *, transient: bool = False,
              per_token: bool = True) -> None:
        """Keep a tensor no node outputs (statistics, a mask, indices): ``elements`` at the
        traced micro-batch (per micro-batch with ``per_token`` false), ``size`` bytes each
        (None: the activation dtype); ``transient``: live only while the layer runs."""

    def base(self, name: str) -> str:
        """The node owning the storage of ``name``'s output (through views)."""

    def __len__(self) -> int:
        """Tensors kept so far."""


FlopFn = Callable[[str, str, Sequence[TensorMeta], Sequence[TensorMeta], Sequence[object]],
                  float]
"""(op, raw name, operands, outputs, scalar arguments) -> forward FLOPs."""
BytesFn = Callable[[str, Sequence[TensorMeta], Sequence[TensorMeta]], float]
"""(op, operands, outputs) -> forward bytes."""
SavesFn = Callable[[NodeInfo, "Saver"], None]
NodeTest = Callable[[NodeInfo, GraphIR], bool]


def saves_nothing(node: NodeInfo, saver: Saver) -> None:
    """An op whose backward needs none of its tensors (add, a view, a cast)."""


def saves_inputs(node: NodeInfo, saver: Saver) -> None:
    """An op whose backward reads its inputs (a GEMM; an op the registry does not know)."""
    for i in node.inputs:
        saver.keep(i)


@dataclass(frozen=True)
class FusionPattern:
    """A chain of ops one kernel runs in a single pass (``autopar.analysis.ops.fusion``)."""

    name: str
    ops: tuple[str, ...]
    """The chain's canonical ops, each reading the previous one's output."""
    side_ops: tuple[str, ...] = ()
    """Ops that join as an input of the chain's last op that nothing else reads."""
    kernel_saves: Callable[[list[NodeInfo], Saver], None] | None = None
    """What the kernel of ``autopar.kernels`` named as the pattern keeps for the backward (its
    ``setup_context``); None for a pattern of Megatron-LM's fused kernels, whose ops keep what
    they keep eager."""


@dataclass(frozen=True)
class OpFamily:
    """One family of ops (see the module docstring)."""

    name: str
    ops: tuple[str, ...]
    """Canonical op names (what the tracer emits)."""
    saves: SavesFn
    """What one node keeps for its backward pass."""
    rule: Rule | None
    """Strategies of one node over the tp ranks; None: the op runs replicated, reported."""
    aliases: Mapping[str, str] = field(default_factory=dict)
    """Raw name -> canonical op, for the spellings other than the canonical name itself."""
    kind: OpKind = OpKind.MEMORY
    """The roofline the op runs on."""
    flop: FlopFn | None = None
    """Forward FLOPs; None: the per-element tables below."""
    flop_per_element: Mapping[str, float] = field(default_factory=dict)
    flop_per_input_element: Mapping[str, float] = field(default_factory=dict)
    bytes: BytesFn | None = None
    """Forward bytes; None: every operand read plus every output written."""
    returns_input: Callable[[NodeInfo], bool] | None = None
    """The node returns its input itself (a dropout with p = 0): no kernel, no storage."""
    kept_by_matmuls: NodeTest | None = None
    """The matmuls policy caches the node's output (``passes/checkpointing.py``)."""
    kept_by_matmuls_aten: tuple[str, ...] = ()
    """The same at run time: the aten ops (``torch.ops.aten.<name>.default``) whose outputs the
    matmuls policy's selective checkpoint keeps (``matmuls_aten_ops``); the one list the pass
    and the pricing read."""
    weight_op: NodeTest | None = None
    """The node holds its module's weights: its strategy is the module's style."""
    fusions: tuple[FusionPattern, ...] = ()


FAMILIES: dict[str, OpFamily] = {}
"""Registered families by name."""
OP_NAMES: dict[str, str] = {}
"""Raw op name -> canonical op: every family's ops (to themselves) and aliases. A raw name
missing here is kept as the op name (``autopar.analysis.ops.naming.canonical_op``)."""
CANONICAL_OPS: set[str] = set()
"""Every canonical op a family owns: the ops the registry knows."""
PATTERNS: dict[str, FusionPattern] = {}
"""Every family's fusion patterns by name (what ``ParallelConfig.fusions`` names)."""
_BY_OP: dict[str, OpFamily] = {}


def register(family: OpFamily) -> OpFamily:
    """Add ``family``; its ops, aliases and patterns must be new to the registry."""
    taken = [op for op in family.ops if op in OP_NAMES]
    taken += [raw for raw, op in family.aliases.items() if OP_NAMES.get(raw, op) != op]
    taken += [p.name for p in family.fusions if p.name in PATTERNS]
    if family.name in FAMILIES or taken:
        raise ValueError(f"op family {family.name!r}: {taken or family.name} already registered")
    bad = [op for op in family.aliases.values() if op not in family.ops]
    if bad:
        raise ValueError(f"op family {family.name!r}: aliases name ops it does not own: {bad}")
    FAMILIES[family.name] = family
    _rebuild()
    return family


def unregister(name: str) -> None:
    """Remove the family ``name`` (a test's own family)."""
    FAMILIES.pop(name)
    _rebuild()


def _rebuild() -> None:
    """Refill the lookup tables in place (modules hold references to them)."""
    for table in (OP_NAMES, CANONICAL_OPS, PATTERNS, _BY_OP):
        table.clear()
    for fam in FAMILIES.values():
        for op in fam.ops:
            _BY_OP[op] = fam
            OP_NAMES[op] = op
        OP_NAMES.update(fam.aliases)
        PATTERNS.update((p.name, p) for p in fam.fusions)
    CANONICAL_OPS.update(_BY_OP)
    # the fusion vocabulary is the core's; a later family's patterns join it, priced only
    PRICED_LATER.clear()
    PRICED_LATER.update(set(PATTERNS) - set(FUSIONS))


# ----- the questions -----
def matmuls_aten_ops() -> tuple[str, ...]:
    """Every family's ``kept_by_matmuls_aten``: what ``passes/checkpointing.py``'s matmuls
    policy saves."""
    return tuple(name for fam in FAMILIES.values() for name in fam.kept_by_matmuls_aten)



def family_of(op: str) -> OpFamily | None:
    """The family owning the canonical ``op``; None for an op the registry does not know."""
    return _BY_OP.get(op)


def is_known(op: str) -> bool:
    return op in _BY_OP


def has_rule(op: str) -> bool:
    family = _BY_OP.get(op)
    return family is not None and family.rule is not None


def ops_without_rules(nodes: Iterable[NodeInfo]) -> tuple[str, ...]:
    """The ops of ``nodes`` (those yielding a tensor) without a strategy rule, sorted: they run
    replicated. The one owner of that list: the plan's report and the cost model's note read it."""
    return tuple(sorted({n.op for n in nodes if n.out is not None and not has_rule(n.op)}))


def forward_flop(op: str, raw: str, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta],
                 scalars: Sequence[object] = ()) -> float:
    """Forward FLOPs of one node (see the module docstring for the conventions)."""
    family = _BY_OP.get(op)
    if not outs or family is None:
        return 0.0
    if family.flop is not None:
        return family.flop(op, raw, ins, outs, scalars)
    if op in family.flop_per_element:
        return family.flop_per_element[op] * outs[0].numel
    if op in family.flop_per_input_element and ins:
        return family.flop_per_input_element[op] * ins[0].numel
    return 0.0


def forward_bytes(op: str, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta]) -> float:
    """Bytes read and written by one node, unfused."""
    family = _BY_OP.get(op)
    if family is not None and family.bytes is not None:
        return family.bytes(op, ins, outs)
    return float(sum(t.nbytes for t in ins) + sum(t.nbytes for t in outs))


def kind_of(node: NodeInfo) -> OpKind:
    """The roofline ``node`` runs on. An op the registry does not know runs on the matmul
    roofline when torch counts FLOPs for it (the tracer's ``fwd_flop``), memory-bound otherwise
    (``autopar.analysis.ops.opaque`` argues both)."""
    family = _BY_OP.get(node.op)
    if family is None:
        return OpKind.MATMUL if node.fwd_flop > 0 else OpKind.MEMORY
    if family.returns_input is not None and family.returns_input(node):
        return OpKind.FREE
    return family.kind


def returns_input(node: NodeInfo) -> bool:
    """``node`` returns its input itself (a view; a dropout with p = 0)."""
    family = _BY_OP.get(node.op)
    return family is not None and family.returns_input is not None \
        and family.returns_input(node)


def storage_of(graph: GraphIR, name: str, inside: frozenset[str] = frozenset()) -> str:
    """The node owning the storage of ``name``'s output: through views, and through the ops
    among ``inside`` that return their input itself (no-op dropouts, p = 0)."""
    while graph.has_node(name):
        node = graph.node(name)
        alias = node.op == VIEW or (name in inside and returns_input(node))
        if not alias or not node.inputs:
            return name
        name = node.inputs[0]
    return name


def save(node: NodeInfo, saver: Saver) -> None:
    """Record what ``node`` keeps for the backward pass; an op the registry does not know keeps
    its inputs (the conservative guess)."""
    family = _BY_OP.get(node.op)
    (family.saves if family is not None else saves_inputs)(node, saver)


def kept_by_matmuls(node: NodeInfo, graph: GraphIR) -> bool:
    """Whether the matmuls policy keeps ``node``'s output instead of recomputing it."""
    family = _BY_OP.get(node.op)
    return family is not None and family.kept_by_matmuls is not None \
        and family.kept_by_matmuls(node, graph)


def is_weight_op(node: NodeInfo, graph: GraphIR) -> bool:
    """Whether ``node`` holds its module's weights, so that its strategy is the module's style
    (a linear layer, an embedding)."""
    family = _BY_OP.get(node.op)
    return family is not None and family.weight_op is not None and family.weight_op(node, graph)


def rule_of(node: NodeInfo) -> Rule | None:
    family = _BY_OP.get(node.op)
    return family.rule if family is not None else None


def moe_sequence_strategy(node: NodeInfo, ctx: RuleContext) -> Strategy:
    """An op of a mixture-of-experts layer under sequence parallelism: every tp rank routes and
    computes its own sequence shard (Megatron-Core's MoE layer under tp, which requires
    sequence parallelism; the experts' mesh folds over the tp ranks: ``core.mesh``), so the
    layer takes the sequence-split stream as it is and gives it back so, its work divided by
    tp and no collective of tensor parallelism around it (the all-to-alls are expert
    parallelism's, priced by ``costmodel/moe.py``)."""
    return Strategy(Style.SEQUENCE, tuple(Layout.Q for _ in ctx.activation_inputs),
                    Layout.Q, True)


def strategies_for(node: NodeInfo, graph: GraphIR, sequence_parallel: bool,
                   stream: frozenset[str] = frozenset(), tp: int = 1,
                   forced: frozenset[str] = frozenset(),
                   outer: Mapping[str, tuple[bool, bool]] | None = None) -> list[Strategy]:
    """The candidate strategies of ``node``; an op without a rule (``has_rule``) gets the one
    replicated strategy. ``outer``: the layer's ``ops.gemm.outer_regions``."""
    ctx = RuleContext(graph, tuple(i for i in node.inputs if graph.has_node(i)),
                      sequence_parallel, stream, tp, forced, outer or {})
    if sequence_parallel and graph.in_moe_layer(node):
        return [moe_sequence_strategy(node, ctx)]
    fn = rule_of(node)
    return [replicated(node, ctx)] if fn is None else fn(node, ctx)
