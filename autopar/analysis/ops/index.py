"""Lookups and token routing: gathers and scatters, the embedding, mixture-of-experts dispatch.

* FLOPs: none (data movement). Bytes: a gather (``index``) and the embedding read only the rows
  they gather -- as many bytes as the output holds, plus the indices -- not the whole table.
* Saved: the integer indices a gather, scatter or lookup used (its non-floating outputs).
* Strategies: the routing ops run replicated or over the tokens of the sequence
  (``tokens_rule``; the expert weights themselves follow ``gemm.weight_gemm_rule``); the
  embedding replicated or split by vocabulary (``embedding_rule``).
"""

from __future__ import annotations

from collections.abc import Sequence

from autopar.core.layout import Layout, Strategy, Style
from autopar.analysis.graph import GraphIR, NodeInfo, TensorMeta
from autopar.analysis.ops.registry import OpFamily, Saver, register, saves_nothing
from autopar.analysis.ops.rules import RuleContext, follow, replicated, seq


def gathered_bytes(op: str, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta]) -> float:
    """Only the gathered rows of the table are read: as many bytes as the output holds, plus
    the indices (the smaller operand)."""
    written = sum(t.nbytes for t in outs)
    if len(ins) < 2:
        return float(sum(t.nbytes for t in ins) + written)
    indices = min(ins, key=lambda t: t.nbytes)
    return float(2 * written + indices.nbytes)


def saves_indices(node: NodeInfo, saver: Saver) -> None:
    """The integer outputs (indices) the backward scatters or gathers by."""
    for out in node.outputs:
        if not out.dtype.is_floating_point:
            saver.extra(f"{node.name}.index{len(saver)}", out.numel, out.dtype.itemsize)


def tokens_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Mixture-of-experts dispatch and combine (index, scatter, one-hot): replicated or over the
    tokens of the sequence."""
    return follow(node, ctx, [Layout.R, *seq(ctx)])


def embedding_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """A lookup table: replicated, or split by vocabulary (each rank looks up its rows, the
    others' tokens give zeros, so the output is partial sums)."""
    ins = tuple(Layout.R for _ in ctx.activation_inputs)
    vocab = Strategy(Style.VOCAB, ins, Layout.P, divides=False, shards_params=True)
    return [replicated(node, ctx), *([vocab] if ctx.can_split(node, Style.VOCAB) else [])]


def _holds_table(node: NodeInfo, graph: GraphIR) -> bool:
    return True


GATHER = register(OpFamily(
    "gather", ops=("index",), aliases={"index_select": "index", "gather": "index"},
    bytes=gathered_bytes, saves=saves_indices, rule=tokens_rule))

SCATTER = register(OpFamily(
    "scatter", ops=("scatter",),
    aliases={raw: "scatter" for raw in ("scatter_", "scatter_add", "scatter_add_", "index_add",
                                        "index_put", "index_put_", "index_copy")},
    saves=saves_indices, rule=tokens_rule))

ROUTING = register(OpFamily(
    "routing", ops=("one_hot", "repeat", "new_zeros", "zeros_like", "ones_like", "histc",
                    "bincount", "searchsorted", "full_like", "empty_like", "new_ones", "new_full",
                    "new_empty"),
    aliases={"repeat_interleave": "repeat"}, saves=saves_nothing, rule=tokens_rule))

EMBEDDING = register(OpFamily(
    "embedding", ops=("embedding",), aliases={"Embedding": "embedding"}, bytes=gathered_bytes,
    saves=saves_indices, rule=embedding_rule, weight_op=_holds_table))
