"""Pieces shared by the model families: config validation, weight init and the LM loss.

Initialisation follows GPT-2 (Radford et al., 2019, section 2.3) as nanoGPT and Megatron-LM do:
weights ~ N(0, 0.02), biases zero, norms at identity, and the projections that write into the
residual stream (attention output, MLP down projection) scaled by 1/sqrt(2 * num_layers) so the
residual stream's variance does not grow with depth. Each parameter is drawn from its own
random stream (``autopar.models.init``), so a rank can draw just the shards it holds.
"""

from __future__ import annotations

import math
from enum import StrEnum
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from autopar.core.errors import AutoparError
from autopar.models.init import Constant, InitScheme, Law, Normal, apply_scheme_, unknown_buffer

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


class GPT2Init(nn.Module):
    """The init the zoo's language models share (GPT, and the Llama and MoE decoders): their
    one owner of the GPT-2 laws (the module docstring), one parameter at a time
    (``autopar.models.init``).

    Every ``nn.Linear``/``nn.Embedding`` weight N(0, 0.02), biases zero, LayerNorm/RMSNorm
    weights one; the weights named by ``RESIDUAL`` in every block of ``layers`` -- those that
    write into the residual stream -- N(0, 0.02 / sqrt(2 * num_layers)). A subclass names its
    ``RESIDUAL`` weights, computes its buffers (``_buffer``) and gives the law of any other
    parameter (``_other_law``: the MoE family's stacked expert weights). It has ``config``
    (``num_layers``, ``tie_embeddings``), ``layers``, ``tok_emb`` and ``head``.
    """

    RESIDUAL: ClassVar[tuple[str, ...]] = ()
    """Names, inside one block, of the weights that write into the residual stream."""

    def init_scheme(self) -> InitScheme:
        """This model's ``InitScheme`` (on meta or allocated); a family's ``Family.init``."""
        num_layers = self.config.num_layers
        residual = self._residual_names()
        residual_std = INIT_STD / math.sqrt(2 * num_layers)

        def law_of(name: str) -> Law | None:
            if name in residual:
                return Normal(residual_std)
            owner, _, attr = name.rpartition(".")
            module = self.get_submodule(owner)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                return Normal(INIT_STD) if attr == "weight" else Constant(0.0)
            if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                return Constant(1.0) if attr == "weight" else Constant(0.0)
            return self._other_law(name)

        return InitScheme.of(self, law_of, self._buffer)

    def _residual_names(self) -> set[str]:
        """The parameters drawn with the residual std: ``RESIDUAL`` in every block of
        ``layers`` (a family with blocks elsewhere too adds theirs)."""
        return {f"layers.{i}.{w}" for i in range(len(self.layers)) for w in self.RESIDUAL}

    def _other_law(self, name: str) -> Law | None:
        """The law of a parameter that is no Linear, Embedding or norm weight (none here)."""
        return None

    def _buffer(self, name: str) -> torch.Tensor:
        """The value of buffer ``name``, computed (CPU, whole)."""
        raise unknown_buffer(self, name)

    def init_weights(self, seed: int | None = None) -> None:
        """Initialise in place by ``init_scheme`` (after ``to_empty`` from meta, which unties a
        tied head: it is tied again first); ``seed`` ``None`` takes one from torch's global
        generator."""
        if self.config.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        apply_scheme_(self, self.init_scheme(), seed)
