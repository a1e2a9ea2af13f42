"""``ModelSpec``: how to build a model again, as plain JSON.

A plan records the spec of the model it was made for (``Plan.model_spec``), so that
``autopar verify --plan`` and ``autopar export`` rebuild that model -- with its overrides -- on
every rank, and the reference process of ``verify`` builds the same one. Four kinds:

* **zoo**: a preset with field overrides (``tiny-llama`` + ``{"seq_len": 64}``), or a family
  with its fields (``gpt`` + ``{"num_layers": 2, ...}``): ``autopar.models.build``;
* **factory**: ``path/to/file.py:make`` or ``package.module:make``, called with no arguments
  under the target device (``torch.device("meta")`` costs no memory). A relative file path in a
  plan or model file is relative to that file's folder (``resolved``); ``export`` copies the
  file into the folder it writes;
* **transformers**: a transformers architecture and its config fields
  (``{"architecture": "Qwen2ForCausalLM", "config": {...}}``), built with the architecture's
  constructor from ``config_class.from_dict``: no weights are downloaded. On the command line
  ``--model DIR`` (a folder holding a ``config.json``, as ``save_pretrained`` writes it) or
  ``--model config.json`` gives one, and a model family's shorthand another (``hf-llama``, a
  tiny ``LlamaForCausalLM``: ``autopar/models/hf_llama/``).

The weights a spec builds come from ``seed``. A model whose family has an init scheme (the zoo,
``hf-llama``) draws each parameter from its own stream under ``seed`` (``autopar.models.init``),
so a rank of a sharded program can draw just the slices it holds and equal this one-process
build bit for bit (``passes/materialize.py``); a transformers model is built on meta and then
initialised that way. Any other model (a factory's, a transformers architecture of no family)
is built after ``torch.manual_seed(seed)`` with its own init.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autopar.core.errors import AutoparError

DROPPED_CONFIG_KEYS = ("transformers_version",)
"""Config keys not recorded: they describe the writer, not the model, and would make two plans
of one model differ by the library version."""


BEHAVIOUR: dict[str, Callable[..., Any]] = {}
"""What a spec does with the models -- ``parse``, ``of``, ``zoo``, ``same_model``, ``build`` and
``model_fix`` (what ``--model`` takes) -- owned by ``autopar.models.spec`` and bound by
``autopar/__init__.py``: the core holds the spec as data and imports nothing above it."""


def _owned(name: str) -> Callable[..., Any]:
    return BEHAVIOUR[name]


def _model_fix() -> str:
    return _owned("model_fix")()


@dataclass(frozen=True)
class ModelSpec:
    """A model to build on every rank; exactly one of ``name``, ``factory``, ``transformers``."""

    name: str = ""
    """Zoo preset or family (``autopar models``)."""
    overrides: Mapping[str, Any] = field(default_factory=dict)
    """Config fields of the zoo model (``num_layers``...)."""
    factory: str = ""
    """``FILE.py:FACTORY`` or ``package.module:FACTORY``."""
    transformers: Mapping[str, Any] | None = None
    """``{"architecture": class name in the transformers package, "config": its fields}``."""

    def __post_init__(self) -> None:
        given = [k for k in ("name", "factory", "transformers") if getattr(self, k)]
        if len(given) != 1:
            raise AutoparError(
                f"a model spec names exactly one of a zoo model, a factory or a transformers "
                f"config; this one gives {', '.join(given) or 'none'}", where="model spec",
                fix=_model_fix())
        if self.overrides and not self.name:
            raise AutoparError("model field overrides apply to a zoo model only",
                               where="model spec overrides",
                               fix="set the fields in the factory or in the transformers config")
        if self.transformers is not None:
            t = self.transformers
            if not isinstance(t, Mapping) or not isinstance(t.get("architecture"), str) \
                    or not isinstance(t.get("config"), Mapping):
                raise AutoparError("a transformers spec is {\"architecture\": NAME, \"config\": "
                                   "{...}}", where="model spec transformers", fix=_model_fix())

    # ----- construction -----
    @classmethod
    def transformers_config(cls, architecture: str, config: Mapping[str, Any]) -> ModelSpec:
        """A transformers ``architecture`` (e.g. ``"Qwen2ForCausalLM"``) made from ``config``."""
        fields = {k: v for k, v in dict(config).items() if k not in DROPPED_CONFIG_KEYS}
        return cls(transformers={"architecture": architecture, "config": fields})

    @classmethod
    def parse(cls, model: str, overrides: Mapping[str, Any] | None = None) -> ModelSpec:
        """The spec of a ``--model`` argument with its ``--model-arg`` overrides."""
        return _owned("parse")(model, overrides)

    @classmethod
    def of(cls, model: object) -> ModelSpec | None:
        """The spec that rebuilds ``model``: a zoo model's family and config, a transformers
        model's architecture and config; ``None`` for anything else."""
        return _owned("of")(model)

    @classmethod
    def zoo(cls, name: str) -> ModelSpec | None:
        """The spec of the zoo preset or family ``name``, or ``None`` when the zoo has none."""
        return _owned("zoo")(name)

    def same_model(self, other: ModelSpec) -> bool:
        """Whether ``other`` builds the same model: zoo specs by their resolved config (a preset
        with overrides and its family with every field are one model), others by equality."""
        return _owned("same_model")(self, other)

    # ----- JSON -----
    def to_dict(self) -> dict[str, Any]:
        if self.name:
            return {"name": self.name, "overrides": dict(self.overrides)}
        if self.factory:
            return {"factory": self.factory}
        return {"transformers": {"architecture": self.transformers["architecture"],
                                 "config": dict(self.transformers["config"])}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "model spec") -> ModelSpec:
        """Inverse of ``to_dict``; also reads the ``transformers_llama`` form of version 1."""
        if not isinstance(d, Mapping):
            raise AutoparError(f"a model spec is a JSON object, not {type(d).__name__}",
                               where=where, fix=_model_fix())
        if d.get("transformers_llama"):
            return cls.transformers_config("LlamaForCausalLM", d["transformers_llama"])
        known = {"name", "overrides", "factory", "transformers", "transformers_llama"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise AutoparError(f"unknown model spec key(s) {', '.join(unknown)}", where=where,
                               fix=f"use {', '.join(sorted(known - {'transformers_llama'}))}")
        return cls(name=d.get("name") or "", overrides=dict(d.get("overrides") or {}),
                   factory=d.get("factory") or "", transformers=d.get("transformers"))

    def resolved(self, folder: str | Path) -> ModelSpec:
        """A factory file path relative to ``folder`` (where the JSON holding it lies) made
        absolute; any other spec as it is."""
        source, _, attr = self.factory.rpartition(":")
        if not source.endswith(".py") or Path(source).is_absolute():
            return self
        return ModelSpec(factory=f"{(Path(folder) / source).resolve()}:{attr}")

    @property
    def file(self) -> Path | None:
        """The factory's file, for a ``FILE.py:FACTORY`` spec."""
        source = self.factory.rpartition(":")[0]
        return Path(source) if source.endswith(".py") else None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        if self.factory:
            source, _, attr = self.factory.rpartition(":")
            return f"{Path(source).name}:{attr}" if source.endswith(".py") else self.factory
        return str(self.transformers["architecture"])

    # ----- building -----
    def build(self, device: Any = "cpu", seed: int = 0):
        """The model with its weights drawn from ``seed`` (on meta: shapes only; see the module
        docstring for how)."""
        return _owned("build")(self, device, seed)
