"""What a ``ModelSpec`` (``autopar.core.model_spec``, plain data) does with the models: read a
``--model`` argument into one (``parse``), find the spec of a built model (``of``), tell whether
two specs build one model (``same_model``), and build it (``build``).

The core holds the spec as data and imports nothing above it; its methods of the same names
call these (bound by ``autopar/__init__.py``, as the plan's report is). The kinds of spec and how
their weights are drawn are in ``autopar.core.model_spec``'s docstring.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from autopar.core.errors import AutoparError
from autopar.core.model_spec import DROPPED_CONFIG_KEYS, ModelSpec


def model_fix() -> str:
    """What ``--model`` takes, with the model families' shorthands (``hf-llama``)."""
    from autopar.models.family import shorthands

    named = ", ".join(shorthands())
    return ("give --model a zoo preset or family (autopar models), FILE.py:FACTORY, "
            "package.module:FACTORY, a transformers config (a folder with config.json, or the "
            "file)" + (f", or {named}" if named else ""))


def parse(model: str, overrides: Mapping[str, Any] | None = None) -> ModelSpec:
    """The spec of a ``--model`` argument with its ``--model-arg`` overrides."""
    overrides = dict(overrides or {})
    from autopar.models.family import shorthand_spec

    named = shorthand_spec(model, overrides)  # a family's shorthand: hf-llama
    if named is not None:
        return named
    config_file = _transformers_config_file(model)
    if config_file is not None:
        return _from_config_file(config_file, overrides)
    if ":" in model:
        if overrides:
            raise AutoparError(
                f"--model-arg {', '.join(overrides)} given with the factory {model}",
                where="--model-arg", fix="set the fields inside the factory; --model-arg "
                "applies to zoo models and transformers configs")
        source, _, attr = model.rpartition(":")
        if not source or not attr:
            raise AutoparError(f"--model {model!r} is not FILE.py:FACTORY or "
                               "MODULE:FACTORY", where="--model", fix=model_fix())
        if source.endswith(".py"):
            path = Path(source).expanduser()
            if not path.is_file():
                raise AutoparError(f"model file {source} does not exist", where="--model",
                                   fix="check the path (relative to the current folder)")
            model = f"{path.resolve()}:{attr}"
        return ModelSpec(factory=model)
    _refuse_path(model)
    return ModelSpec(name=model, overrides=overrides)


def of(model: object) -> ModelSpec | None:
    """The spec that rebuilds ``model``: a zoo model's family and config, a transformers
    model's architecture and config; ``None`` for anything else."""
    from autopar.models.family import config_family

    config = getattr(model, "config", None)
    if config_family(config) is not None:
        from dataclasses import asdict

        from autopar import models

        for preset in models.names():  # a preset's own shape: named as such
            if models.PRESETS[preset].family == config.family \
                    and models.make_config(preset) == config:
                return ModelSpec(name=preset)
        fields = {k: (v.value if isinstance(v, Enum) else v)
                  for k, v in asdict(config).items()}
        return ModelSpec(name=config.family, overrides=fields)
    transformers = sys.modules.get("transformers")
    if transformers is not None and isinstance(model, transformers.PreTrainedModel):
        name = type(model).__name__
        if getattr(transformers, name, None) is type(model):
            return ModelSpec.transformers_config(name, model.config.to_diff_dict())
    return None


def zoo(name: str) -> ModelSpec | None:
    """The spec of the zoo preset or family ``name``, or ``None`` when the zoo has none."""
    from autopar import models

    return ModelSpec(name) if name in models.names() else None


def same_model(self: ModelSpec, other: ModelSpec) -> bool:
    """Whether ``other`` builds the same model: zoo specs by their resolved config (a preset
    with overrides and its family with every field are one model), others by equality."""
    if self.name and other.name:
        from autopar import models

        try:
            return models.make_config(self.name, **self.overrides) == \
                models.make_config(other.name, **other.overrides)
        except AutoparError:
            return False
    if self.transformers is not None and other.transformers is not None:
        return _canonical_config(self.transformers) == _canonical_config(other.transformers)
    return self.to_dict() == other.to_dict()


