"""The built-in model zoo: three families (gpt, llama, moe) and the presets in ``presets.py``.

>>> model = build("gpt-1.7b")                      # on the meta device: no memory, no init
>>> model = build("tiny-llama", device="cpu")      # initialised, trains on CPU
>>> model = build("gpt", num_layers=2, hidden_size=64, num_heads=4, vocab_size=256, seq_len=32)

Every model has ``forward(tokens, targets=None)`` (logits, or the mean cross-entropy when
``targets`` is given), ``tok_emb``, ``layers`` (an ``nn.ModuleList`` of the repeated blocks),
``norm_f``, ``head``, ``config`` (the frozen config dataclass) and ``init_weights()`` (to
initialise after ``to_empty`` from meta). The module docstrings of ``gpt``, ``llama`` and ``moe``
list the module names the rest of autopar relies on.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from autopar.core.errors import AutoparError

from .gpt import GPT, Attention, GPTBlock, GPTConfig
from .llama import Llama, LlamaBlock, LlamaConfig
from .moe import MoEBlock, MoEConfig, MoELayer, MoETransformer, expert_capacity
from .presets import PRESETS, Preset

ModelConfig = GPTConfig | LlamaConfig | MoEConfig
"""A config of any family."""

_ConfigClass = type[GPTConfig] | type[LlamaConfig] | type[MoEConfig]
_FAMILIES: dict[str, tuple[_ConfigClass, type[nn.Module]]] = {
    "gpt": (GPTConfig, GPT),
    "llama": (LlamaConfig, Llama),
    "moe": (MoEConfig, MoETransformer),
}


def names() -> list[str]:
    """Preset names, in the zoo's order (GPT by size, Llama 3, Mixtral, tiny)."""
    return list(PRESETS)


def families() -> list[str]:
    """Family names that ``build`` accepts with an explicit shape."""
    return list(_FAMILIES)


def make_config(name: str, **overrides: object) -> ModelConfig:
    """The validated config of preset or family ``name`` with ``overrides`` applied."""
    if name in PRESETS:
        preset = PRESETS[name]
        family, fields = preset.family, {**preset.fields, **overrides}
    elif name in _FAMILIES:
        family, fields = name, dict(overrides)
    else:
        raise AutoparError(
            f"unknown model {name!r}",
            where="name",
            fix=f"use a preset ({', '.join(names())}) or a family ({', '.join(families())})",
        )
    cls = _FAMILIES[family][0]
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key in fields:
        if key not in known:
            raise AutoparError(
                f"{cls.__name__} has no field {key!r}",
                where=f"{name}: {key}",
                fix=f"use only the fields {', '.join(known)}",
            )
    _check_types(cls, fields, name)
    missing = [
        f.name for f in known.values()
        if f.name not in fields
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise AutoparError(
            f"family {family!r} needs the field(s) {', '.join(missing)}",
            where=f"{name}: {missing[0]}",
            fix=f"pass {', '.join(f'{m}=...' for m in missing)}, or start from a preset",
        )
    return cls(**fields)  # type: ignore[arg-type]


def _check_types(cls: _ConfigClass, fields: dict[str, object], name: str) -> None:
    """A given field of the wrong type (``num_layers="abc"``) is the error to report, before
    any field that is missing."""
    import types
    import typing

    hints = typing.get_type_hints(cls)
    for key, value in fields.items():
        hint = hints.get(key)
        allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if value is None and type(None) in allowed:
            continue
        ok = any(_is(value, kind) for kind in allowed)
        if not ok:
            kinds = " or ".join(_kind_name(k) for k in allowed if k is not type(None))
            raise AutoparError(f"{key}={value!r} is not {kinds}", where=f"{name}: {key}",
                               fix=f"pass {key} as {kinds}, e.g. --model-arg {key}="
                                   f"{_example(allowed)}")


def _is(value: object, kind: object) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(kind, type) and issubclass(kind, str):  # a StrEnum: checked by the config
        return isinstance(value, str)
    return True


def _kind_name(kind: object) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number"}
    return names.get(kind, "one of " + ", ".join(repr(m.value) for m in kind)  # type: ignore
                     if isinstance(kind, type) and issubclass(kind, str) else str(kind))


def _example(allowed: tuple) -> str:
    for kind, text in ((bool, "true"), (int, "12"), (float, "0.1")):
        if kind in allowed:
            return text
    return "..."


def from_config(
    config: ModelConfig, device: torch.device | str = "meta", dtype: torch.dtype = torch.float32
) -> nn.Module:
    """Build the model of ``config`` on ``device`` in ``dtype``.

    Parameters are created directly on ``device`` (a ``torch.device`` context), so on meta
    nothing is allocated or initialised and even llama3-405b builds in well under a second. On a
    real device the weights get the GPT-2 init (``init_weights``).
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise AutoparError(f"bad device {device!r}: {err}", where="device",
                           fix="pass 'meta', 'cpu', 'cuda' or a torch.device") from None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise AutoparError(f"dtype must be a floating torch.dtype, got {dtype!r}", where="dtype",
                           fix="pass e.g. torch.float32 or torch.bfloat16")
    model_cls = _FAMILIES[config.family][1]
    with torch.device(device):
        model = model_cls(config)
    model = model.to(dtype=dtype)
    if device.type != "meta":
        model.init_weights()
    return model


def build(
    name: str,
    device: torch.device | str = "meta",
    dtype: torch.dtype = torch.float32,
    **overrides: object,
) -> nn.Module:
    """Build preset or family ``name``; ``overrides`` set config fields (see ``make_config``)."""
    return from_config(make_config(name, **overrides), device=device, dtype=dtype)


def describe(name: str) -> dict[str, object]:
    """``{name, family, params, description, config}`` of a preset, without building it.

    ``params`` is the closed-form count of ``config.num_params()``, equal to the built model's
    ``sum(p.numel() for p in model.parameters())`` (a tied head counted once).
    """
    if name not in PRESETS:
        raise AutoparError(f"unknown preset {name!r}", where="name",
                           fix=f"use one of {', '.join(names())}")
    preset = PRESETS[name]
    cfg = make_config(name)
    return {
        "name": name,
        "family": preset.family,
        "params": cfg.num_params(),
        "description": preset.description,
        "config": dataclasses.asdict(cfg),
    }


__all__ = [
    "Attention",
    "GPT",
    "GPTBlock",
    "GPTConfig",
    "Llama",
    "LlamaBlock",
    "LlamaConfig",
    "MoEBlock",
    "MoEConfig",
    "MoELayer",
    "MoETransformer",
    "ModelConfig",
    "PRESETS",
    "Preset",
    "build",
    "make_config",
    "describe",
    "expert_capacity",
    "families",
    "from_config",
    "names",
]
