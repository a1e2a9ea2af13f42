"""Elementwise ops: arithmetic, products, comparisons and selects, casts and copies.

* FLOPs: 1 per output element for the arithmetic (``diff`` is a subtraction of neighbours),
  products (``outer`` a broadcast one), ``where`` and ``masked_fill``; comparisons, logical ops
  (and, or, not), casts and copies move data only.
* Saved: a product (``mul``, ``div``) of two activations keeps both, and one by a parameter
  (a norm's weight) keeps its input; everything else keeps nothing. A cast the code writes to
  fp32 (``x.float()``, ``x.to(torch.float32)``: ``WIDEN``) is a view in the fp32 trace but a
  4-byte copy where the model runs in bf16 or fp16: what keeps it keeps that copy, and its
  input (``analysis.workload``; a router's fp32 input, 112 MiB a DeepSeek-V3 layer and
  micro-batch).
* Strategies: any split passes through (``elementwise_rule``).
* Fusions: ``rope`` (``x * cos + rotate_half(x) * sin``: the chain ``neg, cat, mul, add`` with
  ``x * cos`` joining the add), the kernel of ``autopar.kernels``, which saves only the cos and
  sin buffers.
"""

from __future__ import annotations

from autopar.core.layout import Layout, Strategy
from autopar.analysis.graph import NodeInfo
from autopar.analysis.ops.registry import (VIEW, WIDEN, FusionPattern, OpFamily, Saver, register,
                                          saves_nothing)
from autopar.analysis.ops.rules import RuleContext, follow, seq


def elementwise_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Elementwise ops and views keep any split (a view keeps the heads/width split because the
    space only lets tp divide the heads). Without sequence parallelism, compute on the residual
    stream (``ops.stream.residual_stream``: the graph's path from the layer's input to its
    output around the weight GEMMs, not a view) stays whole: splitting it by width would be
    sequence parallelism under another name (a reduce-scatter and an all-gather around the
    norms) and would cut fused bias-dropout-add kernels across a layout change. An MLP's inner
    tensors are not the stream even when as wide as it."""
    view = node.op == VIEW
    stream = not ctx.sequence_parallel and not view and node.name in ctx.stream
    # a view (expand included) has one activation input and keeps its split dim: it has no
    # small operand to broadcast, though expand's output has more elements than its input
    return follow(node, ctx, [Layout.R, *([] if stream else [Layout.S]), *seq(ctx)],
                  broadcasts=not view)


def product_saves(node: NodeInfo, saver: Saver) -> None:
    """A product keeps its factors: both activations, or the activation scaled by a weight."""
    if len(node.inputs) >= 2 or node.params:
        for i in node.inputs:
            saver.keep(i)


ARITHMETIC = register(OpFamily(
    "arithmetic", ops=("add", "sub", "neg"),
    aliases={"iadd": "add", "add_": "add", "isub": "sub", "rsub": "sub", "diff": "sub"},
    flop_per_element={"add": 1, "sub": 1, "neg": 1}, saves=saves_nothing,
    rule=elementwise_rule,
    fusions=(FusionPattern("rope", ("neg", "cat", "mul", "add"), side_ops=("mul",),
                           kernel_saves=lambda chain, saver: None),)))

PRODUCT = register(OpFamily(
    "product", ops=("mul", "div"),
    aliases={"imul": "mul", "mul_": "mul", "truediv": "div", "div_": "div", "outer": "mul"},
    flop_per_element={"mul": 1, "div": 1}, saves=product_saves, rule=elementwise_rule))

SELECT = register(OpFamily(
    "select", ops=("masked_fill", "where", "clamp", "floor", "ceil", "eq", "ne", "lt", "gt",
                   "le", "ge", "remainder", "floor_divide", "logical_and", "logical_or",
                   "logical_not"),
    aliases={"masked_fill_": "masked_fill", "mod": "remainder", "fmod": "remainder",
             "floordiv": "floor_divide", "and_": "logical_and", "__and__": "logical_and",
             "bitwise_and": "logical_and", "or_": "logical_or", "__or__": "logical_or",
             "bitwise_or": "logical_or", "invert": "logical_not", "__invert__": "logical_not",
             "bitwise_not": "logical_not"},
    flop_per_element={"masked_fill": 1, "where": 1}, saves=saves_nothing, rule=elementwise_rule))

CAST = register(OpFamily(
    "cast", ops=("cast", "contiguous", "copy", "fill", "bool", "long", WIDEN),
    # a cast to the same dtype and a copy of a contiguous tensor are views (``naming``)
    aliases={"to": "cast", "_to_copy": "cast", "type_as": "cast", "float": "cast",
             "half": "cast", "bfloat16": "cast", "type": "cast", "clone": "contiguous",
             "copy_": "copy"},
    saves=saves_nothing, rule=elementwise_rule))
