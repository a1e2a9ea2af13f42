"""Shapes for every node of a traced graph: the graph run on meta tensors (fake ones where the
weights are real), each distinct call run once.

A transformer repeats its block tens of times, and a block's nodes then repeat the same calls
on inputs of the same shapes: torch's ``RMSNorm`` on meta tensors costs ~3.5 ms a call and a
405B model makes 253 of them. A call whose result is a function of what the key holds is run
the first time and, when met again, given new tensors of the first result's shapes, strides and
dtypes:

* a leaf module of ``torch.nn`` (fx's default leaves): its class, its training flag, its
  public attributes (``eps``, ``normalized_shape``...; any attribute the key cannot hold
  leaves the call unkeyed), the metadata of its parameters and buffers, and of the inputs;
* a function of ``torch.nn.functional``, of ``torch`` (not an in-place one, nor one asked for
  ``inplace=True`` or an ``out=``) or an arithmetic operator, with the inputs' metadata and
  the other arguments' values.

Everything else (a method call, a user function, a module the tracer kept whole) runs every
time. Nothing reads a node's value but for its metadata (``analysis/tracing.py``), so a new
tensor of the same metadata is the same answer. ``tests/unit/analysis/test_propagate.py``
holds the graphs' every node to a run without it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
from torch import nn

_OPERATORS = frozenset(getattr(operator, n) for n in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "neg", "matmul", "getitem"))
_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
            torch.layout)


class ShapeRecorder(torch.fx.Interpreter):
    """Runs the graph and stores each node's result in ``node.meta["val"]``."""

    def __init__(self, root: nn.Module, graph: torch.fx.Graph) -> None:
        super().__init__(root, graph=graph)
        self._seen: dict[tuple, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        n.meta["val"] = result
        return result

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        module = self.fetch_attr(target)
        key = _module_key(module, args, kwargs)
        return self._once(key, lambda: super(ShapeRecorder, self).call_module(
            target, args, kwargs))

    def call_function(self, target: Any, args: tuple, kwargs: dict) -> Any:
        key = _function_key(target, args, kwargs)
        return self._once(key, lambda: super(ShapeRecorder, self).call_function(
            target, args, kwargs))

    def _once(self, key: tuple | None, run: Callable[[], Any]) -> Any:
        if key is not None and key in self._seen:
            return _alike(self._seen[key])
        result = run()
        if key is not None and _keyable(result) is not None:
            self._seen[key] = result
        return result


def propagate(root: nn.Module, graph: torch.fx.Graph, args: list[torch.Tensor]) -> None:
    """``node.meta["val"]`` for every node of ``graph`` (whose ``get_attr`` and
    ``call_module`` nodes name ``root``'s): a meta-tensor run, under ``FakeTensorMode`` if
    weights are real."""
    on_meta = all(t.device.type == "meta"
                  for t in (*root.parameters(), *root.buffers(), *args))
    if on_meta:
        with torch.no_grad():
            ShapeRecorder(root, graph).run(*args)
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode, torch.no_grad():
        ShapeRecorder(root, graph).run(*[mode.from_tensor(a) for a in args])


def _keyable(value: Any) -> Any:
    """A hashable stand-in for ``value`` (a tensor by its metadata), or None if it has none."""
    if isinstance(value, torch.Tensor):
        if type(value) not in (torch.Tensor, nn.Parameter) and not _is_fake(value):
            return None  # a tensor subclass: its behaviour is its own
        return ("tensor", tuple(value.shape), value.stride(), value.dtype, value.device.type,
                value.requires_grad, value.storage_offset())
    if isinstance(value, _SCALARS):
        return (type(value).__name__, value)
    if isinstance(value, slice):
        parts = (_keyable(value.start), _keyable(value.stop), _keyable(value.step))
        return None if None in parts else ("slice", *parts)
    if value is Ellipsis:
        return ("...",)
    if isinstance(value, (tuple, list)):
        parts = tuple(_keyable(v) for v in value)
        return None if None in parts else (type(value).__name__, *parts)
    if isinstance(value, dict):
        parts = tuple((k, _keyable(v)) for k, v in value.items())
        return None if any(p[1] is None or not isinstance(p[0], str) for p in parts) \
            else ("dict", *parts)
    return None


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _module_key(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
    cls = type(module)
    if not cls.__module__.startswith("torch.nn.modules.") or any(True for _ in module.children()):
        return None
    if module._forward_hooks or module._forward_pre_hooks:
        return None
    attrs = []
    for name, value in sorted(vars(module).items()):
        if name.startswith("_"):
            continue
        k = _keyable(value)
        if k is None:
            return None
        attrs.append((name, k))
    state = tuple((n, _keyable(t)) for n, t in (*module.named_parameters(recurse=False),
                                                *module.named_buffers(recurse=False)))
    inputs = _keyable((args, kwargs))
    if inputs is None or any(k is None for _, k in state):
        return None
    return ("module", cls, module.training, tuple(attrs), state, inputs)


def _function_key(target: Any, args: tuple, kwargs: dict) -> tuple | None:
    if target in _OPERATORS:
        pass
    else:
        where = getattr(target, "__module__", None) or ""
        name = getattr(target, "__name__", "")
        if where not in ("torch.nn.functional", "torch", "torch._C._nn", "torch.functional") \
                and not (where == "" and getattr(torch, name, None) is target):
            return None
        if name.endswith("_") or kwargs.get("inplace") or "out" in kwargs:
            return None
    inputs = _keyable((args, kwargs))
    return None if inputs is None else ("function", target, inputs)


def _alike(value: Any) -> Any:
    """New tensors of ``value``'s metadata, in its structure."""
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                   device=value.device)
    if isinstance(value, (tuple, list)):
        items = [_alike(v) for v in value]
        if hasattr(value, "_make"):  # a namedtuple
            return value._make(items)
        return type(value)(items)  # a tuple, a list, torch's return types
    if isinstance(value, dict):
        return {k: _alike(v) for k, v in value.items()}
    return value
