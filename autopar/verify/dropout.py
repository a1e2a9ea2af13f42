"""Training-time noise in ``autopar verify``: dropout and router jitter, switched off on both
sides, and the report says so.

A sharded run and one process cannot draw the same random numbers (each rank holds another
part of the batch, of the weights, of the sequence, and its own random stream), so with noise
on the comparison measures the draws, not the program: transformers' GPT-2 config has
``resid_pdrop = embd_pdrop = attn_pdrop = 0.1`` by default and failed verify on any plan
(loss 2.2e-3 relative off on dp 2), and Mixtral's ``router_jitter_noise`` (each MoE block
multiplies its input by uniform noise while training) failed dp 2 the same way. ``verify``
therefore rebuilds the model with every such field of its config at 0 -- the zoo's
``dropout``, a transformers config's ``*dropout*``/``*pdrop`` and ``*jitter*`` fields,
defaults included -- on the ranks and in the reference alike, and ``VerifyResult`` lists what
it switched off. The plan itself is unchanged: training keeps the model's noise, each rank
drawing its own, as each process of any data-parallel run does. A model whose dropout is not a
config field (a factory's ``nn.Dropout``) is refused up front with what to change.
"""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from enum import Enum

from torch import nn

from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec


def _is_dropout_field(key: str, value: object) -> bool:
    """A config field that sets training-time noise: a dropout probability or a jitter."""
    key = key.lower()
    named = "dropout" in key or key.endswith("pdrop") or "jitter" in key
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return named and number and value > 0


def _config_fields(model: nn.Module) -> dict[str, object]:
    """The model's config as a dict, its defaults included (a zoo dataclass or a transformers
    ``PretrainedConfig``); empty for a model without one."""
    config = getattr(model, "config", None)
    if is_dataclass(config) and not isinstance(config, type):
        return {k: (v.value if isinstance(v, Enum) else v) for k, v in asdict(config).items()}
    to_dict = getattr(config, "to_dict", None)
    return to_dict() if callable(to_dict) else {}


def dropout_fields(model: nn.Module) -> dict[str, float]:
    """The config fields of ``model`` that set training-time noise above 0 (a dropout
    probability, a router jitter), by name."""
    return {k: float(v) for k, v in sorted(_config_fields(model).items())  # type: ignore[arg-type]
            if _is_dropout_field(k, v)}


def _dropout_modules(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules()
            if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]


def without_dropout(spec: ModelSpec) -> tuple[ModelSpec, dict[str, float]]:
    """``spec`` with every dropout probability of its config at 0, and the fields it changed
    (empty: ``spec`` itself, it has no dropout). ``AutoparError`` when the model has dropout
    that is no config field of a zoo or transformers spec."""
    model = spec.build("meta")
    fields = dropout_fields(model)
    zeros = {k: 0.0 for k in fields}
    if fields and spec.name:
        spec = ModelSpec(name=spec.name, overrides={**spec.overrides, **zeros})
    elif fields and spec.transformers is not None:
        spec = ModelSpec.transformers_config(spec.transformers["architecture"],
                                             {**spec.transformers["config"], **zeros})
    left = _dropout_modules(spec.build("meta") if fields and not spec.factory else model)
    if left or (fields and spec.factory):
        where = ", ".join(left[:4]) + (" ..." if len(left) > 4 else "") if left else \
            ", ".join(fields)
        raise AutoparError(
            "the model trains with dropout, so a sharded run and one process draw different "
            "random masks and verify cannot compare them", where=f"{spec.label}: {where}",
            fix="build the model with its dropout probabilities at 0 for verify (a factory's "
                "nn.Dropout(p=0.0), or a config field: --model-arg NAME=0)")
    return spec, fields
