"""Views and padding: ops that reshape a tensor.

``view`` is every op that moves no data: view/reshape/transpose/permute/split/chunk/unsqueeze/
expand/getitem/getattr/size, a copy of an already contiguous tensor and a cast to the same dtype
(``naming.canonical_op``). It costs nothing, saves nothing and keeps any split
(``elementwise.elementwise_rule``). ``pad`` (``F.pad``, ATen ``pad`` and ``constant_pad_nd``)
copies into a larger tensor: no FLOPs, its input read and output written, nothing saved (its
backward slices the gradient). It runs whole on every tp rank (``rules.whole``): it may widen
any dim, and a layout does not say which dim it cuts once the tensor has been transposed (the
causal pad of a convolution's time axis), so no split is known to survive it.
"""

from __future__ import annotations

from collections.abc import Sequence

from autopar.core.roofline import OpKind
from autopar.analysis.graph import TensorMeta
from autopar.analysis.ops.elementwise import elementwise_rule
from autopar.analysis.ops.registry import VIEW, OpFamily, register, saves_nothing
from autopar.analysis.ops.rules import whole

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


VIEWS = register(OpFamily(
    "view", ops=(VIEW,), aliases={raw: VIEW for raw in _RAW_VIEWS}, kind=OpKind.FREE,
    bytes=_no_bytes, saves=saves_nothing, rule=elementwise_rule,
    returns_input=lambda node: True))

PAD = register(OpFamily("pad", ops=("pad",), aliases={"constant_pad_nd": "pad"},
                        saves=saves_nothing, rule=whole))
