"""One module's forward as a ``torch.fx`` graph, called as the model calls it: the one tracer
of a generic decoder's block (``context.py``: what mixes tokens) and of the modules inside it
that tensor parallelism rewrites (``tensor_parallel.py``: what reads the split features).

``torch.nn`` layers are leaves, buffers are ``get_attr`` nodes (a registered mask is seen, not
baked in as a value), and each argument the call passes either stays an input of the graph (a
tensor, or a node of the caller's graph) or, any other value (``mask=None``, a flag), is fixed
at the value the call passes, as fx's ``concrete_args``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.fx
from torch import nn
from torch.fx import Node


def call_values(module: nn.Module, args: tuple, kwargs: dict) -> list[object]:
    """The value of each of ``module.forward``'s parameters in the call ``module(*args,
    **kwargs)``, in order (a traced graph's placeholders); ``TypeError`` where its signature
    cannot take that call (extra arguments as ``*args``, one not passed)."""
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(args) > len(params):
        raise TypeError("it takes its extra arguments as *args")
    values = [args[i] if i < len(args) else kwargs.get(p.name, p.default)
              for i, p in enumerate(params)]
    missing = next((p.name for p, v in zip(params, values) if v is p.empty), None)
    if missing is not None:
        raise TypeError(f"its argument {missing!r} is not passed")
    return values


class _Tracer(torch.fx.Tracer):
    def __init__(self, leaves: frozenset[int]) -> None:
        super().__init__()
        self.leaves = leaves
        self.proxy_buffer_attributes = True  # a buffer read is a get_attr node, not a value

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return id(m) in self.leaves or super().is_leaf_module(m, qualname)


def trace_module(module: nn.Module, args: tuple, kwargs: dict,
                 leaves: frozenset[int] = frozenset()) -> torch.fx.Graph:
    """``module``'s forward traced for the call ``module(x, *args, **kwargs)``, the modules
    whose ids are in ``leaves`` not entered; ``TypeError`` where its signature cannot take that
    call (``call_values``)."""
    params = [p.name for p in inspect.signature(module.forward).parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    values = call_values(module, (None, *args), kwargs)
    concrete = {name: value for name, value in zip(params[1:], values[1:])
                if not isinstance(value, (Node, torch.Tensor))}
    with training(module):
        return _Tracer(leaves).trace(module, concrete_args=concrete or None)


@contextmanager
def training(module: nn.Module) -> Iterator[None]:
    """``module`` in training mode (what is traced is the training forward: dropout on), its
    mode restored after."""
    was_training = module.training
    module.train()
    try:
        yield
    finally:
        module.train(was_training)


def failure(err: BaseException, limit: int = 200) -> str:
    """``Type: first line`` of an exception a tracer raised, for a reason a person reads."""
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return f"{type(err).__name__}: {first[:limit]}"
