"""Values of a layer remembered across estimates (``ByLayer``): the one memo the cost model
keeps per ``LayerCost``, for the step's times and sizes (``costmodel/step.py``) and the memory
model's per-policy views (``costmodel/memory.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from .workload import LayerCost

_T = TypeVar("_T")


class ByLayer:
    """Values of a layer remembered across estimates, by the layer and what else they depend
    on: the search prices the same layer under the same split for many candidates (other dp,
    pp, ZeRO, schedules). A layer is keyed by its ``id`` (hashing one reads every op) and held
    with its entry, so the ``id`` is not reused while the entry lives; at ``kept`` entries the
    table starts again."""

    def __init__(self, kept: int) -> None:
        self.kept = kept
        self.table: dict[tuple, tuple[LayerCost, object]] = {}

    def get(self, layer: LayerCost, key: tuple, make: Callable[[], _T]) -> _T:
        full = (id(layer), *key)
        hit = self.table.get(full)
        if hit is not None and hit[0] is layer:
            return hit[1]  # type: ignore[return-value]
        if len(self.table) >= self.kept:
            self.table.clear()
        value = make()
        self.table[full] = (layer, value)
        return value
