"""GEMMs: linear layers, products of two activations, stacked expert weights.

Ops: ``linear`` (``nn.Linear``, ``F.linear``, ATen ``addmm``), ``matmul`` (``mm``), ``bmm``,
``baddbmm``, ``einsum``, ``grouped_mm`` (MoE experts as one grouped GEMM).

* FLOPs: ``2 * M * N * K`` with batch dims, i.e. ``2 * out.numel * K``; bias adds are not
  counted (the Megatron-LM convention, Narayanan et al. 2021, eq. 3, counts only the GEMMs).
  ``einsum``: ``2 * prod(size of every index letter)`` for two operands.
* Saved: every activation input (the backward's two GEMMs read them). The matmuls policy
  keeps a linear layer's output (``is_linear``).
* Strategies: a weight GEMM is replicated, split by columns or by rows
  (``weight_gemm_rule``); a product of two activations is replicated or batched over split heads
  (``batched_matmul_rule``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autopar.core.layout import Layout, Strategy, Style
from autopar.core.roofline import OpKind
from autopar.analysis.graph import GraphIR, NodeInfo, TensorMeta
from autopar.analysis.ops.registry import OpFamily, register, saves_inputs
from autopar.analysis.ops.rules import RuleContext, replicated, width_splittable


def _k_dim(raw: str, ins: Sequence[TensorMeta]) -> int:
    """Contraction length K of a matrix product, from its operands."""
    # addmm(bias, a, b) and baddbmm(bias, a, b) put the left factor second.
    left = ins[1] if raw in ("addmm", "baddbmm") and len(ins) > 1 else ins[0]
    return left.shape[-1] if left.shape else 1


def _einsum_flop(equation: str, ins: Sequence[TensorMeta]) -> float:
    """``2 * prod(index sizes)`` for a two-operand einsum; the input size for one operand."""
    terms = equation.replace(" ", "").split("->")[0].split(",")
    if len(terms) < 2:
        return float(ins[0].numel) if ins else 0.0
    sizes: dict[str, int] = {}
    for term, meta in zip(terms, ins):
        letters = [c for c in term if c.isalpha()]
        # "..." covers the leading dims that the letters do not name.
        extra = len(meta.shape) - len(letters)
        for i, d in enumerate(meta.shape[:extra]):
            sizes[f"...{i}"] = d
        for c, d in zip(letters, meta.shape[extra:]):
            sizes[c] = max(sizes.get(c, 1), d)
    return 2.0 * math.prod(sizes.values())


def gemm_flop(op: str, raw: str, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta],
              scalars: Sequence[object]) -> float:
    if op == "einsum":
        equation = next((s for s in scalars if isinstance(s, str)), "")
        return _einsum_flop(equation, ins) if equation else 0.0
    return 2.0 * outs[0].numel * _k_dim(raw, ins) if ins else 0.0


def is_weight_gemm(node: NodeInfo, graph: GraphIR) -> bool:
    """A GEMM of one activation by parameters (a linear layer, or stacked expert weights)."""
    if node.op not in GEMM.ops or not node.params:
        return False
    return len([i for i in node.inputs if graph.has_node(i)]) == 1


def is_expert_gemm(node: NodeInfo, graph: GraphIR) -> bool:
    """A GEMM by expert weights, which ep divides: stacked (3-d parameters), or an expert
    module's of a list of them (``GraphIR.expert_params``)."""
    return node.op in GEMM.ops and any(
        len(graph.params[p].shape) == 3 or p in graph.expert_params
        for p in node.params if p in graph.params)


def is_linear(node: NodeInfo, graph: GraphIR) -> bool:
    """A linear layer: a GEMM of one activation by a weight matrix, which PyTorch runs as
    ``aten.mm``/``addmm`` -- the ops whose outputs the matmuls policy keeps. Stacked expert
    weights (3-d) run as ``bmm`` and are recomputed."""
    return is_weight_gemm(node, graph) and all(
        len(graph.params[p].shape) <= 2 for p in node.params if p in graph.params)


def is_activation_product(node: NodeInfo, graph: GraphIR) -> bool:
    """A GEMM of two activations and no parameter (attention's q.k^T and probabilities.v)."""
    return node.op in GEMM.ops and not node.params and \
        len([i for i in node.inputs if graph.has_node(i)]) >= 2


def attention_core(graph: GraphIR, nodes: Sequence[NodeInfo]) -> frozenset[str]:
    """The unfused attention cores among ``nodes``: each product of two activations (q.k^T)
    whose result reaches another (probabilities.v), with every node on the way (scale, mask,
    softmax, dropout) -- what Korthikanti et al.'s selective recomputation recomputes
    (``Checkpoint.SELECTIVE``). Fused attention has none: its kernel keeps no internals."""
    inside = {n.name: n for n in nodes}
    users: dict[str, list[str]] = {name: [] for name in inside}
    for n in nodes:
        for i in n.inputs:
            if i in users:
                users[i].append(n.name)
    products = {n.name for n in nodes if is_activation_product(n, graph)}
    core: set[str] = set()
    for start in products:
        reached, todo = {start}, [start]
        while todo:  # what the scores feed, up to the next product
            for u in users[todo.pop()]:
                if u not in reached:
                    reached.add(u)
                    if u not in products:
                        todo.append(u)
        ends = [e for e in reached if e in products and e != start]
        on_path, todo = set(ends), list(ends)
        while todo:  # back from each product to the scores, through what they reached
            for i in inside[todo.pop()].inputs:
                if i in reached and i not in on_path:
                    on_path.add(i)
                    todo.append(i)
        if ends:
            core |= on_path | {start}
    return frozenset(core)


