"""Inputs and outputs of the per-candidate ILP (``autopar.search.ilp``): cost tables, solution.

Frozen dataclasses that validate in ``__post_init__`` and raise ``AutoparError`` (a ``ValueError``)
naming the field at fault. Times in seconds, memory in bytes per GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

from autopar.core.errors import AutoparError


def _floats(value: object, where: str, *, allow_inf: bool = False) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in value)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise AutoparError(
            f"{where} must be a sequence of numbers, got {value!r}", where=where
        ) from None
    for v in out:
        if math.isnan(v) or v < 0 or (math.isinf(v) and not allow_inf):
            raise AutoparError(
                f"{where} holds {v!r}; costs and bytes must be finite and non-negative",
                where=where,
                fix="pass finite values >= 0" + (" (inf forbids a strategy)" if allow_inf else ""),
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
    state_bytes: tuple[float, ...]
    """Per-GPU bytes kept whatever the checkpointing: weights, gradients, optimizer share."""
    activation_bytes: tuple[float, ...]
    """Per-GPU bytes of activations the op saves for the backward pass (one block)."""
    forward_s: tuple[float, ...] = ()
    """Forward time per strategy, what recomputing the op costs; empty means zero."""
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
        for name in ("compute_s", "state_bytes", "activation_bytes", "forward_s"):
            value = getattr(self, name)
            if name == "forward_s" and len(value) == 0:
                value = (0.0,) * len(names)
            floats = _floats(value, f"{where}.{name}", allow_inf=name == "compute_s")
            if len(floats) != len(names):
                raise AutoparError(
                    f"{name} has {len(floats)} entries for {len(names)} strategies", where=where
                )
            object.__setattr__(self, name, floats)
        if not any(math.isfinite(c) for c in self.compute_s):
            raise AutoparError("every strategy is forbidden (compute_s all inf)", where=where)

    @property
    def memory_bytes(self) -> tuple[float, ...]:
        """State plus activation bytes per strategy, without checkpointing."""
        return tuple(m + a for m, a in zip(self.state_bytes, self.activation_bytes))

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class Edge:
    """Resharding time ``reshard_s[a][b]`` when op ``src`` uses ``a`` and op ``dst`` uses ``b``;
    ``inf`` forbids the pair (a layout that cannot be converted)."""

    src: int
    dst: int
    reshard_s: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        where = f"Edge({self.src}->{self.dst})"
        rows = tuple(_floats(row, f"{where}.reshard_s", allow_inf=True)
                     for row in self.reshard_s)
        object.__setattr__(self, "reshard_s", rows)


@dataclass(frozen=True)
class CheckpointOption:
    """One activation-checkpoint policy a block can use."""

    name: str
    extra_time_s_per_block: float = 0.0
    """Time added per block that uses it, independent of the strategies."""
    activation_bytes_factor: float = 1.0
    """Fraction of the block's activation bytes kept (1 keeps all; full recompute ~ the input)."""
    recompute_fraction: float = 0.0
    """Fraction of the block's forward time (``StrategyTable.forward_s``) spent recomputing."""

    def __post_init__(self) -> None:
        where = f"CheckpointOption({self.name!r})"
        if not self.name:
            raise AutoparError("a checkpoint option needs a name", where=where)
        _floats(
            (self.extra_time_s_per_block, self.activation_bytes_factor, self.recompute_fraction),
            where,
        )


NO_CHECKPOINT = CheckpointOption("none")
"""Keep every activation; no extra time."""


@dataclass(frozen=True)
class BlockProblem:
    """One repeated block of a candidate: the cost tables the ILP chooses from."""

    ops: tuple[StrategyTable, ...]
    edges: tuple[Edge, ...] = ()
    repeat: int = 1
    """How many instances of the block there are (on one pipeline stage); strategies are tied."""
    boundary_edges: tuple[Edge, ...] = ()
    """Edges from op ``src`` of one instance to op ``dst`` of the next (``repeat - 1`` of each)."""
    checkpoint_options: tuple[CheckpointOption, ...] = (NO_CHECKPOINT,)
    """The policies the solve may give blocks; the first is the reference of the formulation.
    Leave out ``NO_CHECKPOINT`` to force checkpointing."""
    fixed_bytes: float = 0.0
    """Per-GPU bytes outside the block (embeddings, buffers, workspace)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ops", tuple(self.ops))
        object.__setattr__(self, "edges", tuple(self.edges))
        object.__setattr__(self, "boundary_edges", tuple(self.boundary_edges))
        object.__setattr__(self, "checkpoint_options", tuple(self.checkpoint_options))
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
        names = [o.name for o in self.checkpoint_options]
        if not names or len(set(names)) != len(names):
            raise AutoparError(
                f"checkpoint option names must be unique and at least one given, got {names}",
                where="BlockProblem.checkpoint_options",
            )
        _floats((self.fixed_bytes,), "BlockProblem.fixed_bytes")


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"
    """Proven optimal: to a relative gap of 1e-9 in the MILP back ends, to CP-SAT's integer scaling
    of the costs (2**40 levels over their range) there."""
    FEASIBLE = "feasible"
    """The time limit was hit; the best plan found, ``gap`` says how far from the bound."""
    INFEASIBLE = "infeasible"
    """Nothing fits the memory limit; the plan is the least-memory one and ``memory_bytes`` is the
    least memory achievable."""


@dataclass(frozen=True)
class Solution:
    """What the solve chose for one block problem."""

    strategy: tuple[int, ...]
    """Index of the chosen strategy of each op (the same in every block)."""
    checkpoint_counts: dict[str, int]
    """Blocks per checkpoint option name; they sum to ``repeat``."""
    objective_s: float
    """Total time of the ``repeat`` blocks, evaluated exactly from the tables."""
    memory_bytes: float
    """Per-GPU bytes of this plan (fixed bytes included)."""
    status: SolveStatus
    gap: float
    """Relative gap (objective - bound) / objective; 0 when optimal, inf when unknown."""
    wall_s: float = field(compare=False)
    memory_limit_bytes: float = math.inf
    min_memory_bytes: float = 0.0
    """The least memory any plan of this problem needs."""


@dataclass(frozen=True)
class Evaluation:
    """Time and memory of one assignment, by part."""

    compute_s: float
    reshard_s: float
    checkpoint_s: float
    state_bytes: float
    activation_bytes: float
    fixed_bytes: float

    @property
    def time_s(self) -> float:
        return self.compute_s + self.reshard_s + self.checkpoint_s

    @property
    def memory_bytes(self) -> float:
        return self.fixed_bytes + self.state_bytes + self.activation_bytes
