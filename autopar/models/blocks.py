"""The repeated blocks of a model's module tree (``find_block_group``).

A *block group* is a run of structurally identical, consecutive children of one
``nn.ModuleList`` or ``nn.Sequential``: same class, same parameter names, shapes and dtypes
(a 96-layer GPT's ``layers``). Every container's children are split into maximal runs; the run
with the most parameters wins (ties: more instances, then the first found), so a ModuleList of
experts inside each layer never beats the list of layers that holds it. A run needs at least two
instances unless no container has one, in which case a single-child list (a one-layer model)
still counts.

It reads the module tree only, so the tracer (``autopar.analysis.tracing_blocks``, which also marks each
traced node with its instance), the admissibility facts and the generic decoder family
(``models/generic``) share it.

A group need not fill its container: DeepSeek-V3's first ``first_k_dense_replace`` layers and
Qwen2-MoE's ``mlp_only_layers`` are dense layers of the same ``model.layers`` as the sparse ones
the group repeats. ``block_span`` says where the group sits in the container a family names
(``ModelParts.blocks``): ``lead`` modules before it, which the first pipeline stage runs after
the embedding and the cost model prices with it (they are no block of the trace, so they fall
in its ``pre`` layer), and ``trail`` modules after it, which the last stage runs before the
head. The plan's blocks are the group's, so the count a plan places is the count the engine
cuts. A container that is not "leading modules + one repeated run" (dense and sparse layers
alternating) has trailing modules, and pipelining it is refused (``BlockSpan.problem``): its
blocks would not be the model's repeated layers.
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


@dataclass(frozen=True)
class BlockSpan:
    """Where the repeated blocks sit in their container (``model.layers``): ``lead`` modules,
    then ``count`` blocks, then the rest (``trail``), ``size`` in all."""

    path: str
    """Qualified name of the container (a family's ``ModelParts.blocks``)."""
    lead: int
    count: int
    size: int

    @property
    def trail(self) -> int:
        """Modules after the blocks (the container's last ``trail``)."""
        return self.size - self.lead - self.count

    @property
    def blocks(self) -> range:
        """The blocks' indices in the container."""
        return range(self.lead, self.lead + self.count)

    def problem(self) -> str | None:
        """Why pipeline stages cannot cut the blocks (modules after them: the container is
        not "leading modules + one repeated run"); ``None`` where they can."""
        if not self.trail:
            return None
        last = self.lead + self.count - 1
        run = (f"{self.path}.{self.lead}" if not last - self.lead
               else f"{self.path}.{self.lead}..{last}")
        return (f"its layers {self.path} are not leading layers followed by one run of "
                f"identical blocks: {run} repeat, and {self.trail} different layer(s) follow "
                "(dense and sparse layers alternating, say); pipeline stages cut only such a "
                "run")


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


def block_span(model: nn.Module, container: str) -> BlockSpan:
    """Where ``model``'s block group (``find_block_group``) sits in the ``nn.ModuleList`` at
    ``container``; the whole container where the group is elsewhere (a family whose blocks the
    tree search does not pick: every module of the container is then a block)."""
    modules = model.get_submodule(container)
    size = len(modules)
    group = find_block_group(model)
    if group is None or group.path != container:
        return BlockSpan(container, 0, size, size)
    lead = [f"{container}.{name}" if container else name
            for name, _ in modules.named_children()].index(group.instances[0])
    return BlockSpan(container, lead, group.count, size)
