r"""The per-block ILP: one tensor-parallel strategy per op of a repeated block.

The search enumerates mesh factorisations and micro-batching outside; for each candidate
``block_tables`` fills cost tables (``BlockProblem``) and this module picks one sharding strategy
per op — the same in every instance of the repeated block (Alpa / XLA auto-sharding tie the
layers) — minimising compute plus resharding time. It takes cost tables, not the cost model, so
the tests can check it against brute-force enumeration. Activation checkpointing and memory are
not part of it: ``autopar.search.optimize`` decides them per pipeline stage, pricing the stage's
real memory.

Data
----
* ops :math:`i \in I`, strategies :math:`s \in S_i` with time :math:`c_{is}` (forward and backward
  of one block, the op's own collectives included); :math:`c_{is} = \infty` forbids a strategy.
* edges :math:`(i, j) \in E` inside a block with resharding time :math:`R^{ij}_{ab}` (strategy
  :math:`a` of the producer, :math:`b` of the consumer); boundary edges :math:`(i, j) \in B` from op
  :math:`i` of one block to op :math:`j` of the next, present :math:`L - 1` times.
  :math:`R^{ij}_{ab} = \infty` forbids the pair.
* :math:`L` = ``repeat``, the number of blocks.
* per op pair :math:`i \le j` (``pair_costs``) the resharding over all blocks,
  :math:`C^{ij}_{ab} = L \sum_E R_{ab} + (L - 1) \sum_B R_{ab}`, summing the edges that join
  :math:`i` and :math:`j` in either direction (rows: the strategies of the lower-numbered op);
  a boundary edge from an op to itself gives :math:`C^{ii}`, of which only the diagonal
  :math:`a = b` can occur (strategies are tied). :math:`P` is the set of pairs.

Variables
---------
* :math:`x_{is} \in \{0, 1\}` — op :math:`i` uses strategy :math:`s` (in every block: tied);
  fixed to 0 where :math:`c_{is} = \infty`.
* :math:`e^{ij}_{ab} \in [0, 1]` — the product :math:`x_{ia} x_{jb}`, one matrix per pair
  :math:`i < j` of :math:`P` (boolean in CP-SAT); fixed to 0 where :math:`C^{ij}_{ab} = \infty`.
  Two kinds of pair need no product and are folded into the :math:`x` costs: a separable matrix
  (:math:`C^{ij}_{ab} = u_a + v_b`, all finite: :math:`u_a` on :math:`x_{ia}`, :math:`v_b` on
  :math:`x_{jb}`), and a self pair (:math:`C^{ii}_{aa}` on :math:`x_{ia}`, or :math:`x_{ia}` fixed
  to 0 where it is infinite).

Constraints (one ``add_*_constraint`` function each)
----------------------------------------------------
* one strategy: :math:`\sum_s x_{is} = 1` for every op.
* edge product (Alpa's linearisation, as marginals): :math:`\sum_b e^{ij}_{ab} = x_{ia}` for every
  :math:`a`, :math:`\sum_a e^{ij}_{ab} = x_{jb}` for every :math:`b`. With integral :math:`x` the
  only solution is the product, so :math:`e` may stay continuous in a MILP.

Objective
---------
.. math:: \min \; L \sum_{is} c_{is} x_{is} + \sum_{(i, j) \in P} \sum_{ab} C^{ij}_{ab} e^{ij}_{ab}

with the folded pairs' terms on :math:`x` in place of their :math:`e`: the time of the
:math:`L` blocks, :math:`L \sum_i c_{i s_i} + L \sum_E R_{s_i s_j} + (L - 1) \sum_B R_{s_i s_j}`
for the chosen :math:`s`. ``Solution.objective_s`` is that sum evaluated from the tables
(``evaluate``), not the solver's objective value.

Determinism
-----------
HiGHS (the default) and CBC are deterministic, thread count included (CBC runs on one thread
here), so equal-cost optima always resolve the same way. SCIP is deterministic with one worker
only: with more, equal-cost optima may resolve differently from run to run (seen on the tie-rich
test instances), so its answer is a plan of optimal time, not always the same one. CP-SAT's
portfolio is not deterministic either: its objective gets, strictly below the last cost level, a
tie-break preferring low strategy indices (weight :math:`s \cdot k_i`, fixed pseudo-random
:math:`k_i`), which makes the optimum unique, so the answer does not depend on ``num_workers``.
(A second lexicographic solve would do the same for the MILPs but cost 2-37x the first; the back
ends may therefore pick different ones of several equal-cost plans.)

Reduction
---------
Before the back end sees it, ``solve`` eliminates every op of one or two neighbours (in the
pairs left once the separable ones are folded) by dynamic programming (``ilp_reduce``): exact,
ties to the lower strategy index. A transformer block's chains of norms, projections and adds
go, and the back end gets the ops of three or more neighbours, or nothing (a GPT block's 93
ops, DeepSeek-V3's 128 to 4: 55-108 ms of HiGHS to 3 and 17 ms here). ``reduce=False`` hands
it the whole program.

Time limit
----------
A solve that hits ``time_limit_s`` returns status ``FEASIBLE`` with the best plan found and its
relative gap to the bound; a time-limited result depends on the machine's speed, as any
wall-clock limit does. When the back end finds no plan at all (in time, or because every plan
uses a forbidden pair), ``solve`` does not raise: it returns every op's first allowed strategy
(``first_allowed``) with gap ``inf`` (its ``objective_s`` is ``inf`` if that plan uses a
forbidden pair). CP-SAT gets that plan as its hint, a first solution to improve on.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from autopar.core.errors import AutoparError
from autopar.search.ilp_backends import (
    Backend,
    LinearProgram,
    RawResult,
    RawStatus,
    solve_cp_sat,
    solve_mip,
)
from autopar.search.ilp_reduce import reduce_problem, split_separable
from autopar.search.ilp_types import (
    BlockProblem,
    Edge,
    Evaluation,
    Solution,
    SolveStatus,
    StrategyTable,
)

__all__ = [
    "Backend",
    "BlockProblem",
    "Edge",
    "Evaluation",
    "IlpModel",
    "Solution",
    "SolveStatus",
    "StrategyTable",
    "build_model",
    "evaluate",
    "explain",
    "solve",
]

DEFAULT_BACKEND = Backend.HIGHS
"""Measured faster on block instances and on the 500-op instances (``bench/results/solver.md``)."""


# ----------------------------------------------------------------------------------- evaluation


def evaluate(problem: BlockProblem, strategy: tuple[int, ...]) -> Evaluation:
    """Time of an assignment, straight from the tables (independent of the ILP)."""
    if len(strategy) != len(problem.ops) or any(
        not 0 <= s < len(t) for s, t in zip(strategy, problem.ops)
    ):
        raise AutoparError(
            f"strategy {strategy} does not match the ops of the problem", where="strategy"
        )
    L = problem.repeat
    compute = L * sum(t.compute_s[s] for t, s in zip(problem.ops, strategy))
    reshard = L * sum(e.reshard_s[strategy[e.src]][strategy[e.dst]] for e in problem.edges)
    if L > 1:  # (L - 1) * inf would be nan for a single block
        reshard += (L - 1) * sum(
            e.reshard_s[strategy[e.src]][strategy[e.dst]] for e in problem.boundary_edges
        )
    return Evaluation(compute_s=compute, reshard_s=reshard)


def first_allowed(problem: BlockProblem) -> tuple[int, ...]:
    """Every op's first strategy of finite compute time: the plan ``solve`` returns when the
    back end finds none, and CP-SAT's hint."""
    return tuple(
        next(s for s, c in enumerate(t.compute_s) if math.isfinite(c)) for t in problem.ops
    )