def build(self: ModelSpec, device: Any = "cpu", seed: int = 0):
    """The model with its weights drawn from ``seed`` (on meta: shapes only; see the module
    docstring for how)."""
    import torch

    torch.manual_seed(seed)
    if self.name:
        from autopar import models

        return models.build(self.name, device=device, seed=seed, **self.overrides)
    if self.factory:
        return _call_factory(self.factory, device)
    return _build_transformers(self.transformers, device, seed)


def _refuse_path(model: str) -> None:
    """``AutoparError`` for a ``--model`` that reads as a path but names no model: a ``.py``
    file without its ``:FACTORY`` (the functions it defines listed), a file or folder that
    does not exist. A zoo name never holds a path separator or ends in ``.py``."""
    import ast
    import os

    path = Path(model).expanduser()
    if model.endswith(".py"):
        if not path.is_file():
            raise AutoparError(f"model file {model} does not exist", where="--model",
                               fix="check the path (relative to the current folder), and name "
                                   "the function that returns the model: FILE.py:FACTORY")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
            functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
                         and len(n.args.args) + len(n.args.posonlyargs) == len(n.args.defaults)
                         and all(d is not None for d in n.args.kw_defaults)]
        except (OSError, SyntaxError, ValueError):
            functions = []
        listed = (f"; {path.name} defines {', '.join(functions[:8])}, callable with no "
                  "arguments" if functions else "")
        raise AutoparError(f"{model} names a file but not the function in it that builds the "
                           f"model{listed}", where="--model",
                           fix=f"pass {model}:FACTORY, FACTORY a function of no arguments "
                               "returning the nn.Module"
                               + (f" (e.g. {model}:{functions[0]})" if functions else ""))
    if os.sep in model or "/" in model or model.startswith(("~", ".")):
        raise AutoparError(f"{model} is neither a file nor a folder that exists", where="--model",
                           fix="check the path (relative to the current folder): a folder "
                               "holding a transformers config.json, a config .json file, or "
                               "FILE.py:FACTORY")


def _transformers_config_file(model: str) -> Path | None:
    """The ``config.json`` ``model`` names: a folder holding one, or a ``.json`` file."""
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / "config.json").is_file():
            return path / "config.json"
        raise AutoparError(f"{model} is a folder without a config.json", where="--model",
                           fix="pass a transformers model folder (save_pretrained writes "
                               "config.json), or " + model_fix())
    if model.endswith(".json"):
        if not path.is_file():
            raise AutoparError(f"config file {model} does not exist", where="--model",
                               fix="check the path (relative to the current folder)")
        return path
    return None


def _from_config_file(path: Path, overrides: dict[str, Any]) -> ModelSpec:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise AutoparError(f"cannot read {path} as JSON: {err}", where="--model",
                           fix="pass a transformers config.json") from None
    archs = config.get("architectures") if isinstance(config, dict) else None
    if not archs or not isinstance(archs, list):
        raise AutoparError(f"{path} names no architecture (no \"architectures\" list)",
                           where=f"{path}: architectures",
                           fix="add e.g. \"architectures\": [\"Qwen2ForCausalLM\"], as "
                               "save_pretrained writes it")
    if overrides:
        overrides = _config_overrides(str(archs[0]), config, overrides)
    return ModelSpec.transformers_config(str(archs[0]), {**config, **overrides})


