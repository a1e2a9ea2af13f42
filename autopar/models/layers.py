"""Pieces shared by the model families: config validation, weight init and the LM loss.

Initialisation follows GPT-2 (Radford et al., 2019, section 2.3) as nanoGPT and Megatron-LM do:
weights ~ N(0, 0.02), biases zero, norms at identity, and the projections that write into the
residual stream (attention output, MLP down projection) scaled by 1/sqrt(2 * num_layers) so the
residual stream's variance does not grow with depth.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import StrEnum

import torch
import torch.nn.functional as F
from torch import nn

from autopar.core.errors import AutoparError

INIT_STD = 0.02
"""Standard deviation of the normal init of every weight matrix and embedding (GPT-2)."""


def check_positive_int(config: object, name: str) -> None:
    """Raise ``AutoparError`` naming ``name`` unless ``config.name`` is an int >= 1."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AutoparError(
            f"{name} must be an integer >= 1, got {value!r}",
            where=f"{type(config).__name__}.{name}",
            fix=f"pass {name} as a positive integer",
        )


def check_positive_float(config: object, name: str) -> None:
    """Raise ``AutoparError`` naming ``name`` unless ``config.name`` is a finite number > 0."""
    value = getattr(config, name)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise AutoparError(
            f"{name} must be a finite number > 0, got {value!r}",
            where=f"{type(config).__name__}.{name}",
            fix=f"pass {name} as a positive number",
        )


def check_bool(config: object, name: str) -> None:
    """Raise ``AutoparError`` naming ``name`` unless ``config.name`` is a bool."""
    value = getattr(config, name)
    if not isinstance(value, bool):
        raise AutoparError(
            f"{name} must be True or False, got {value!r}",
            where=f"{type(config).__name__}.{name}",
            fix=f"pass {name}=True or {name}=False",
        )


def check_divides(config: object, divisor: str, dividend: str) -> None:
    """Raise ``AutoparError`` naming both fields unless ``divisor`` divides ``dividend``."""
    a, b = getattr(config, divisor), getattr(config, dividend)
    if b % a != 0:
        raise AutoparError(
            f"{divisor}={a} does not divide {dividend}={b}",
            where=f"{type(config).__name__}.{divisor}",
            fix=f"choose {divisor} so that {dividend} is a multiple of it",
        )


def coerce_choice(config: object, name: str, enum: type[StrEnum]) -> None:
    """Replace the string in frozen ``config.name`` by the ``enum`` member, or raise."""
    value = getattr(config, name)
    try:
        member = enum(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in enum)
        raise AutoparError(
            f"{name}={value!r} is not one of {allowed}",
            where=f"{type(config).__name__}.{name}",
            fix=f"use one of {allowed}",
        ) from None
    object.__setattr__(config, name, member)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all (batch, seq) positions; ``targets`` are int64."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


@torch.no_grad()
def init_transformer_(
    model: nn.Module, residual_weights: Iterable[torch.Tensor], num_layers: int
) -> None:
    """GPT-2 init of every ``nn.Linear``/``nn.Embedding``/norm in ``model``, in place.

    ``residual_weights`` are the weights that write into the residual stream; they get the
    std 0.02 / sqrt(2 * num_layers) of GPT-2. Weights shared by two modules (a tied head) are
    drawn once, since a second draw would only overwrite the first with the same law.
    """
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            bias = getattr(module, "bias", None)
            if bias is not None:
                nn.init.zeros_(bias)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            module.reset_parameters()
    residual_std = INIT_STD / math.sqrt(2 * num_layers)
    for weight in residual_weights:
        nn.init.normal_(weight, mean=0.0, std=residual_std)
