"""The traced graph of a model kept on disk, so a second ``autopar plan`` of it skips tracing.

Tracing a large model on the meta device (torch.fx, then the shape propagation) takes seconds
-- about 2 s of CPU for DeepSeek-V3 on the 2-core CI machine -- and gives the same ``GraphIR``
every time for the same model, batch and sequence length. ``traced`` stores it (without the
``torch.fx.GraphModule``, which nothing after the trace reads) as a pickle under
``cache_dir()``, named by a digest of everything the trace reads:

* the model as built: every module's class and plain attributes (ints, strings, tuples, a
  dataclass config as the zoo's, a transformers ``config``: a field such as a norm's epsilon
  reaches the graph without changing a shape), every parameter's and buffer's name, shape and
  dtype;
* the source of every module class the model uses, outside torch (a factory file edited
  between two plans is a new model);
* autopar's own source (the tracer and the op rules that count FLOPs and bytes) and torch's
  version;
* the micro-batch and sequence length traced.

A stored file that cannot be read (truncated, written by an incompatible Python) is traced
again and overwritten. ``AUTOPAR_CACHE_DIR`` moves the cache (default
``$XDG_CACHE_HOME/autopar`` or ``~/.cache/autopar``); ``autopar plan --no-cache`` bypasses it.
The files are pickles: the cache folder must be one only its user writes, as for any cache of
Python objects (torch's own compile caches are the same).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import inspect
import json
import os
import pickle
import tempfile
from functools import lru_cache
from pathlib import Path

import torch
from torch import nn

from autopar.analysis.graph import GraphIR
from autopar.analysis.tracing import resolve_seq_len, trace
from autopar.core.specs import TrainSpec

CACHE_ENV = "AUTOPAR_CACHE_DIR"
"""Environment variable naming the cache folder."""

FORMAT = 1
"""Bumped when what is stored changes shape."""

_PLAIN = (int, float, str, bool, type(None))

PACKAGES = ("autopar", "autopar.costmodel", "autopar.passes", "autopar.kernels")
"""autopar's packages (``costmodel``, ``passes`` and ``kernels`` are folders of their own in a
checkout, ``pyproject.toml``'s ``package-dir``)."""


def cache_dir() -> Path:
    """Where traced graphs are kept: ``$AUTOPAR_CACHE_DIR``, else ``$XDG_CACHE_HOME/autopar``,
    else ``~/.cache/autopar``; graphs go in its ``traces`` folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autopar"


@lru_cache(maxsize=1)
def _autopar_source() -> str:
    """A digest of every Python file of autopar's packages (the tracer, the model zoo, the op
    rules): a change to any of them is a new cache key. The packages are found, not
    imported (analysis imports nothing above it)."""
    digest = hashlib.sha256()
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        for root in (spec.submodule_search_locations or []) if spec is not None else []:
            for path in sorted(Path(root).rglob("*.py")):
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def _plain(value: object) -> object:
    """``value`` if it is plain data (recursively through tuples and lists), else None."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list)):
        items = [_plain(v) for v in value]
        return items if all(i is not None or v is None for i, v in zip(items, value)) else None
    return None


def _module_state(module: nn.Module) -> list:
    """A module's class and its plain attributes (what its forward may branch on)."""
    attrs = []
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or name == "training":  # trace() sets the training mode
            continue
        plain = _plain(value)
        if plain is not None or value is None:
            attrs.append((name, plain))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):  # a zoo config
            attrs.append((name, json.dumps(dataclasses.asdict(value), sort_keys=True,
                                           default=str)))
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):  # transformers'
            attrs.append((name, json.dumps(value.to_dict(), sort_keys=True, default=str)))
    cls = type(module)
    return [f"{cls.__module__}.{cls.__qualname__}", attrs]


def _class_sources(model: nn.Module) -> list[tuple[str, str]]:
    """(file, digest) of the source of each module class the model uses, outside torch
    (torch's version is keyed on its own)."""
    files = set()
    for module in model.modules():
        for cls in type(module).__mro__:
            if cls.__module__.startswith("torch") or cls is object:
                continue
            try:
                source = inspect.getsourcefile(cls)
            except TypeError:
                continue
            if source is not None:
                files.add(source)
    out = []
    for path in sorted(files):
        try:
            out.append((path, hashlib.sha256(Path(path).read_bytes()).hexdigest()))
        except OSError:
            out.append((path, "unreadable"))
    return out


def cache_key(model: nn.Module, batch: int, seq_len: int) -> str:
    """The digest naming ``model``'s traced graph at ``batch`` x ``seq_len`` (module
    docstring)."""
    tensors = [(n, tuple(t.shape), str(t.dtype))
               for n, t in [*model.named_parameters(), *model.named_buffers()]]
    modules = [(name, _module_state(m)) for name, m in model.named_modules()]
    what = json.dumps({"format": FORMAT, "torch": torch.__version__,
                       "autopar": _autopar_source(), "batch": batch, "seq_len": seq_len,
                       "tensors": tensors, "modules": modules,
                       "sources": _class_sources(model)}, default=str)
    return hashlib.sha256(what.encode()).hexdigest()


def traced(model: nn.Module | GraphIR, train: TrainSpec | None = None, *, cache: bool = True,
           batch: int = 1) -> GraphIR:
    """``tracing.trace(model, train, batch=batch)``, read from the cache when this model was
    traced before with the same inputs, and stored there when not (``cache=False``: traced,
    nothing read or written). A ``GraphIR`` is returned as it is."""
    if isinstance(model, GraphIR):
        return model
    if not cache or not isinstance(model, nn.Module):
        return trace(model, train, batch=batch)
    seq = resolve_seq_len(model, train, None)
    path = cache_dir() / "traces" / f"{cache_key(model, batch, seq)}.pkl"
    try:
        graph = pickle.loads(path.read_bytes())
        if isinstance(graph, GraphIR):
            return graph
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError,
            TypeError, ValueError):
        pass  # not there, or unreadable: traced again below
    graph = trace(model, train, batch=batch)
    _store(path, dataclasses.replace(graph, fx=None))
    return graph


def _store(path: Path, graph: GraphIR) -> None:
    """Write ``graph`` to ``path`` atomically. A graph that cannot be written -- a full or
    read-only disk, an op argument of a user's model that does not pickle -- is not kept, and
    the command goes on with the graph it traced."""
    temp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            temp = Path(f.name)
            pickle.dump(graph, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(temp, path)
    except Exception:  # noqa: BLE001 - a cache, never a reason to fail the command
        if temp is not None:
            temp.unlink(missing_ok=True)
