"""The loss: ``cross_entropy`` (``nn.CrossEntropyLoss``, ``F.cross_entropy``).

* FLOPs: 5 per logit (log-softmax over the logits, then gather and mean).
* Saved: the program upcasts the logits and keeps log_softmax's fp32 output; its backward holds
  that, the fp32 gradient of the log-probabilities and the one of the logits at once: 8 bytes
  per logit beyond what is kept, while the loss runs (``transient``).
* Strategies: replicated, or over vocabulary-split logits (``loss_parallel``). Its forward
  peaks above the eager backward: torch's ``loss_parallel`` log-softmax
  (``torch.distributed.tensor.parallel.loss._log_softmax``) holds the compute-dtype logits,
  their fp32 copy, the shifted logits and the log-probabilities at once, and the dry run
  shows one more compute-dtype copy beside them: 12 bytes per local logit beyond the kept
  log-probabilities (``LOSS_PARALLEL_TRANSIENT_BYTES``, ``bench/results/memory_grid.md``).
* Fusions: ``linear_cross_entropy`` (the head's GEMM and the loss), the kernel of
  ``autopar.kernels`` (``linear_cross_entropy_saves``).
"""

from __future__ import annotations

import math

from autopar.core.layout import Layout, Strategy, Style
from autopar.analysis.graph import NodeInfo
from autopar.analysis.ops.registry import FusionPattern, OpFamily, Saver, register
from autopar.analysis.ops.rules import RuleContext, replicated


EAGER_TRANSIENT_BYTES = 8.0
"""Bytes per logit the eager loss holds beyond the kept log-probabilities while it runs."""
LOSS_PARALLEL_TRANSIENT_BYTES = 12.0
"""The same for the vocabulary-parallel loss, per local logit (see the module docstring)."""


def loss_saves(node: NodeInfo, saver: Saver) -> None:
    if not node.inputs or not saver.graph.has_node(node.inputs[0]):
        return
    logits = saver.graph.node(node.inputs[0]).out
    if logits is not None:
        saver.extra(node.name + ".logprobs", logits.numel, 4.0)
        saver.extra(saver.base(node.inputs[0]) + ".grad", logits.numel, EAGER_TRANSIENT_BYTES,
                    transient=True)


def loss_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """Replicated, or over vocabulary-split logits (``loss_parallel``)."""
    rest = tuple(Layout.R for _ in ctx.activation_inputs[1:])
    return [replicated(node, ctx),
            Strategy(Style.VOCAB, (Layout.S, *rest), Layout.R, divides=True,
                     loss_parallel=True)]


def linear_cross_entropy_saves(chain: list[NodeInfo], saver: Saver) -> None:
    """The fused loss saves the two gradients it computed in the forward, of the hidden state
    (tokens x hidden, hidden's dtype) and of the head's weight (vocab x hidden, cast to
    hidden's dtype: one weight-sized buffer per micro-batch, ``per_token`` false), and holds
    a chunk of logits while it runs (c = tokens / ceil(vocab / hidden) rows, as
    ``kernels.linear_cross_entropy.chunk_tokens`` without its rounding up to a power of two)."""
    first, graph = chain[0], saver.graph
    hidden = graph.node(saver.base(first.inputs[0]))
    weights = [graph.params[p] for p in first.params
               if p in graph.params and len(graph.params[p].shape) == 2]
    if hidden.out is None or not weights:
        return
    vocab, width = weights[0].shape
    saver.extra(first.name + ".grad_hidden", hidden.out.numel, None)
    saver.extra(first.name + ".grad_weight", float(vocab * width), None, per_token=False)
    tokens = hidden.out.numel / width
    saver.extra(first.name + ".chunk_logits", tokens / math.ceil(vocab / width) * vocab, None,
                transient=True)


LOSS = register(OpFamily(
    "loss", ops=("cross_entropy",),
    aliases={"CrossEntropyLoss": "cross_entropy", "cross_entropy_loss": "cross_entropy"},
    flop_per_input_element={"cross_entropy": 5}, saves=loss_saves, rule=loss_rule,
    fusions=(FusionPattern("linear_cross_entropy", ("linear", "cross_entropy"),
                           kernel_saves=linear_cross_entropy_saves),)))
