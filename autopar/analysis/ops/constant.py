"""Tensors made from nothing: ``arange``, ``zeros``, ``ones``, ``full``, ``empty``, ``rand``,
``randn`` (positions, masks). No FLOPs, nothing saved; every rank makes the whole tensor or its
slice (``constant_rule``)."""

from __future__ import annotations

from autopar.core.layout import Layout, Strategy
from autopar.analysis.graph import NodeInfo
from autopar.analysis.ops.registry import OpFamily, register, saves_nothing
from autopar.analysis.ops.rules import RuleContext, follow, seq


def constant_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Every rank makes the tensor, or its slice."""
    return follow(node, ctx, [Layout.R, Layout.S, *seq(ctx)])


CONSTANT = register(OpFamily(
    "constant", ops=("arange", "zeros", "ones", "full", "empty", "rand", "randn"),
    aliases={"scalar_tensor": "full"}, saves=saves_nothing, rule=constant_rule))
