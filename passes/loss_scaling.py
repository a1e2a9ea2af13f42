"""Dynamic loss scaling of fp16 plans, on torch's own gradient scaler.

fp16 has 5 exponent bits: gradients below 6e-8 flush to zero, and the gradients of a language
model's logits are about 1 / (tokens per micro-batch) each, so without scaling a large share of
them underflows -- a single process already differs by 10 % of the largest gradient between one
batch and eight micro-batches. Every fp16 plan therefore runs with dynamic loss scaling
(Micikevicius et al., "Mixed Precision Training", ICLR 2018; Megatron-LM and DeepSpeed do the
same): the loss is multiplied by a scale before the backward pass, the fp32 gradients are
divided by it before the optimizer step, a step whose gradients hold an inf or a NaN is skipped
and the scale halved, and after ``growth_interval`` clean steps the scale doubles.

The engine is ``torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler`` (FSDP2's
gradients are DTensor shards: the scaler checks each rank's shards and all-reduces the
"found inf" flag over every rank, so that all ranks skip the same steps). The single-process
reference of ``autopar verify`` uses ``torch.amp.GradScaler`` with the same ``LOSS_SCALING``.
The cost model prices the unscaling pass and the flag's all-reduce
(``costmodel/step.py:_optimizer_s``).
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from autopar.core.specs import Precision, TrainSpec
from autopar.models.training import LOSS_SCALING


def grad_scaler(train: TrainSpec, device: torch.device) -> ShardedGradScaler | None:
    """The plan's scaler: one for fp16, ``None`` for every other precision."""
    if train.precision is not Precision.FP16:
        return None
    scaler = ShardedGradScaler(device=device.type, process_group=dist.group.WORLD,
                               **LOSS_SCALING)
    # The scale is made by the first ``scale`` call, which pipeline ranks without the last
    # stage never make (they scale no loss, only receive scaled gradients): make it now.
    scaler.scale(torch.ones((), device=device))
    return scaler


@contextmanager
def quiet_found_inf() -> Iterator[None]:
    """Silence what DTensor says of the scaler's one-element "found inf" flag: it replicates
    the plain tensor over the gradients' mesh and reduces it with a max, axis by axis, which is
    what is wanted (a warning and a log line per rank and step otherwise)."""
    log = logging.getLogger("torch.distributed.tensor._redistribute")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1")
            yield
    finally:
        log.setLevel(level)
