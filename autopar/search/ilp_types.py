"""Inputs and outputs of the per-block ILP (``autopar.search.ilp``): cost tables, solution.

Frozen dataclasses that validate in ``__post_init__`` and raise ``AutoparError`` (a ``ValueError``)
naming the field at fault. Times in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from autopar.core.errors import AutoparError


def _floats(value: object, where: str) -> tuple[float, ...]:
    """``value`` as floats, each ``>= 0`` (``inf`` allowed: it forbids a choice)."""
    try:
        out = tuple(float(v) for v in value)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise AutoparError(
            f"{where} must be a sequence of numbers, got {value!r}", where=where
        ) from None
    for v in out:
        if math.isnan(v) or v < 0:
            raise AutoparError(
                f"{where} holds {v!r}; times must be non-negative",
                where=where,
                fix="pass values >= 0 (inf forbids a choice)",
            )
    return out


@dataclass(frozen=True)
class StrategyTable:
    """The cost table of one op: one entry per strategy."""

    names: tuple[str, ...]
    """Strategy labels (e.g. ``"S0R"``, ``"col"``), unique within the op."""
    compute_s: tuple[float, ...]
    """Time of one forward+backward of the op per block under each strategy, its own collectives
    included; ``inf`` forbids the strategy."""
    op: str = ""
    """The op's name, for reports."""

    def __post_init__(self) -> None:
        where = f"StrategyTable({self.op or '?'})"
        names = tuple(str(n) for n in self.names)
        if not names or len(set(names)) != len(names):
            raise AutoparError(
                f"strategy names must be unique and non-empty, got {names}", where=where
            )
        object.__setattr__(self, "names", names)
        compute = _floats(self.compute_s, f"{where}.compute_s")
        if len(compute) != len(names):
            raise AutoparError(
                f"compute_s has {len(compute)} entries for {len(names)} strategies", where=where
            )
        if not any(math.isfinite(c) for c in compute):
            raise AutoparError("every strategy is forbidden (compute_s all inf)", where=where)
        object.__setattr__(self, "compute_s", compute)

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class Edge:
    """A tensor from op ``src`` to op ``dst`` and what converting its layout costs."""

    src: int
    """Index of the producing op."""
    dst: int
    """Index of the consuming op."""
    reshard_s: tuple[tuple[float, ...], ...]
    """``reshard_s[a][b]``: resharding time when ``src`` uses strategy ``a`` and ``dst`` uses
    ``b``; ``inf`` forbids the pair (a layout that cannot be converted)."""

    def __post_init__(self) -> None:
        where = f"Edge({self.src}->{self.dst})"
        rows = tuple(_floats(row, f"{where}.reshard_s") for row in self.reshard_s)
        object.__setattr__(self, "reshard_s", rows)


@dataclass(frozen=True)
class BlockProblem:
    """One repeated block of a candidate: the cost tables the ILP chooses from."""

    ops: tuple[StrategyTable, ...]
    """The ops of one instance of the block."""
    edges: tuple[Edge, ...] = ()
    """Edges inside one instance (present ``repeat`` times)."""
    repeat: int = 1
    """How many instances of the block there are; strategies are tied across them."""
    boundary_edges: tuple[Edge, ...] = ()
    """Edges from op ``src`` of one instance to op ``dst`` of the next (``repeat - 1`` of each)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "edges", tuple(self.edges))
        object.__setattr__(self, "boundary_edges", tuple(self.boundary_edges))
        if not self.ops:
            raise AutoparError("a block needs at least one op", where="BlockProblem.ops")
        if isinstance(self.repeat, bool) or not isinstance(self.repeat, int) or self.repeat < 1:
            raise AutoparError(
                f"repeat must be an integer >= 1, got {self.repeat!r}", where="BlockProblem.repeat"
            )
        for family, edges in (("edges", self.edges), ("boundary_edges", self.boundary_edges)):
            for k, edge in enumerate(edges):
                where = f"BlockProblem.{family}[{k}]"
                if not (0 <= edge.src < len(self.ops) and 0 <= edge.dst < len(self.ops)):
                    raise AutoparError(
                        f"edge {edge.src}->{edge.dst} names an op that does not exist", where=where
                    )
                if family == "edges" and edge.src == edge.dst:
                    raise AutoparError(
                        "an edge inside a block must join two different ops", where=where
                    )
                shape = (len(self.ops[edge.src]), len(self.ops[edge.dst]))
                if len(edge.reshard_s) != shape[0] or any(
                    len(r) != shape[1] for r in edge.reshard_s
                ):
                    raise AutoparError(
                        f"reshard_s must be a {shape[0]}x{shape[1]} matrix", where=where
                    )


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"
    """Proven optimal: to a relative gap of 1e-9 in the MILP back ends, to CP-SAT's integer scaling
    of the costs (2**40 levels over their range) there."""
    FEASIBLE = "feasible"
    """Not proven optimal: the time limit was hit (the best plan found, ``gap`` says how far from
    the bound), or no plan was found (``gap`` is inf; see ``ilp.solve``)."""


@dataclass(frozen=True)
class Solution:
    """What the solve chose for one block problem."""

    strategy: tuple[int, ...]
    """Index of the chosen strategy of each op (the same in every block)."""
    objective_s: float
    """Total time of the ``repeat`` blocks, evaluated exactly from the tables."""
    status: SolveStatus
    """Whether the plan is proven optimal."""
    gap: float
    """Relative gap (objective - bound) / objective; 0 when optimal, inf when unknown."""
    wall_s: float = field(compare=False)
    """Seconds the back end ran (model translation and solve)."""


@dataclass(frozen=True)
class Evaluation:
    """Time of one assignment over the ``repeat`` blocks, by part."""

    compute_s: float
    """The ops' compute times (their own collectives included)."""
    reshard_s: float
    """Resharding on the edges and the boundary edges."""

    @property
    def time_s(self) -> float:
        """The objective: compute plus resharding."""
        return self.compute_s + self.reshard_s
