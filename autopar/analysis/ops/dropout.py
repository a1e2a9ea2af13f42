"""Dropout: ``dropout`` (``nn.Dropout``, ``F.dropout``, ATen ``native_dropout``).

* FLOPs: 1 per output element; with p = 0 (or in eval mode) the op returns its input itself: no
  kernel, no storage (``returns_input``).
* Saved: a one-byte mask per element when p > 0.
* Strategies: any split passes through (``elementwise.elementwise_rule``).
* Fusions: ``bias_dropout_add`` (``dropout, add``), Megatron-LM's fused kernel; its ops keep
  what they keep eager.
"""

from __future__ import annotations

from autopar.analysis.graph import NodeInfo
from autopar.analysis.ops.elementwise import elementwise_rule
from autopar.analysis.ops.registry import FusionPattern, OpFamily, Saver, register


def dropout_p(node: NodeInfo) -> float:
    """The dropout probability of a dropout node (0 in eval mode or when p = 0)."""
    for a in node.scalar_args:
        if isinstance(a, tuple) and len(a) == 2 and a[0] in ("p", "train"):
            if a[0] == "train" and a[1] is False:
                return 0.0
            if a[0] == "p" and isinstance(a[1], float):
                return a[1]
        elif isinstance(a, float):
            return a
    return 0.0


def dropout_saves(node: NodeInfo, saver: Saver) -> None:
    if dropout_p(node) > 0 and node.out is not None:
        saver.extra(node.name + ".mask", node.out.numel, 1.0)


DROPOUT = register(OpFamily(
    "dropout", ops=("dropout",),
    aliases={"Dropout": "dropout", "native_dropout": "dropout", "feature_dropout": "dropout"},
    flop_per_element={"dropout": 1}, saves=dropout_saves, rule=elementwise_rule,
    returns_input=lambda node: dropout_p(node) == 0.0,
    fusions=(FusionPattern("bias_dropout_add", ("dropout", "add")),)))