WHOLE_WIDTH_NORMS = ("rms_norm", "layer_norm")
"""Norms over the last dim: on a tensor without a heads dim they read every feature."""

NORM_DEPTH = 3
"""How many views after a linear a norm over its whole width keeps it from a column split
(MLA's ``kv_a_proj_with_mqa``: a split and a getitem before ``kv_a_layernorm``)."""


def feeds_width_norm(node: NodeInfo, graph: GraphIR) -> bool:
    """Whether ``node``'s output reaches, through at most ``NORM_DEPTH`` views, a norm over its
    whole width (a rank-3 tensor: no heads dim to keep split): MLA's low-rank projections,
    whose RMSNorm reads every feature of the latent."""
    frontier = {node.name}
    for _ in range(NORM_DEPTH):
        nxt = set()
        for n in (u for name in frontier for u in graph.users(name)):
            if n.op in WHOLE_WIDTH_NORMS and n.out is not None and len(n.out.shape) < 4:
                return True
            if n.op == "view":
                nxt.add(n.name)
        frontier = nxt
        if not frontier:
            return False
    return False


def feeds_weight_gemm(node: NodeInfo, graph: GraphIR) -> bool:
    """Whether another weight GEMM reads ``node``'s output, directly or through other ops."""
    reached, todo = {node.name}, [node.name]
    while todo:
        for n in graph.users(todo.pop()):
            if n.name in reached:
                continue
            if is_weight_gemm(n, graph):
                return True
            reached.add(n.name)
            todo.append(n.name)
    return False


def outer_regions(graph: GraphIR, nodes: Sequence[NodeInfo]) -> dict[str, tuple[bool, bool]]:
    """For each weight GEMM among ``nodes`` (a layer's, in order) of one of ``graph.
    outer_layers``: (whether another weight GEMM of its module -- the attention, the MLP --
    runs before it, whether one runs after it): where a row split can close a column split's
    region inside the module, as in a block (the engine's rule, ``autopar.analysis.
    admissibility.layer_problems``). Empty for a layer with none."""
    modules: dict[str, list[str]] = {}
    for n in nodes:
        path = n.module_path
        if n.block is None and "." in path and any(
                path.startswith(layer + ".") for layer in graph.outer_layers) \
                and is_weight_gemm(n, graph):
            modules.setdefault(path.rsplit(".", 1)[0], []).append(n.name)
    return {name: (k > 0, k < len(names) - 1)
            for names in modules.values() for k, name in enumerate(names)}


def weight_gemm_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """A linear layer (or stacked expert weights): replicated, split by output features
    (column: weight and bias split), or split by input features (row: weight split, bias
    added once after the reduction, output partial sums). A split is offered only where the
    engine can run it (``RuleContext.can_split``), and a row split only inside the repeated
    blocks and the whole layers outside them that the engine splits alike (``GraphIR.
    outer_layers``: DeepSeek's dense first layers; ``RuleContext.outer``): the engine runs one after
    a column split in the same module (attention, MLP). Elsewhere outside the blocks there is
    none: there a column split is offered to the last weight GEMM only (the head;
    ``feeds_weight_gemm``), not to a layer before the blocks whose region no row split could
    close (a generic decoder's projection). Nor is a column split offered where
    a norm over the whole width reads the output (``feeds_width_norm``): the engine keeps a
    column split's output split until a row split, and such a norm could read it only
    gathered.

    Not offered: whole weights over a split sequence (DeepSpeed-Ulysses style). It needs the
    weight gradients all-reduced over the tp ranks and is not one of the engine's parallel styles
    (``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``) that the plan is applied
    with."""
    normed = feeds_width_norm(node, ctx.graph)
    before, after = ctx.outer.get(node.name, (False, False)) if node.block is None \
        else (True, True)
    split = [s for s in (Strategy(Style.COLUMN, (Layout.R_PARTIAL_GRAD,), Layout.S,
                                  divides=True, shards_params=True),
                         Strategy(Style.ROW, (Layout.S,), Layout.P, divides=True,
                                  shards_params=True))
             if ctx.can_split(node, s.name) and (
                 s.name is Style.ROW and before
                 or s.name is Style.COLUMN and not normed
                 and (after or not feeds_weight_gemm(node, ctx.graph)))]
    # a layer split_weights would open a region with (search.forced) keeps its whole
    # strategy where that column split is refused: it stays out of the region
    if split and node.name in ctx.forced and not normed:
        return split
    return [replicated(node, ctx), *split]


def batched_matmul_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """A product of two activations (attention scores, probabilities times values): batched
    over heads when both operands are split by heads."""
    out = [replicated(node, ctx)]
    if width_splittable(node):
        out.append(Strategy(Style.HEADS, tuple(Layout.S for _ in ctx.activation_inputs),
                            Layout.S, divides=True))
    return out


def gemm_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """``weight_gemm_rule`` for a GEMM by parameters, else ``batched_matmul_rule``."""
    if is_weight_gemm(node, ctx.graph):
        return weight_gemm_rule(node, ctx)
    return batched_matmul_rule(node, ctx)


GEMM = register(OpFamily(
    "gemm", ops=("linear", "matmul", "bmm", "baddbmm", "einsum", "grouped_mm"),
    aliases={"Linear": "linear", "addmm": "linear", "mm": "matmul", "_grouped_mm": "grouped_mm",
             # transformers' custom op for MoE experts on CPU
             "grouped_mm_fallback": "grouped_mm"},
    kind=OpKind.MATMUL, flop=gemm_flop, saves=saves_inputs, rule=gemm_rule,
    kept_by_matmuls=is_linear, kept_by_matmuls_aten=("mm", "addmm"), weight_op=is_weight_gemm))