def _config_overrides(architecture: str, config: Mapping[str, Any],
                      overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``--model-arg`` ``overrides`` of a transformers config, each checked against the fields
    its config class knows (a name it maps, as GPT-2's ``num_hidden_layers`` -> ``n_layer``,
    written under the field's own name) and the type of that field's value: transformers takes
    any key silently, so ``num_layers=4`` on a config whose field is ``num_hidden_layers``
    would plan the model unchanged."""
    import difflib

    cls, config_class = _transformers_classes(architecture, config)
    defaults = config_class().to_dict()
    aliases = dict(getattr(config_class, "attribute_map", {}) or {})
    known = {**defaults, **config}
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        field_name = aliases.get(key, key)
        where = f"--model-arg {key}"
        if field_name not in known:
            near = difflib.get_close_matches(key, [*known, *aliases], n=3, cutoff=0.5)
            raise AutoparError(
                f"{config_class.__name__} (the config of {architecture}) has no field {key!r}, "
                "so transformers would keep it as an unused attribute and build the model "
                "unchanged", where=where,
                fix=(f"did you mean {' or '.join(near)}? " if near else "")
                + "name a field of the config (its config.json lists them)")
        current = known[field_name]
        if current is not None and value is not None and not _same_kind(current, value):
            raise AutoparError(
                f"{config_class.__name__}.{field_name} holds {_kind(current)} ({current!r} in "
                f"this config), not {_kind(value)} ({value!r})",
                where=where, fix=f"give {key} {_kind(current)} value")
        out[field_name] = value
    return out


def _kind(value: object) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _same_kind(current: object, value: object) -> bool:
    """Whether ``value`` may replace a config field holding ``current`` (an int where a float
    is, the JSON way)."""
    if isinstance(current, bool) or isinstance(value, bool):
        return isinstance(current, bool) and isinstance(value, bool)
    if isinstance(current, (int, float)):
        return isinstance(value, (int, float))
    return isinstance(value, type(current))


def _transformers_classes(architecture: str, config: Mapping[str, Any]) -> tuple[type, type]:
    """(model class, config class) of a transformers ``architecture``: the package's own class
    of that name, else -- an architecture whose code lives on the Hub (``auto_map``, e.g.
    ``InternLM3ForCausalLM``) while transformers maps its ``model_type`` to one of its own
    classes (``internlm3`` -> ``LlamaForCausalLM``) -- the class transformers' Auto mapping of
    that task gives, as ``AutoModelFor*.from_config`` builds it. ``AutoparError`` for neither."""
    try:
        import transformers
    except ImportError:
        raise AutoparError("the model is a transformers model and transformers is not "
                           "installed", where="model spec",
                           fix="pip install transformers") from None
    cls = getattr(transformers, architecture, None)
    if cls is not None and hasattr(cls, "config_class"):
        return cls, cls.config_class
    model_type = config.get("model_type")
    mapped = _auto_mapped(architecture, model_type) if isinstance(model_type, str) else None
    if mapped is not None:
        return mapped
    raise AutoparError(f"transformers {transformers.__version__} has no model class "
                       f"{architecture!r}" + (f" and maps no class of that kind to model_type "
                                              f"{model_type!r}" if model_type else ""),
                       where="model spec architecture",
                       fix="name a class of the transformers package, e.g. LlamaForCausalLM, "
                           "or upgrade transformers")


_AUTO_TASKS = (("ForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
               ("ForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
               ("ForConditionalGeneration", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"))
"""An architecture's name suffix -> the transformers Auto mapping of that task."""


def _auto_mapped(architecture: str, model_type: str) -> tuple[type, type] | None:
    import transformers
    from transformers.models.auto import configuration_auto, modeling_auto

    config_name = configuration_auto.CONFIG_MAPPING_NAMES.get(model_type)
    for suffix, mapping in _AUTO_TASKS:
        name = getattr(modeling_auto, mapping, {}).get(model_type)
        if architecture.endswith(suffix) and name and config_name:
            cls = getattr(transformers, name, None)
            config_class = getattr(transformers, config_name, None)
            if cls is not None and config_class is not None:
                return cls, config_class
    return None


_LOADED: dict[str, Any] = {}
"""Model files imported so far, by resolved path: each is imported once per process."""


def _call_factory(factory: str, device: Any):
    from torch import nn

    source, _, attr = factory.rpartition(":")
    where = f"the model factory {factory}"
    if source.endswith(".py"):
        path = Path(source)
        if not path.is_file():
            raise AutoparError(f"model file {source} does not exist", where=where,
                               fix="check the path; a plan records it as it was planned, an "
                                   "exported folder holds a copy next to its train.py")
        module = _LOADED.get(str(path.resolve()))
        if module is None:
            name = f"autopar_model_{path.stem}"
            while name in sys.modules:  # another file of the same name: a new module name
                name += "_"
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise AutoparError(f"cannot load {source} as Python", where=where,
                                   fix="pass a .py file")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as err:  # noqa: BLE001 - the user's file, reported in one line
                del sys.modules[name]
                raise _raised(err, f"importing {source}", where) from err
            _LOADED[str(path.resolve())] = module
    else:
        try:
            module = importlib.import_module(source)
        except ImportError as err:
            raise AutoparError(f"cannot import {source!r}: {err}", where=where,
                               fix="install the package or pass FILE.py:FACTORY") from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise AutoparError(f"{source} has no callable {attr!r}", where=where,
                           fix="name a function that returns the nn.Module")
    from autopar.models.init import building_on

    try:
        with building_on(device):  # on meta without the constructors' random fills
            model = fn()
    except Exception as err:  # noqa: BLE001 - the user's factory, reported in one line
        raise _raised(err, f"{attr}()", where) from err
    if not isinstance(model, nn.Module):
        raise AutoparError(f"{attr}() returned a {type(model).__name__}, not an nn.Module",
                           where=where, fix="return the model from the factory")
    return model


def _first_line(err: BaseException) -> str:
    """The message of ``err`` on one line (transformers' validators put the reason on the
    second: "Class validation error ...:\n ValueError: The hidden size ...")."""
    return " ".join(line.strip() for line in str(err).strip().splitlines())[:400]


def _raised(err: Exception, doing: str, where: str) -> AutoparError:
    import traceback

    frames = traceback.extract_tb(err.__traceback__)
    line = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return AutoparError(f"{doing} raised {type(err).__name__}: {err}{line}", where=where,
                        fix="fix the model code there (run it in Python to see the whole "
                            "traceback, or pass --debug)")


def _canonical_config(spec: Mapping[str, Any]) -> tuple[str, dict] | None:
    """(architecture, the config's non-default fields) as transformers reads the spec: two
    specs of one config, one listing the defaults and one not, compare equal."""
    try:
        _, config_class = _transformers_classes(spec["architecture"], spec["config"])
        config = config_class.from_dict(dict(spec["config"])).to_diff_dict()
    except Exception:  # noqa: BLE001 - an unbuildable spec equals nothing
        return None
    return spec["architecture"], {k: v for k, v in config.items()
                                  if k not in DROPPED_CONFIG_KEYS}


def _build_transformers(spec: Mapping[str, Any], device: Any, seed: int):
    import torch

    from autopar.models.init import building_on

    name = spec["architecture"]
    cls, config_class = _transformers_classes(name, spec["config"])
    try:
        config = config_class.from_dict(dict(spec["config"]))
        with building_on("meta"):
            model = cls(config)
    except Exception as err:  # noqa: BLE001 - transformers' own checks raise many kinds
        raise AutoparError(f"cannot build {name} from its config: {type(err).__name__}: "
                           f"{_first_line(err)}", where="model spec config",
                           fix="check the config fields against the architecture (the "
                               "message names the one transformers refused)") from None
    if torch.device(device).type == "meta":
        return model
    from autopar.models.init import apply_scheme_, keeping_parameters, scheme_of

    scheme = scheme_of(model)
    if scheme is None:  # no family's scheme: transformers' own init, on the global generator
        torch.manual_seed(seed)
        with torch.device(device):
            return cls(config)
    with keeping_parameters():  # a tied lm_head stays tied
        model.to_empty(device=device)
    apply_scheme_(model, scheme, seed)
    return model
