"""The recipe a verification or an exported run trains with: model, data, optimizer.

Shared by ``autopar verify`` (the reference process and every rank must build the same model
from the same seed and read the same tokens) and by the ``train.py`` that ``autopar export``
writes. The model comes from a ``ModelSpec`` (``autopar.core.model_spec``), plain JSON that can be
handed to other processes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autopar.core.model_spec import ModelSpec

__all__ = ["LOSS_SCALING", "OPTIMIZER", "ModelSpec", "end_rank", "loss_of", "optimizer",
           "synthetic_batch", "synthetic_inputs", "vocab_size"]

OPTIMIZER = {"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-6, "weight_decay": 0.1}
"""AdamW settings. ``eps`` is 1e-6, not 1e-8: a gradient near zero divided by
sqrt(v) + eps amplifies the last-bit differences of a reordered reduction, and parity checks
compare parameters after the step (../shared/design/FINDINGS.md)."""


LOSS_SCALING = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5,
                "growth_interval": 2000}
"""Dynamic loss scaling of fp16 plans (``passes/loss_scaling.py``): torch's ``GradScaler``
defaults, the scheme of Micikevicius et al. (2018) that Megatron-LM and DeepSpeed also run."""


def vocab_size(model: nn.Module) -> int:
    """The model's vocabulary (``autopar.models.shape.vocab_of``), or an ``AutoparError``."""
    from autopar.models.shape import vocab_of

    vocab = vocab_of(model)
    if vocab is None:
        from autopar.core.errors import AutoparError

        raise AutoparError(f"{type(model).__name__} has no config.vocab_size and no "
                           "nn.Embedding: autopar cannot tell which token ids it takes",
                           where="the model", fix="give the model a config with vocab_size, "
                           "or a token embedding (nn.Embedding)")
    return vocab


def synthetic_batch(step: int, rows: int, seq_len: int, vocab: int, seed: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, targets) of step ``step``: uniform random tokens, targets shifted by one."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randint(vocab, (rows, seq_len + 1), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def synthetic_inputs(model: nn.Module, step: int, rows: int, seq_len: int, seed: int = 0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of step ``step`` for ``model``, as ``feed.feed_of`` feeds it: a token
    model's ``synthetic_batch`` over its vocabulary; an image model's standard-normal images of
    its config's size (in fp32: the reference and the ranks cast with the model) and uniform
    class labels, one per image, drawn from the same (seed, step) stream."""
    from autopar.models.feed import FeedKind, feed_of

    feed = feed_of(model)
    if feed.kind is FeedKind.TOKENS:
        return synthetic_batch(step, rows, seq_len, vocab_size(model), seed)
    if feed.image is None or feed.classes is None:
        from autopar.core.errors import AutoparError

        raise AutoparError(f"{type(model).__name__} reads images but its config gives no "
                           "num_labels to draw class labels from", where="config.num_labels",
                           fix="set num_labels (or id2label) in the config")
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    images = torch.randn(rows, *feed.image, generator=g)
    return images, torch.randint(feed.classes, (rows,), generator=g)


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` (..., classes) against ``targets`` (...): every token's
    next-token loss for (batch, seq, vocab) logits, every image's class loss for (batch,
    classes)."""
    return F.cross_entropy(logits.flatten(0, -2), targets.flatten())


def optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW with ``OPTIMIZER``; ``foreach=False`` since a rank may hold plain tensors and
    DTensors on different meshes side by side."""
    return torch.optim.AdamW(params, foreach=False, **OPTIMIZER)


def end_rank(code: int) -> None:
    """End this rank's process: flush, wait at a barrier for the others when it succeeded, and
    leave with ``os._exit``. Gloo ranks sometimes abort while the interpreter shuts down
    (../shared/design/FINDINGS.md: 6 of 40 four-rank runs ending with
    ``destroy_process_group``, 0 of 40 this way), so launchers judge a run by the files its ranks
    write, never by exit codes alone."""
    import os
    import sys

    import torch.distributed as dist

    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0 and dist.is_initialized():
        dist.barrier()
    os._exit(code)
