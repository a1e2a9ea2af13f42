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

import torch
import torch.fx
from torch import nn
from torch.fx import Node


def trace_module(module: nn.Module, args: tuple, kwargs: dict) -> torch.fx.Graph:
    """``module``'s forward traced for the call ``module(x, *args, **kwargs)``; ``TypeError``
    where its signature cannot take that call (extra arguments as ``*args``, one not passed)."""
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(args) + 1 > len(params):
        raise TypeError("it takes its extra arguments as *args")
    concrete = {}
    for i, p in enumerate(params[1:]):
        value = args[i] if i < len(args) else kwargs.get(p.name, p.default)
        if value is p.empty:
            raise TypeError(f"its argument {p.name!r} is not passed")
        if not isinstance(value, (Node, torch.Tensor)):
            concrete[p.name] = value
    was_training = module.training
    module.train()
    try:
        tracer = torch.fx.Tracer()
        tracer.proxy_buffer_attributes = True  # a buffer read is a get_attr node, not a value
        return tracer.trace(module, concrete_args=concrete or None)
    finally:
        module.train(was_training)
