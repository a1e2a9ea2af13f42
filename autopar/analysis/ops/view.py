"""Views and padding: ops that reshape a tensor.

``view`` is every op that moves no data: view/reshape/transpose/permute/split/chunk/unsqueeze/
expand/getitem/getattr/size, a copy of an already contiguous tensor and a cast to the same dtype
(``naming.canonical_op``). It costs nothing, saves nothing and keeps any split
(``elementwise.elementwise_rule``); an ``expand`` of a size-1 dim also reads a replicated
input into a heads split (``view_rule``). ``pad`` (``F.pad``, ATen ``pad`` and ``constant_pad_nd``)
copies into a larger tensor: no FLOPs, its input read and output written, nothing saved (its
backward slices the gradient). It runs whole on every tp rank (``rules.whole``): it may widen
any dim, and a layout does not say which dim it cuts once the tensor has been transposed (the
causal pad of a convolution's time axis), so no split is known to survive it.
"""

from __future__ import annotations

from collections.abc import Sequence

from autopar.core.layout import Layout, Strategy, Style
from autopar.core.roofline import OpKind
from autopar.analysis.graph import NodeInfo, TensorMeta
from autopar.analysis.ops.elementwise import elementwise_rule
from autopar.analysis.ops.registry import VIEW, OpFamily, register, saves_nothing
from autopar.analysis.ops.rules import RuleContext, whole, width_splittable

_RAW_VIEWS = (
    "Identity", "Flatten", "Unflatten", "reshape", "_unsafe_view", "transpose", "permute",
    "expand", "expand_as", "unsqueeze", "squeeze", "slice", "select", "split",
    "split_with_sizes", "chunk", "unbind", "t", "alias", "getitem", "getattr", "size", "dim",
    "flatten", "unflatten", "narrow", "as_strided", "view_as", "detach", "movedim", "swapaxes",
    "numel", "lift_fresh_copy",
)
"""Raw names of ops that move no data (``nn.Identity``, ``Tensor.reshape``, ATen ``t``...)."""


def _no_bytes(op: str, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta]) -> float:
    return 0.0


def _broadcasts(node: NodeInfo, ctx: RuleContext) -> bool:
    """An ``expand`` of a size-1 dim of a tensor with a heads dim (MLA's one rope key read by
    every head): each rank expands its whole input to its own heads."""
    if node.target not in ("expand", "expand_as") or not width_splittable(node):
        return False
    source = ctx.graph.node(ctx.activation_inputs[0]).out if ctx.activation_inputs else None
    out = node.out
    return source is not None and out is not None and len(source.shape) == len(out.shape) \
        and any(a == 1 < b for a, b in zip(source.shape, out.shape))


def view_rule(node: NodeInfo, ctx: RuleContext) -> list[Strategy]:
    """A view keeps any split (``elementwise_rule``); an expand of a size-1 dim also makes a
    heads split of a replicated input, no collective: each rank expands it to its own heads,
    and its gradient, summed over those heads, is the rank's partial sum (``R*``: all-reduced
    in the backward, as a column split's input)."""
    out = elementwise_rule(node, ctx)
    if _broadcasts(node, ctx):
        out.append(Strategy(Style.HEADS, (Layout.R_PARTIAL_GRAD,), Layout.S,
                            divides=True))
    return out


VIEWS = register(OpFamily(
    "view", ops=(VIEW,), aliases={raw: VIEW for raw in _RAW_VIEWS}, kind=OpKind.FREE,
    bytes=_no_bytes, saves=saves_nothing, rule=view_rule,
    returns_input=lambda node: True))

PAD = register(OpFamily("pad", ops=("pad",), aliases={"constant_pad_nd": "pad"},
                        saves=saves_nothing, rule=whole))