# ------------------------------------------------------------------------------------- building


@dataclass(frozen=True)
class IlpModel:
    """The program and where each decision variable lives in it."""

    lp: LinearProgram
    """The program the back ends solve."""
    x: tuple[tuple[int, ...], ...]
    """x[i][s]: op i uses strategy s."""
    e: dict[tuple[int, int], tuple[tuple[int, ...], ...]]
    """e[(i, j)][a][b] = x[i][a] * x[j][b], for op pairs i < j with a non-separable cost."""

    def values_of(self, strategy: tuple[int, ...]) -> dict[int, int]:
        """Every variable's value for a plan (CP-SAT's hint)."""
        values = {
            var: int(s == strategy[i]) for i, row in enumerate(self.x) for s, var in enumerate(row)
        }
        for (i, j), rows in self.e.items():
            for a, row in enumerate(rows):
                for b, var in enumerate(row):
                    values[var] = int(a == strategy[i] and b == strategy[j])
        return values


def _tie_weights(problem: BlockProblem) -> list[int]:
    """k_i per op: fixed pseudo-random in [512, 1023]."""
    state = 0x2545F491
    weights = []
    for _ in problem.ops:
        state = (state * 1103515245 + 12345) % 2**31
        weights.append(512 + state % 512)
    return weights


