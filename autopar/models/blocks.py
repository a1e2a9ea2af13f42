"""The repeated blocks of a model's module tree (``find_block_group``).

A *block group* is a run of structurally identical, consecutive children of one
``nn.ModuleList`` or ``nn.Sequential``: same class, same parameter names, shapes and dtypes
(a 96-layer GPT's ``layers``). Every container's children are split into maximal runs; the run
with the most parameters wins (ties: more instances, then the first found), so a ModuleList of
experts inside each layer never beats the list of layers that holds it. A run needs at least two
instances unless no container has one, in which case a single-child list (a one-layer model)
still counts.

It reads the module tree only, so the tracer (``autopar.tracing_blocks``, which also marks each
traced node with its instance), the admissibility facts and the generic decoder family
(``models/generic``) share it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class BlockGroup:
    """A block repeated ``len(instances)`` times (a 96-layer GPT: one group of 96)."""

    path: str
    """Qualified name of the container (``layers``)."""
    instances: tuple[str, ...]
    """Module paths of the instances, in execution order (``layers.0``, ``layers.1``, ...)."""
    module_type: str
    """Class name of one instance."""
    uniform: bool = True
    """Whether every instance runs the same op sequence as instance 0 (checked by the tracer)."""

    @property
    def count(self) -> int:
        return len(self.instances)



_Signature = tuple[type, tuple[tuple[str, tuple[int, ...], torch.dtype], ...]]


def _signature(module: nn.Module) -> _Signature:
    """Class plus (name, shape, dtype) of every parameter: equal signatures, identical blocks."""
    params = tuple(
        (name, tuple(p.shape), p.dtype)
        for name, p in module.named_parameters(remove_duplicate=False)
    )
    return type(module), params


def _num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_block_group(model: nn.Module) -> BlockGroup | None:
    """The largest run of identical consecutive children of a ModuleList/Sequential, or None."""
    best: tuple[int, int, BlockGroup] | None = None  # (params, count, group)
    best_single: tuple[int, BlockGroup] | None = None
    for path, container in model.named_modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(container.named_children())
        start = 0
        while start < len(children):
            sig = _signature(children[start][1])
            end = start + 1
            while end < len(children) and _signature(children[end][1]) == sig:
                end += 1
            run = children[start:end]
            per_instance = _num_params(run[0][1])
            if per_instance > 0:
                prefix = f"{path}." if path else ""
                group = BlockGroup(
                    path=path,
                    instances=tuple(prefix + name for name, _ in run),
                    module_type=type(run[0][1]).__name__,
                )
                total = per_instance * len(run)
                if len(run) >= 2:
                    if best is None or (total, len(run)) > best[:2]:
                        best = (total, len(run), group)
                elif best_single is None or total > best_single[0]:
                    best_single = (total, group)
            start = end
    if best is not None:
        return best[2]
    return best_single[1] if best_single is not None else None
