"""Normalisation over the width: ``layer_norm``, ``rms_norm``, ``group_norm``.

* FLOPs per output element: layer norm 5 (mean, subtract, variance, normalise, affine), RMS
  norm 4 (square, mean, normalise, scale).
* Saved: the input and fp32 statistics per row (RMS norm its rstd; layer and group norm mean
  and rstd).
* Strategies: replicated, or over the sequence (Megatron's sequence parallelism).
* Fusions: ``rms_norm`` and ``layer_norm``, the kernels of ``autopar.kernels``, which save the
  input x (the weight is a parameter; mean and rstd are recomputed from x).
"""

from __future__ import annotations

from autopar.core.layout import Layout, Strategy
from autopar.analysis.graph import NodeInfo
from autopar.analysis.ops.registry import FusionPattern, OpFamily, Saver, register
from autopar.analysis.ops.rules import RuleContext, follow, seq


def norm_saves(node: NodeInfo, saver: Saver) -> None:
    for i in node.inputs[:1]:
        saver.keep(i)
    if node.out is not None and len(node.out.shape) >= 1:
        stats = 1 if node.op == "rms_norm" else 2  # rstd; or mean and rstd
        saver.extra(node.name + ".stats", stats * node.out.numel / node.out.shape[-1], 4.0)


def norm_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Replicated, or over the sequence."""
    return follow(node, ctx, [Layout.R, *seq(ctx)])


def keeps_first_input(chain: list[NodeInfo], saver: Saver) -> None:
    """A kernel that saves its input x."""
    saver.keep(chain[0].inputs[0])


NORM = register(OpFamily(
    "norm", ops=("layer_norm", "rms_norm", "group_norm"),
    aliases={"LayerNorm": "layer_norm", "native_layer_norm": "layer_norm",
             "RMSNorm": "rms_norm", "_fused_rms_norm": "rms_norm"},
    flop_per_element={"layer_norm": 5, "rms_norm": 4}, saves=norm_saves, rule=norm_rule,
    fusions=(FusionPattern("rms_norm", ("rms_norm",), kernel_saves=keeps_first_input),
             FusionPattern("layer_norm", ("layer_norm",), kernel_saves=keeps_first_input))))
