"""Fused attention: ``sdpa`` (``F.scaled_dot_product_attention`` and its ATen kernels).

* FLOPs: ``2*b*h*sq*sk*d_qk + 2*b*h*sq*sk*d_v`` (= ``4*b*h*sq*sk*d``), the *full* score matrix
  even for causal attention, as Megatron-LM counts it (the causal mask halves the useful work,
  but the MFU convention charges the full product; kernels skip about half of it).
  ``FlopCounterMode`` counts zero for the CPU flash op, so attention is always counted here.
* A sliding window (``sink_attention``, GPT-OSS's core: ``models/moe/attention.py``, its window
  the first scalar argument, 0 for none): a query's keys are its ``w`` latest, so the
  causal triangle's ``s(s+1)/2`` (query, key) pairs become the band's ``w*s - w(w-1)/2``; the
  layer is charged the full product times band / triangle -- the same multiple of the work
  its kernel does as a causal layer's, so one efficiency prices both (for s = 4096 and w = 128
  that is 1/16.3 of a full layer). Its learned sinks add one logit per row to the softmax's
  denominator inside the kernel: ``2*b*h*sq`` FLOPs (the exp and the add).
* Saved: query, key, value, the output and the fp32 log-sum-exp per query row; the matmuls
  policy keeps the output and log-sum-exp.
* Strategies: replicated, or split by heads (query, key and value all split; a mask or bias
  input is read replicated).
"""

from __future__ import annotations

from collections.abc import Sequence

from autopar.core.layout import Layout, Strategy, Style
from autopar.core.roofline import OpKind
from autopar.analysis.graph import GraphIR, NodeInfo, TensorMeta
from autopar.analysis.ops.registry import OpFamily, Saver, register
from autopar.analysis.ops.rules import RuleContext, replicated


def is_causal(node: NodeInfo) -> bool:
    """Whether a fused attention call masks causally by its own flag (``is_causal=True``), so
    its kernel skips the masked half of the score tiles (FlashAttention's and cuDNN's causal
    kernels; an explicit mask tensor is read whole)."""
    return ("is_causal", True) in node.scalar_args


def sdpa_flop(op: str, raw: str, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta],
              scalars: Sequence[object]) -> float:
    if len(ins) < 3:
        return 0.0
    q, k, v = ins[0], ins[1], ins[2]
    rows = q.numel // q.shape[-1]  # b * heads * sq
    sk = k.shape[-2]
    full = 2.0 * rows * sk * q.shape[-1] + 2.0 * rows * sk * v.shape[-1]
    if raw != SINK_ATTENTION:
        return full
    window = scalars[0] if scalars and isinstance(scalars[0], int) else 0
    sinks = 2.0 * rows if len(ins) > 3 else 0.0
    return full * window_fraction(sk, window) + sinks


SINK_ATTENTION = "sink_attention"
"""The raw name of GPT-OSS's attention core (``models/moe/attention.py``): fused attention with
a window and sinks."""


def window_fraction(seq: int, window: int) -> float:
    """The (query, key) pairs a causal attention over ``seq`` positions computes within a
    ``window`` (0: none), as a fraction of the causal triangle's (the module docstring)."""
    if window <= 0 or window >= seq:
        return 1.0
    band = window * seq - window * (window - 1) / 2
    return band / (seq * (seq + 1) / 2)


def sdpa_saves(node: NodeInfo, saver: Saver) -> None:
    for i in node.inputs[:3]:
        saver.keep(i)
    saver.keep(node.name)
    q = saver.graph.node(node.inputs[0]).out if node.inputs else None
    if q is not None and len(q.shape) == 4:
        saver.extra(node.name + ".lse", q.shape[0] * q.shape[1] * q.shape[2], 4.0)


def attention_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Replicated or split by heads (see the module docstring)."""
    heads = tuple(Layout.S if k < 3 else Layout.R for k in range(len(ctx.activation_inputs)))
    return [replicated(node, ctx), Strategy(Style.HEADS, heads, Layout.S, divides=True)]


def _always(node: NodeInfo, graph: GraphIR) -> bool:
    return True


ATTENTION = register(OpFamily(
    "attention", ops=("sdpa",),
    aliases={raw: "sdpa" for raw in (
        "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
        SINK_ATTENTION)},
    kind=OpKind.ATTENTION, flop=sdpa_flop, saves=sdpa_saves, rule=attention_rule,
    kept_by_matmuls=_always,
    kept_by_matmuls_aten=("_scaled_dot_product_flash_attention",
                          "_scaled_dot_product_efficient_attention",
                          "_scaled_dot_product_cudnn_attention",
                          "_scaled_dot_product_flash_attention_for_cpu")))
