"""Load a user's model for the command line: ``path/to/file.py:factory`` or ``package.module:factory``.

The factory is called with no arguments, under ``torch.device("meta")`` so that a large model
costs no memory, and must return an ``nn.Module``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn as nn

from autopar.costmodel.errors import AutoparError


def is_user_model(spec: str) -> bool:
    return ":" in spec


def load_user_model(spec: str) -> nn.Module:
    """Import ``spec``'s module and call its factory on the meta device."""
    source, _, attr = spec.rpartition(":")
    fix = "write --model path/to/file.py:make_model or --model package.module:make_model"
    if not source or not attr:
        raise AutoparError(f"--model {spec!r} is not FILE.py:FACTORY or MODULE:FACTORY",
                           where="--model", fix=fix)
    if source.endswith(".py"):
        path = Path(source)
        if not path.exists():
            raise AutoparError(f"model file {source} does not exist", where="--model", fix=fix)
        mod_spec = importlib.util.spec_from_file_location(f"autopar_user_{path.stem}", path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[mod_spec.name] = module
        mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(source)
        except ImportError as err:
            raise AutoparError(f"cannot import {source!r}: {err}", where="--model", fix=fix) from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise AutoparError(f"{source} has no callable {attr!r}", where="--model", fix=fix)
    with torch.device("meta"):
        model = factory()
    if not isinstance(model, nn.Module):
        raise AutoparError(f"{spec} returned a {type(model).__name__}, not an nn.Module",
                           where="--model", fix="return the model from the factory")
    return model