def pair_costs(problem: BlockProblem) -> dict[tuple[int, int], list[list[float]]]:
    """Resharding time per op pair (i <= j) over all ``repeat`` blocks: edges weighted ``repeat``,
    boundary edges ``repeat - 1``; a boundary edge from an op to itself lands on (i, i)."""
    L = problem.repeat
    pairs: dict[tuple[int, int], list[list[float]]] = {}
    weighted = [(e, float(L)) for e in problem.edges] + [
        (e, float(L - 1)) for e in problem.boundary_edges
    ]
    for edge, weight in weighted:
        if weight == 0:
            continue
        i, j = min(edge.src, edge.dst), max(edge.src, edge.dst)
        rows, cols = len(problem.ops[i]), len(problem.ops[j])
        matrix = pairs.setdefault((i, j), [[0.0] * cols for _ in range(rows)])
        for a in range(rows):
            for b in range(cols):
                r = edge.reshard_s[a][b] if edge.src == i else edge.reshard_s[b][a]
                matrix[a][b] += weight * r
    return pairs


def add_one_strategy_constraint(
    lp: LinearProgram, problem: BlockProblem
) -> tuple[tuple[int, ...], ...]:
    """x[i][s] booleans with sum_s x[i][s] = 1; forbidden strategies are fixed to 0."""
    x = []
    for i, table in enumerate(problem.ops):
        row = tuple(
            lp.add_var(0, 1 if math.isfinite(table.compute_s[s]) else 0, True, f"x[{i},{s}]")
            for s in range(len(table))
        )
        lp.add_row(list(row), [1.0] * len(row), 1, 1, f"one_strategy[{i}]")
        x.append(row)
    return tuple(x)


def add_edge_product_constraint(
    lp: LinearProgram,
    x: tuple[tuple[int, ...], ...],
    pair: tuple[int, int],
    cost: list[list[float]],
    integral: bool,
) -> tuple[tuple[int, ...], ...] | None:
    """Costs of one op pair: folded into x when separable, else e[a][b] with marginal rows; an
    infinite cost fixes its e (or, on an op's own diagonal, its x) to 0."""
    i, j = pair
    if i == j:  # a boundary edge from an op to itself: only the diagonal can occur
        for a, xa in enumerate(x[i]):
            if math.isfinite(cost[a][a]):
                lp.add_cost(xa, cost[a][a])
            else:
                lp.add_row([xa], [1.0], 0, 0, f"forbidden[{i}][{a}]")
        return None
    split = split_separable(cost)
    if split is not None:
        for a, xa in enumerate(x[i]):
            lp.add_cost(xa, split[0][a])
        for b, xb in enumerate(x[j]):
            lp.add_cost(xb, split[1][b])
        return None
    e = tuple(
        tuple(lp.add_var(0, 1 if math.isfinite(cost[a][b]) else 0, integral,
                         f"e[{i},{j}][{a},{b}]") for b in range(len(x[j])))
        for a in range(len(x[i]))
    )
    for a, row in enumerate(e):
        lp.add_row([*row, x[i][a]], [1.0] * len(row) + [-1.0], 0, 0, f"edge_row[{i},{j}][{a}]")
        for b, var in enumerate(row):
            if math.isfinite(cost[a][b]):
                lp.add_cost(var, cost[a][b])
    for b in range(len(x[j])):
        col = [e[a][b] for a in range(len(x[i]))]
        lp.add_row([*col, x[j][b]], [1.0] * len(col) + [-1.0], 0, 0, f"edge_col[{i},{j}][{b}]")
    return e



def build_model(problem: BlockProblem, *, integral: bool = False) -> IlpModel:
    """The program of the module docstring; ``integral`` makes every variable integer (CP-SAT)."""
    lp = LinearProgram()
    L = problem.repeat
    x = add_one_strategy_constraint(lp, problem)
    for i, table in enumerate(problem.ops):
        for s, var in enumerate(x[i]):
            if math.isfinite(table.compute_s[s]):
                lp.add_cost(var, L * table.compute_s[s])
    e = {}
    for pair, cost in sorted(pair_costs(problem).items()):
        products = add_edge_product_constraint(lp, x, pair, cost, integral)
        if products is not None:
            e[pair] = products
    for i, (row, weight) in enumerate(zip(x, _tie_weights(problem))):
        for s, var in enumerate(row):
            if s:
                lp.tiebreak[var] = s * weight
    return IlpModel(lp=lp, x=x, e=e)


# -------------------------------------------------------------------------------------- solving


def _decode(model: IlpModel, values: tuple[float, ...]) -> tuple[int, ...]:
    return tuple(
        max(range(len(row)), key=lambda s, row=row: (values[row[s]], -s)) for row in model.x
    )


