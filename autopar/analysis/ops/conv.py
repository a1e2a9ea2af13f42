"""Convolutions: ``nn.Conv1d``/``2d``/``3d`` and their transposes, the functional ``conv*d`` and
``conv_transpose*d``, ATen ``convolution``.

* FLOPs: torch's own count (``torch.utils.flop_counter.conv_flop_count``, what
  ``FlopCounterMode`` counts for ``aten.convolution``): 2 x batch x output positions (input
  positions for a transposed convolution) x kernel size x out channels x in channels per group.
  The bias add is not counted (the GEMM convention, ``gemm.py``).
* Bytes: input, weight and bias read, output written (the registry's default).
* Kind: the matmul roofline. cuDNN runs a convolution as an implicit GEMM on the tensor cores,
  and its backward is two convolutions of the forward's size (the input gradient, the weight
  gradient), which is how the cost model prices a GEMM whose shape it does not know
  (``costmodel/compute.py``).
* Saved: the activation input (the weight-gradient convolution reads it; the weight is a
  parameter, counted with the model states).
* Strategy: replicated over the tp ranks, by rule (``rules.whole``), not for want of one. A
  convolution could be split by output channels like a column-split linear layer, but the
  engine's tensor-parallel styles (``ColwiseParallel``, ``RowwiseParallel``) apply to
  ``nn.Linear`` and ``nn.Embedding`` only, and it mixes neighbouring positions, so no sequence
  split survives it without a halo exchange the engine does not run.
"""

from __future__ import annotations

from collections.abc import Sequence

from autopar.core.roofline import OpKind
from autopar.analysis.graph import TensorMeta
from autopar.analysis.ops.registry import OpFamily, register, saves_inputs
from autopar.analysis.ops.rules import whole

_TRANSPOSED = ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d", "conv_transpose1d",
               "conv_transpose2d", "conv_transpose3d")
"""Raw spellings of a transposed convolution (ATen's ``convolution`` says it by an argument)."""


def conv_flop(op: str, raw: str, ins: Sequence[TensorMeta], outs: Sequence[TensorMeta],
              scalars: Sequence[object]) -> float:
    """torch's count for the input ``ins[0]`` and weight ``ins[1]``. A transposed convolution
    is named so (``_TRANSPOSED``) or, as ATen's ``convolution``, has its ``transposed`` flag,
    the one bool among its scalar arguments, set."""
    from torch.utils.flop_counter import conv_flop_count  # at the first convolution only

    if len(ins) < 2 or not outs:
        return 0.0
    transposed = raw in _TRANSPOSED or any(s is True for s in scalars)
    return float(conv_flop_count(list(ins[0].shape), list(ins[1].shape), list(outs[0].shape),
                                 transposed=transposed))


CONVOLUTION = register(OpFamily(
    "convolution", ops=("convolution",),
    aliases={raw: "convolution" for raw in (
        "Conv1d", "Conv2d", "Conv3d", "conv1d", "conv2d", "conv3d", "_convolution",
        *_TRANSPOSED)},
    kind=OpKind.MATMUL, flop=conv_flop, saves=saves_inputs, rule=whole))
