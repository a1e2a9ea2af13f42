"""Repeated-block detection for ``autopar.trace``.

A *block group* is a run of structurally identical, consecutive children of one
``nn.ModuleList`` or ``nn.Sequential``: same class, same parameter names, shapes and dtypes
(a 96-layer GPT's ``layers``). Every container's children are split into maximal runs; the run
with the most parameters wins (ties: more instances, then the first found), so a ModuleList of
experts inside each layer never beats the list of layers that holds it. A run needs at least two
instances unless no container has one, in which case a single-child list (a one-layer model)
still counts.

``assign_blocks`` marks each node whose ``module_path`` lies inside instance ``i`` with
``block = i`` (one dictionary lookup per node) and checks that every instance runs the same op
sequence as instance 0; if not, the group is kept but marked ``uniform=False``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from autopar.graph import BlockGroup, NodeInfo

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


def assign_blocks(nodes: list[NodeInfo], group: BlockGroup) -> BlockGroup:
    """Set ``node.block`` for nodes inside an instance; return ``group`` with ``uniform`` set."""
    index = {inst: i for i, inst in enumerate(group.instances)}
    depth = group.path.count(".") + 1 if group.path else 0  # components of the container path
    prefix = f"{group.path}." if group.path else ""
    sequences: list[list[str]] = [[] for _ in group.instances]
    for node in nodes:
        path = node.module_path
        if not path or (prefix and not path.startswith(prefix)):
            continue
        parts = path.split(".", depth + 1)
        if len(parts) <= depth:
            continue
        inst = ".".join(parts[: depth + 1])
        i = index.get(inst)
        if i is not None:
            node.block = i
            sequences[i].append(node.op)
    uniform = all(seq == sequences[0] for seq in sequences[1:])
    return replace(group, uniform=uniform)
