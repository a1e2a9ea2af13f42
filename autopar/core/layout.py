"""The one vocabulary of tensor-parallel layouts, from the strategy solve to the passes.

Three words, each owned here and used everywhere else:

* ``Layout``: how one activation lies over the ``tp`` ranks (the solve's edges, ``search.reshard``).
* ``Style``: the name of a strategy an op runs by (``autopar.analysis.ops`` rules, the plan's
  ``block_strategies``) and of the style a module is applied with (the plan's
  ``module_strategies``, ``autopar.analysis.module_strategies``; ``passes/tensor_parallel.py`` turns each
  into the engine's ``ParallelStyle``, its one translation to DTensor).
* ``Shard``: how an entry of the cost model's tables divides (``costmodel.workload``).

``Strategy`` joins them for one op: the layouts it needs and gives, under one style name.
``SPLITS`` says which layer each weight split applies to and which weight dim it cuts
(``splittable``): the search offers a split only where it holds, and the admissibility check
refuses a plan where it does not.

The names are ``StrEnum`` members, which compare, hash and serialise as their values: a plan
written to JSON reads back as plain strings equal to these.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Layout(StrEnum):
    """An activation's layout over the ``tp`` ranks."""

    R = "R"
    """Replicated: every rank holds the whole tensor."""
    S = "S"
    """Sharded along the model width (attention heads, ffn features, vocabulary)."""
    Q = "Q"
    """Sharded along the sequence (Megatron's sequence parallelism), only when the candidate
    enables it."""
    P = "P"
    """Partial sums: every rank holds a full-shape addend (the output of a row split)."""
    R_PARTIAL_GRAD = "R*"
    """An input requirement: replicated, its gradient coming back as partial sums (a column
    split's input); the ``fork`` of a tensor read by several column splits reduces it once."""


class Style(StrEnum):
    """A strategy's name (per op), and a module's style (per module, folded from its ops)."""

    REPLICATED = "replicated"
    """Every rank runs the op (holds the module) whole."""
    COLUMN = "column"
    """A linear layer split by output features (``ColwiseParallel``)."""
    ROW = "row"
    """A linear layer split by input features, its output partial sums (``RowwiseParallel``)."""
    VOCAB = "vocab"
    """An embedding split by vocabulary rows, or a loss over vocabulary-split logits."""
    HEADS = "heads"
    """Attention (or a product of two activations) batched over split heads (ops only)."""
    WIDTH = "width"
    """An elementwise or last-dim op keeping a width split; a module of such ops only (a
    per-head norm between a column and a row split) runs on the rank's width shard with its
    weights whole (``WidthParallel``)."""
    SEQUENCE = "sequence"
    """Run over the sequence split (``SequenceParallel`` for a module)."""
    MIXED = "mixed"
    """A module whose ops take several layouts: no engine style expresses it (modules only)."""


ENGINE_STYLES = frozenset({Style.COLUMN, Style.ROW, Style.VOCAB, Style.SEQUENCE,
                           Style.REPLICATED, Style.WIDTH})
"""Module styles the engine's tensor-parallel pass applies (``passes/tensor_parallel.py``)."""

LAYOUT_STYLE: dict[Layout, Style] = {Layout.R: Style.REPLICATED, Layout.S: Style.WIDTH,
                                     Layout.Q: Style.SEQUENCE}
"""The name of the strategy that keeps one layout through an op."""


class Shard(StrEnum):
    """How an entry of the cost model's tables divides under tensor parallelism."""

    TP = "tp"
    """Divided by tp: the op's work or the tensor is split over the tp ranks."""
    SEQ = "seq"
    """Replicated over the tp ranks; divided by tp only with sequence parallelism (the cost
    model's rule for the block input under full recomputation, and the MoE dispatch)."""
    REPLICATED = "replicated"
    """Never divided by tp."""


def shard_of(layout: Layout) -> Shard:
    """How an activation (or the op producing it) in ``layout`` divides."""
    return Shard.TP if layout in (Layout.S, Layout.Q) else Shard.REPLICATED


@dataclass(frozen=True)
class Strategy:
    """One way to run an op over the tp ranks."""

    name: Style | Layout
    """The strategy's style; the solve's own forks, sources and sinks are named by layout."""
    inputs: tuple[Layout, ...]
    """Required layout of each activation input (inputs that are graph nodes), in order."""
    output: Layout
    divides: bool
    """The op's work is divided over the tp ranks."""
    shards_params: bool = False
    """The op's weight matrices are divided over the tp ranks (and its bias, for a column
    split)."""
    loss_parallel: bool = False
    """A vocabulary-sharded loss: three all-reduces of one fp32 value per token."""


SPLITS: dict[Style, tuple[str, int]] = {Style.COLUMN: ("linear", 0), Style.ROW: ("linear", 1),
                                        Style.VOCAB: ("embedding", 0)}
"""A weight split -> (the layer kind it applies to, the weight dim it splits): a column split
divides ``nn.Linear``'s output features (weight dim 0), a row split its input features (dim 1),
a vocabulary split ``nn.Embedding``'s rows."""


def splittable(kind: str, shape: tuple[int, ...], style: Style, tp: int) -> bool:
    """Whether ``style`` (one of ``SPLITS``) can split a ``kind`` layer of weight ``shape``
    over ``tp`` ranks (a layer of no elements has nothing to split: it stays whole)."""
    want, dim = SPLITS[style]
    return kind == want and len(shape) > dim and all(shape) and shape[dim] % tp == 0