def solve(
    problem: BlockProblem,
    *,
    time_limit_s: float = 10.0,
    num_workers: int = 8,
    backend: Backend | str = DEFAULT_BACKEND,
    reduce: bool = True,
) -> Solution:
    """Pick per-op strategies, tied across the blocks, minimising compute plus resharding time.
    ``reduce`` (the default) first eliminates the ops of one or two neighbours exactly
    (``ilp_reduce``), so the back end sees only the ops left, or none.

    Returns status ``OPTIMAL``, or ``FEASIBLE`` (time limit hit: the best found and its gap; or
    nothing found: every op's first allowed strategy, gap inf). When the solve finishes, the
    result does not depend on ``num_workers`` except with SCIP (see "Determinism" in the module
    docstring).
    """
    backend = Backend(backend)
    if not time_limit_s > 0:
        raise AutoparError(f"time_limit_s must be > 0, got {time_limit_s}", where="time_limit_s")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise AutoparError(
            f"num_workers must be an integer >= 1, got {num_workers!r}", where="num_workers"
        )
    reduction, reduce_s = None, 0.0
    if reduce:
        start = time.perf_counter()
        reduction = reduce_problem(problem, pair_costs(problem))
        reduce_s = time.perf_counter() - start
    if reduction is not None and reduction.core is None:  # the network reduced away
        strategy = reduction.expand({}, len(problem.ops))
        return Solution(strategy=strategy, objective_s=evaluate(problem, strategy).time_s,
                        status=SolveStatus.OPTIMAL, gap=0.0, wall_s=reduce_s)
    whole = problem if reduction is None else reduction.core
    assert whole is not None
    raw, chosen = _solve_whole(whole, backend, time_limit_s, num_workers)
    if chosen is None:
        strategy, status, gap = first_allowed(problem), SolveStatus.FEASIBLE, math.inf
    else:
        strategy, gap = chosen, raw.gap
        if reduction is not None:
            strategy = reduction.expand(dict(zip(reduction.left, strategy)), len(problem.ops))
        status = SolveStatus.OPTIMAL if raw.status is RawStatus.OPTIMAL else SolveStatus.FEASIBLE
    return Solution(
        strategy=strategy,
        objective_s=evaluate(problem, strategy).time_s,
        status=status,
        gap=gap,
        wall_s=reduce_s + raw.wall_s,
    )


def _solve_whole(problem: BlockProblem, backend: Backend, time_limit_s: float,
                 num_workers: int) -> tuple[RawResult, tuple[int, ...] | None]:
    """The back end's answer to ``problem``'s whole program and the strategy per op it
    decodes to (None where it found no plan)."""
    model = build_model(problem, integral=backend is Backend.CP_SAT)
    raw: RawResult
    if backend is Backend.CP_SAT:
        # A first solution from the start: CP-SAT's own first one can take seconds on 100+ ops.
        hint = model.values_of(first_allowed(problem))
        raw = solve_cp_sat(
            model.lp, time_limit_s=time_limit_s, num_workers=num_workers, hint=hint
        )
    else:
        raw = solve_mip(model.lp, backend, time_limit_s=time_limit_s, num_workers=num_workers)
    return raw, None if raw.values is None else _decode(model, raw.values)


# ------------------------------------------------------------------------------------ explaining


def explain(problem: BlockProblem, solution: Solution) -> str:
    """A table a person reads: the choice per op, and per op the best single-op alternative (the
    other ops unchanged) and how much slower it is. Times in seconds over all blocks."""
    ev = evaluate(problem, solution.strategy)
    lines = [
        f"block of {len(problem.ops)} ops x {problem.repeat} (strategies tied): "
        f"{solution.status.value}, time {ev.time_s:.6g} s "
        f"(compute {ev.compute_s:.6g}, reshard {ev.reshard_s:.6g})",
    ]
    if solution.status is SolveStatus.FEASIBLE:
        lines.append(f"not proven optimal (time limit): relative gap {solution.gap:.3g}")
    lines.append(
        f"{'op':<16} {'strategy':<12} {'compute s':>11}  "
        "runner-up, the rest unchanged (time of all blocks)"
    )
    for i, table in enumerate(problem.ops):
        s = solution.strategy[i]
        best: tuple[float, int] | None = None
        for alt in range(len(table)):
            if alt == s or not math.isfinite(table.compute_s[alt]):
                continue
            trial = list(solution.strategy)
            trial[i] = alt
            key = (evaluate(problem, tuple(trial)).time_s - ev.time_s, alt)
            if best is None or key < best:
                best = key
        why = "-" if best is None else f"{table.names[best[1]]}: {best[0]:+.3g} s"
        lines.append(
            f"{(table.op or f'op{i}'):<16} {table.names[s]:<12} "
            f"{problem.repeat * table.compute_s[s]:>11.4g}  {why}"
        )
    return "\n".join(lines)
