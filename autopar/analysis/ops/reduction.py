"""Ops along the last dim: softmax, reductions and scans, joins, masks, top-k.

* FLOPs: softmax and log-softmax 5 per output element (max, subtract, exp, sum, divide);
  ``mean`` and ``sum`` 1 per input element; the others move data only.
* Saved: softmax and log-softmax keep their output, top-k its integer indices; the others
  nothing.
* Strategies: replicated, over the sequence, and split by width only with a separate heads dim
  (``last_dim_rule``).
* Fusions: ``scale_mask_softmax`` (``mul, masked_fill, softmax``), Megatron-LM's fused kernel;
  its ops keep what they keep eager.
"""

from __future__ import annotations

from autopar.core.layout import Layout, Strategy
from autopar.analysis.graph import NodeInfo
from autopar.analysis.ops.activation import saves_output
from autopar.analysis.ops.index import saves_indices
from autopar.analysis.ops.registry import FusionPattern, OpFamily, register, saves_nothing
from autopar.analysis.ops.rules import RuleContext, follow, rank, seq, width_splittable


def last_dim_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Ops that reduce, scan or join along the last dim: a width split only with a separate
    heads dim (softmax over the keys of split heads)."""
    layouts = [Layout.R, *seq(ctx)]
    if width_splittable(node) and all(rank(ctx, i) >= 4 for i in ctx.activation_inputs):
        layouts.insert(1, Layout.S)
    return follow(node, ctx, layouts, broadcasts=False)


SOFTMAX = register(OpFamily(
    "softmax", ops=("softmax", "log_softmax"),
    aliases={"Softmax": "softmax", "_softmax": "softmax", "_safe_softmax": "softmax",
             "LogSoftmax": "log_softmax", "_log_softmax": "log_softmax"},
    flop_per_element={"softmax": 5, "log_softmax": 5}, saves=saves_output, rule=last_dim_rule,
    fusions=(FusionPattern("scale_mask_softmax", ("mul", "masked_fill", "softmax")),)))

REDUCE = register(OpFamily(
    "reduce", ops=("mean", "sum", "max", "min", "cumsum", "argmax", "sort", "argsort", "triu",
                   "tril"),
    flop_per_input_element={"mean": 1, "sum": 1}, saves=saves_nothing, rule=last_dim_rule))

JOIN = register(OpFamily(
    "join", ops=("cat",), aliases={"concat": "cat", "concatenate": "cat", "stack": "cat"},
    saves=saves_nothing, rule=last_dim_rule))

TOPK = register(OpFamily("topk", ops=("topk",), saves=saves_indices, rule=last_dim_rule))
