"""The built-in model zoo and the model families the passes know, one folder each.

>>> model = build("gpt-1.7b")                      # on the meta device: no memory, no init
>>> model = build("tiny-llama", device="cpu")      # initialised, trains on CPU
>>> model = build("gpt", num_layers=2, hidden_size=64, num_heads=4, vocab_size=256, seq_len=32)
>>> family_of(model).name
'gpt'

A family is a folder ``<family>/`` holding its model code, its presets and its ``Family``
(``family.py``): how to recognise its models, where their parts are for the passes and what the
fusion pass must know of its module classes. The zoo families are ``gpt``, ``llama`` and
``moe``; ``hf_llama`` describes transformers' Llama-style causal LMs, ``hf_moe`` their
mixture-of-experts decoders (Qwen2-MoE, Qwen3-MoE, Mixtral). Each folder registers its
family when imported, and this package imports every folder it finds, so adding a family, or a
transformers architecture, touches its own folder only. ``layers.py`` holds the building blocks
the zoo families share.

Every zoo model has ``forward(tokens, targets=None)`` (logits, or the mean cross-entropy when
``targets`` is given), ``tok_emb``, ``layers`` (an ``nn.ModuleList`` of the repeated blocks),
``norm_f``, ``head``, ``config`` (the frozen config dataclass), ``init_scheme()`` (the law of
each parameter, drawn one at a time from its own stream: ``init.py``) and
``init_weights(seed)`` (to initialise after ``to_empty`` from meta). The docstrings of
``gpt/model.py``, ``llama/model.py`` and ``moe/model.py`` list the module names the rest of
autopar relies on.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

import torch
from torch import nn

from autopar.core.errors import AutoparError
from autopar.models.family import (
    PRESETS,
    Family,
    family_named,
    family_of,
    prepare_training,
    register,
    registered,
    unregister,
)
from autopar.models.init import building_on, initialise_
from autopar.models.parts import ModelParts
from autopar.models.presets import Preset


def _import_families() -> None:
    """Import every family folder (sub-package) of this package: each registers itself."""
    for found in pkgutil.iter_modules(__path__):
        if found.ispkg:
            importlib.import_module(f"{__name__}.{found.name}")


_import_families()

# the zoo's classes, importable from here as before the families had folders
from autopar.models.gpt import GPT, Attention, GPTBlock, GPTConfig  # noqa: E402
from autopar.models.llama import Llama, LlamaBlock, LlamaConfig  # noqa: E402
from autopar.models.moe import (  # noqa: E402
    MoEBlock,
    MoEConfig,
    MoELayer,
    MoETransformer,
    expert_capacity,
    moe_layers,
    set_aux_loss_grad_scale,
)

ModelConfig = GPTConfig | LlamaConfig | MoEConfig
"""A config of any zoo family."""


def names() -> list[str]:
    """Preset names, in the zoo's order: families by name, each by size (GPT, Llama 3,
    Mixtral), then the tiny test shapes."""
    return list(PRESETS)


def families() -> list[str]:
    """Family names that ``build`` accepts with an explicit shape (those with a config class),
    by name."""
    return [f.name for f in registered() if f.config_class is not None]


def make_config(name: str, **overrides: object) -> ModelConfig:
    """The validated config of preset or family ``name`` with ``overrides`` applied."""
    if name in PRESETS:
        preset = PRESETS[name]
        family, fields = preset.family, {**preset.fields, **overrides}
    elif name in families():
        family, fields = name, dict(overrides)
    else:
        raise AutoparError(
            f"unknown model {name!r}",
            where="name",
            fix=f"use a preset ({', '.join(names())}) or a family ({', '.join(families())})",
        )
    cls = family_named(family).config_class
    assert cls is not None  # a preset's family, or one of families(): both have one
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


def _check_types(cls: type, fields: dict[str, object], name: str) -> None:
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
    config: ModelConfig, device: torch.device | str = "meta", dtype: torch.dtype = torch.float32,
    seed: int | None = None,
) -> nn.Module:
    """Build the model of ``config`` on ``device`` in ``dtype``.

    Parameters are created directly on ``device`` (a ``torch.device`` context), so on meta
    nothing is allocated or initialised and even llama3-405b builds in well under a second. On a
    real device the weights get the family's init, each parameter drawn from its own stream
    under ``seed`` (``autopar.models.init``; ``None``: a seed drawn from torch's global
    generator, so ``torch.manual_seed`` before the build decides the weights).
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise AutoparError(f"bad device {device!r}: {err}", where="device",
                           fix="pass 'meta', 'cpu', 'cuda' or a torch.device") from None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise AutoparError(f"dtype must be a floating torch.dtype, got {dtype!r}", where="dtype",
                           fix="pass e.g. torch.float32 or torch.bfloat16")
    model_cls = family_named(config.family).model_class
    with building_on(device):
        model = model_cls(config)
    model = model.to(dtype=dtype)
    if device.type != "meta":
        initialise_(model, family_named(config.family), seed)
    return model


def build(
    name: str,
    device: torch.device | str = "meta",
    dtype: torch.dtype = torch.float32,
    seed: int | None = None,
    **overrides: object,
) -> nn.Module:
    """Build preset or family ``name``; ``overrides`` set config fields (see ``make_config``);
    ``seed`` draws the weights on a real device (see ``from_config``)."""
    return from_config(make_config(name, **overrides), device=device, dtype=dtype, seed=seed)


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
    "Family",
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
    "ModelParts",
    "PRESETS",
    "Preset",
    "build",
    "make_config",
    "describe",
    "expert_capacity",
    "moe_layers",
    "prepare_training",
    "set_aux_loss_grad_scale",
    "families",
    "family_named",
    "family_of",
    "from_config",
    "names",
    "register",
    "registered",
    "unregister",
]
