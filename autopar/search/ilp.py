r"""The per-candidate ILP: per-op strategies and checkpointing of one repeated block.

The search enumerates mesh factorisations and micro-batching outside; for each candidate the cost
model fills cost tables (``BlockProblem``) and this module picks, jointly, one sharding strategy
per op — the same in every instance of the repeated block (Alpa / XLA auto-sharding tie the
layers) — and how many of the ``repeat`` blocks use each activation-checkpoint option, under the
per-GPU memory limit. It takes cost tables, not the cost model, so the tests can check it against
brute-force enumeration.

Data
----
* ops :math:`i \in I`, strategies :math:`s \in S_i` with compute time :math:`c_{is}` (its own
  collectives included), forward time :math:`f_{is}` (what recomputing it costs), state bytes
  :math:`m_{is}` (weights, gradients, optimizer share) and saved activation bytes :math:`a_{is}`.
  :math:`c_{is} = \infty` forbids a strategy.
* edges :math:`(i, j) \in E` inside a block with resharding time :math:`R^{ij}_{ab}` (strategy
  :math:`a` of the producer, :math:`b` of the consumer); boundary edges :math:`(i, j) \in B` from op
  :math:`i` of one block to op :math:`j` of the next, present :math:`L - 1` times.
* :math:`L` = ``repeat``; checkpoint options :math:`o \in O` with extra time :math:`t_o` per block,
  activation factor :math:`\varphi_o` and recompute fraction :math:`\rho_o`; the first option
  :math:`r` is the reference. Fixed bytes :math:`M_0`, memory limit :math:`M`.

Variables
---------
* :math:`x_{is} \in \{0, 1\}` — op :math:`i` uses strategy :math:`s` (in every block: tied).
* :math:`e^{ij}_{ab} \in [0, 1]` — the product :math:`x_{ia} x_{jb}`, one matrix per op pair with
  a resharding cost (boolean in CP-SAT). Edges of one pair are summed first, boundary edges weighted
  :math:`L - 1`; a pair whose cost matrix is separable (:math:`u_a + v_b`, constant included) needs
  no product and is folded into the :math:`x` costs.
* :math:`n_o \in \{0, \dots, L\}` — how many blocks use checkpoint option :math:`o`.
* :math:`z_{ois} \in [0, L]` for :math:`o \ne r` — the product :math:`n_o x_{is}` (integer in
  CP-SAT); only where :math:`(\varphi_o - \varphi_r) a_{is}` or :math:`(\rho_o - \rho_r) f_{is}`
  is non-zero.

Constraints (one ``add_*_constraint`` function each)
----------------------------------------------------
* one strategy: :math:`\sum_s x_{is} = 1` for every op.
* edge product (Alpa's linearisation, as marginals): :math:`\sum_b e^{ij}_{ab} = x_{ia}` for every
  :math:`a`, :math:`\sum_a e^{ij}_{ab} = x_{jb}` for every :math:`b`. With integral :math:`x` the
  only solution is the product, so :math:`e` may stay continuous in a MILP.
* checkpoint count: :math:`\sum_o n_o = L`.
* checkpoint product: :math:`\sum_s z_{ois} = n_o` and :math:`z_{ois} \le L x_{is}`; with integral
  :math:`x` this forces :math:`z_{ois} = n_o x_{is}`.
* memory: every block keeps its states; a block under option :math:`o` keeps :math:`\varphi_o`
  of its activations, so with :math:`\sum_o n_o = L`

  .. math:: M_0 + \sum_{is} L (m_{is} + \varphi_r a_{is}) x_{is}
            + \sum_{o \ne r} \sum_{is} (\varphi_o - \varphi_r) a_{is} z_{ois} \le M.

  (All :math:`L` blocks' activations count at once: the caller scales :math:`a` by the micro-batches
  in flight. The transient of one block being recomputed is not modelled.)

Objective
---------
.. math:: \min \; L \sum_{is} c_{is} x_{is} + L \sum_{E} R e + (L - 1) \sum_{B} R e
          + \sum_o t_o n_o + \sum_{is} L \rho_r f_{is} x_{is}
          + \sum_{o \ne r} \sum_{is} (\rho_o - \rho_r) f_{is} z_{ois}

Determinism. The MILP back ends (HiGHS, the default; SCIP; CBC) are deterministic, thread count
included, so equal-cost optima always resolve the same way. CP-SAT's portfolio is not: its
objective gets, strictly below the last cost level, a tie-break preferring low strategy indices
(weight :math:`s \cdot k_i`, fixed pseudo-random :math:`k_i`) and earlier checkpoint options, which
makes the optimum unique, so the answer does not depend on ``num_workers``. (A second
lexicographic solve would do the same for the MILPs but cost 2-37x the first; the back ends may
therefore pick different ones of several equal-cost plans.) A time-limited result depends on the
machine's speed, as any wall-clock limit does.

Memory that cannot fit is found without a solver: the activation term grows with the checkpoint
factor, so the least memory puts every block under the option with the smallest :math:`\varphi` and
then picks, per op, the strategy with the least :math:`L (m_{is} + \varphi_{\min} a_{is})`
(``min_memory``). When even that exceeds :math:`M`, ``solve`` returns status ``INFEASIBLE`` with
that assignment and its memory (it does not raise), so the caller can say how much is missing.
"""

from __future__ import annotations

import math
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
from autopar.search.ilp_types import (
    NO_CHECKPOINT,
    BlockProblem,
    CheckpointOption,
    Edge,
    Evaluation,
    Solution,
    SolveStatus,
    StrategyTable,
)

__all__ = [
    "Backend",
    "BlockProblem",
    "CheckpointOption",
    "Edge",
    "Evaluation",
    "IlpModel",
    "NO_CHECKPOINT",
    "Solution",
    "SolveStatus",
    "StrategyTable",
    "build_model",
    "evaluate",
    "explain",
    "min_memory",
    "solve",
]

DEFAULT_BACKEND = Backend.HIGHS
"""Measured faster on block instances and on the 500-op instances (``bench/results/solver.md``)."""

_MEMORY_MARGIN = 1e-7
"""The memory row of a MILP is tightened by this fraction of the limit, so that the solvers' float
tolerances never return a plan that exceeds the limit when it is evaluated exactly."""


# ----------------------------------------------------------------------------------- evaluation


def _counts_tuple(problem: BlockProblem, checkpoint_counts: dict[str, int]) -> tuple[int, ...]:
    counts = tuple(int(checkpoint_counts.get(o.name, 0)) for o in problem.checkpoint_options)
    unknown = set(checkpoint_counts) - {o.name for o in problem.checkpoint_options}
    if unknown or sum(counts) != problem.repeat or min(counts) < 0:
        raise AutoparError(
            f"checkpoint counts {checkpoint_counts} must be >= 0, name known options and sum to "
            f"repeat={problem.repeat}",
            where="checkpoint_counts",
        )
    return counts


def evaluate(
    problem: BlockProblem, strategy: tuple[int, ...], checkpoint_counts: dict[str, int]
) -> Evaluation:
    """Time and memory of an assignment, straight from the tables (independent of the ILP)."""
    if len(strategy) != len(problem.ops) or any(
        not 0 <= s < len(t) for s, t in zip(strategy, problem.ops)
    ):
        raise AutoparError(
            f"strategy {strategy} does not match the ops of the problem", where="strategy"
        )
    counts = _counts_tuple(problem, checkpoint_counts)
    L = problem.repeat
    compute = L * sum(t.compute_s[s] for t, s in zip(problem.ops, strategy))
    reshard = L * sum(e.reshard_s[strategy[e.src]][strategy[e.dst]] for e in problem.edges)
    reshard += (L - 1) * sum(
        e.reshard_s[strategy[e.src]][strategy[e.dst]] for e in problem.boundary_edges
    )
    forward = sum(t.forward_s[s] for t, s in zip(problem.ops, strategy))
    activation = sum(t.activation_bytes[s] for t, s in zip(problem.ops, strategy))
    opts = problem.checkpoint_options
    checkpoint = sum(
        n * (o.extra_time_s_per_block + o.recompute_fraction * forward)
        for n, o in zip(counts, opts)
    )
    return Evaluation(
        compute_s=compute,
        reshard_s=reshard,
        checkpoint_s=checkpoint,
        state_bytes=L * sum(t.state_bytes[s] for t, s in zip(problem.ops, strategy)),
        activation_bytes=sum(
            n * o.activation_bytes_factor * activation for n, o in zip(counts, opts)
        ),
        fixed_bytes=problem.fixed_bytes,
    )


def min_memory(problem: BlockProblem) -> tuple[tuple[int, ...], dict[str, int], float]:
    """The least-memory assignment (strategy, checkpoint counts, bytes), in closed form.

    Every block under the option with the smallest activation factor (the first on ties), then per
    op the allowed strategy with the least ``state + factor * activation`` (lowest index on ties).
    """
    opts = problem.checkpoint_options
    best = min(range(len(opts)), key=lambda o: (opts[o].activation_bytes_factor, o))
    phi = opts[best].activation_bytes_factor
    strategy = tuple(
        min(
            (s for s in range(len(t)) if math.isfinite(t.compute_s[s])),
            key=lambda s, t=t: (t.state_bytes[s] + phi * t.activation_bytes[s], s),
        )
        for t in problem.ops
    )
    counts = {o.name: (problem.repeat if k == best else 0) for k, o in enumerate(opts)}
    return strategy, counts, evaluate(problem, strategy, counts).memory_bytes


# ------------------------------------------------------------------------------------- building


@dataclass(frozen=True)
class IlpModel:
    """The program and where each decision variable lives in it."""

    lp: LinearProgram
    x: tuple[tuple[int, ...], ...]
    """x[i][s]: op i uses strategy s."""
    e: dict[tuple[int, int], tuple[tuple[int, ...], ...]]
    """e[(i, j)][a][b] = x[i][a] * x[j][b], for op pairs i < j with a non-separable cost."""
    n: tuple[int, ...]
    """n[o]: blocks under checkpoint option o."""
    z: dict[tuple[int, int, int], int]
    """z[(o, i, s)] = n[o] * x[i][s]."""

    def values_of(self, strategy: tuple[int, ...], counts: tuple[int, ...]) -> dict[int, int]:
        """Every variable's value for a plan (``counts`` in option order)."""
        values = {
            var: int(s == strategy[i]) for i, row in enumerate(self.x) for s, var in enumerate(row)
        }
        for (i, j), rows in self.e.items():
            for a, row in enumerate(rows):
                for b, var in enumerate(row):
                    values[var] = int(a == strategy[i] and b == strategy[j])
        values.update({var: counts[o] for o, var in enumerate(self.n)})
        values.update({var: counts[o] * (s == strategy[i]) for (o, i, s), var in self.z.items()})
        return values


def _tie_weights(problem: BlockProblem) -> tuple[list[int], list[int]]:
    """k_i for the strategies (fixed pseudo-random in [512, 1023]) and the checkpoint weights."""
    state = 0x2545F491
    op_weights = []
    for _ in problem.ops:
        state = (state * 1103515245 + 12345) % 2**31
        op_weights.append(512 + state % 512)
    L, num = problem.repeat, len(problem.checkpoint_options)
    if (L + 1) ** (num - 1) * L <= 2**20:
        ck = [(L + 1) ** o for o in range(num)]  # injective on count vectors
    else:
        ck = list(range(num))
    return op_weights, ck


def pair_costs(problem: BlockProblem) -> dict[tuple[int, int], list[list[float]]]:
    """Resharding time per op pair (i < j) over all ``repeat`` blocks: edges weighted ``repeat``,
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


def _split_separable(matrix: list[list[float]]) -> tuple[list[float], list[float]] | None:
    """(u, v) with matrix[a][b] == u[a] + v[b] (to 1e-12 relative), or None."""
    if not all(math.isfinite(c) for row in matrix for c in row):
        return None  # a forbidden pair needs its product variable
    u = [row[0] for row in matrix]
    v = [matrix[0][b] - matrix[0][0] for b in range(len(matrix[0]))]
    tol = 1e-12 * max(max(abs(c) for row in matrix for c in row), 1e-300)
    for a, row in enumerate(matrix):
        for b, c in enumerate(row):
            if abs(c - u[a] - v[b]) > tol:
                return None
    return u, v


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
    split = _split_separable(cost)
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


def add_checkpoint_count_constraint(lp: LinearProgram, problem: BlockProblem) -> tuple[int, ...]:
    """n[o] in 0..repeat with sum_o n[o] = repeat; each n[o] costs its extra time per block."""
    n = tuple(
        lp.add_var(0, problem.repeat, True, f"n[{o.name}]") for o in problem.checkpoint_options
    )
    lp.add_row(list(n), [1.0] * len(n), problem.repeat, problem.repeat, "checkpoint_count")
    for var, option in zip(n, problem.checkpoint_options):
        lp.add_cost(var, option.extra_time_s_per_block)
    return n


def add_checkpoint_product_constraint(
    lp: LinearProgram,
    problem: BlockProblem,
    x: tuple[tuple[int, ...], ...],
    n: tuple[int, ...],
    integral: bool,
) -> dict[tuple[int, int, int], int]:
    """z[o,i,s] = n[o] * x[i][s] for o != reference where it has a memory or time coefficient."""
    ref = problem.checkpoint_options[0]
    L = problem.repeat
    z: dict[tuple[int, int, int], int] = {}
    for o, option in enumerate(problem.checkpoint_options[1:], start=1):
        dphi = option.activation_bytes_factor - ref.activation_bytes_factor
        drho = option.recompute_fraction - ref.recompute_fraction
        for i, table in enumerate(problem.ops):
            used = [
                s
                for s in range(len(table))
                if (dphi and table.activation_bytes[s]) or (drho and table.forward_s[s])
            ]
            if not used:
                continue
            for s in range(len(table)):
                var = lp.add_var(0, L, integral, f"z[{o},{i},{s}]")
                z[(o, i, s)] = var
                lp.add_row([var, x[i][s]], [1.0, -float(L)], -math.inf, 0, f"z_le_x[{o},{i},{s}]")
                lp.add_cost(var, drho * table.forward_s[s])
            vars_ = [z[(o, i, s)] for s in range(len(table))]
            lp.add_row([*vars_, n[o]], [1.0] * len(vars_) + [-1.0], 0, 0, f"z_sum[{o},{i}]")
    return z


def add_memory_constraint(
    lp: LinearProgram,
    problem: BlockProblem,
    x: tuple[tuple[int, ...], ...],
    z: dict[tuple[int, int, int], int],
    memory_limit_bytes: float,
    least_bytes: float,
    integral: bool,
) -> None:
    """M0 + sum L (m + phi_r a) x + sum (phi_o - phi_r) a z <= M (normalised by M);
    ``least_bytes`` is the least memory of any plan (``min_memory``)."""
    if math.isinf(memory_limit_bytes):
        return
    L = problem.repeat
    opts = problem.checkpoint_options
    phi_r = opts[0].activation_bytes_factor
    scale = memory_limit_bytes or 1.0
    vars_: list[int] = []
    coefs: list[float] = []
    for i, table in enumerate(problem.ops):
        for s, var in enumerate(x[i]):
            c = L * (table.state_bytes[s] + phi_r * table.activation_bytes[s])
            if c:
                vars_.append(var)
                coefs.append(c / scale)
    for (o, i, s), var in z.items():
        c = (opts[o].activation_bytes_factor - phi_r) * problem.ops[i].activation_bytes[s]
        if c:
            vars_.append(var)
            coefs.append(c / scale)
    # CP-SAT rounds conservatively itself; float MILPs get a margin against their tolerances,
    # never so much that the least-memory plan (which fits: ``solve`` checked) is cut off.
    margin = (
        0.0 if integral else min(_MEMORY_MARGIN, (memory_limit_bytes - least_bytes) / scale / 2)
    )
    lp.add_row(
        vars_,
        coefs,
        -math.inf,
        (memory_limit_bytes - problem.fixed_bytes) / scale - margin,
        "memory",
    )


def build_model(
    problem: BlockProblem, memory_limit_bytes: float, *, integral: bool = False
) -> IlpModel:
    """The program of the module docstring; ``integral`` makes every variable integer (CP-SAT)."""
    lp = LinearProgram()
    L = problem.repeat
    x = add_one_strategy_constraint(lp, problem)
    ref = problem.checkpoint_options[0]
    for i, table in enumerate(problem.ops):
        for s, var in enumerate(x[i]):
            if math.isfinite(table.compute_s[s]):
                lp.add_cost(
                    var, L * (table.compute_s[s] + ref.recompute_fraction * table.forward_s[s])
                )
    e = {}
    for pair, cost in sorted(pair_costs(problem).items()):
        products = add_edge_product_constraint(lp, x, pair, cost, integral)
        if products is not None:
            e[pair] = products
    n = add_checkpoint_count_constraint(lp, problem)
    z = add_checkpoint_product_constraint(lp, problem, x, n, integral)
    least = min(min_memory(problem)[2], memory_limit_bytes)
    add_memory_constraint(lp, problem, x, z, memory_limit_bytes, least, integral)
    op_weights, ck_weights = _tie_weights(problem)
    for i, row in enumerate(x):
        for s, var in enumerate(row):
            if s:
                lp.tiebreak[var] = s * op_weights[i]
    for o, var in enumerate(n):
        if ck_weights[o]:
            lp.tiebreak[var] = ck_weights[o]
    return IlpModel(lp=lp, x=x, e=e, n=n, z=z)


# -------------------------------------------------------------------------------------- solving


def _decode(
    model: IlpModel, problem: BlockProblem, values: tuple[float, ...]
) -> tuple[tuple[int, ...], dict[str, int]]:
    strategy = tuple(
        max(range(len(row)), key=lambda s, row=row: (values[row[s]], -s)) for row in model.x
    )
    counts = {o.name: int(round(values[v])) for o, v in zip(problem.checkpoint_options, model.n)}
    return strategy, counts


def solve(
    problem: BlockProblem,
    memory_limit_bytes: float,
    *,
    time_limit_s: float = 10.0,
    num_workers: int = 8,
    backend: Backend | str = DEFAULT_BACKEND,
) -> Solution:
    """Pick per-op strategies and checkpoint counts minimising time within ``memory_limit_bytes``.

    Returns status ``OPTIMAL``, ``FEASIBLE`` (time limit hit: the best found and its gap) or
    ``INFEASIBLE`` (never raises for that: the plan is the least-memory one, ``memory_bytes`` the
    least memory achievable). The result does not depend on ``num_workers`` when the solve
    finishes (see "Determinism" in the module docstring).
    """
    backend = Backend(backend)
    if math.isnan(memory_limit_bytes) or memory_limit_bytes < 0:
        raise AutoparError(
            f"memory_limit_bytes must be >= 0, got {memory_limit_bytes}", where="memory_limit_bytes"
        )
    if not time_limit_s > 0:
        raise AutoparError(f"time_limit_s must be > 0, got {time_limit_s}", where="time_limit_s")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise AutoparError(
            f"num_workers must be an integer >= 1, got {num_workers!r}", where="num_workers"
        )
    fallback, fallback_counts, least = min_memory(problem)

    def solution(
        strategy: tuple[int, ...],
        counts: dict[str, int],
        status: SolveStatus,
        gap: float,
        wall_s: float,
    ) -> Solution:
        ev = evaluate(problem, strategy, counts)
        return Solution(
            strategy=strategy,
            checkpoint_counts=counts,
            objective_s=ev.time_s,
            memory_bytes=ev.memory_bytes,
            status=status,
            gap=gap,
            wall_s=wall_s,
            memory_limit_bytes=memory_limit_bytes,
            min_memory_bytes=least,
        )

    if least > memory_limit_bytes:
        return solution(fallback, fallback_counts, SolveStatus.INFEASIBLE, math.inf, 0.0)
    model = build_model(problem, memory_limit_bytes, integral=backend is Backend.CP_SAT)
    raw: RawResult
    if backend is Backend.CP_SAT:
        # The least-memory plan is the hint, and its scaled memory row must stay feasible.
        hint = model.values_of(fallback, _counts_tuple(problem, fallback_counts))
        raw = solve_cp_sat(
            model.lp, time_limit_s=time_limit_s, num_workers=num_workers, hint=hint, must_fit=hint
        )
    else:
        raw = solve_mip(model.lp, backend, time_limit_s=time_limit_s, num_workers=num_workers)
    if raw.values is None:  # nothing found in time: the least-memory plan fits, so return it
        return solution(fallback, fallback_counts, SolveStatus.FEASIBLE, math.inf, raw.wall_s)
    strategy, counts = _decode(model, problem, raw.values)
    if evaluate(problem, strategy, counts).memory_bytes > memory_limit_bytes:
        # Only a plan within the solver's float tolerance (1e-7) of the limit can get here;
        # never return a plan over the limit: the least-memory one fits.
        return solution(fallback, fallback_counts, SolveStatus.FEASIBLE, math.inf, raw.wall_s)
    status = SolveStatus.OPTIMAL if raw.status is RawStatus.OPTIMAL else SolveStatus.FEASIBLE
    return solution(strategy, counts, status, raw.gap, raw.wall_s)


# ------------------------------------------------------------------------------------ explaining


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.3g}"


def explain(problem: BlockProblem, solution: Solution) -> str:
    """A table a person reads: the choice per op, and per op the best single-op alternative and
    why it lost (slower, or over the memory limit). Memory in GiB (2**30 bytes)."""
    ev = evaluate(problem, solution.strategy, solution.checkpoint_counts)
    limit = solution.memory_limit_bytes
    lines = [
        f"block of {len(problem.ops)} ops x {problem.repeat} (strategies tied): "
        f"{solution.status.value}, time {ev.time_s:.6g} s "
        f"(compute {ev.compute_s:.6g}, reshard {ev.reshard_s:.6g}, "
        f"checkpoint {ev.checkpoint_s:.6g}), "
        f"memory {_gib(ev.memory_bytes)} GiB of {_gib(limit)} GiB "
        f"(least possible {_gib(solution.min_memory_bytes)} GiB)",
    ]
    if solution.status is SolveStatus.INFEASIBLE:
        lines.append(
            f"nothing fits: the least-memory plan below needs "
            f"{_gib(ev.memory_bytes - limit)} GiB more "
            f"than the limit; add GPUs to shard over, or raise the limit"
        )
    counts = ", ".join(f"{n} x {name}" for name, n in solution.checkpoint_counts.items() if n)
    lines.append(f"checkpointing: {counts}")
    # activation copies kept over all blocks: sum over options of blocks x factor
    kept = sum(
        solution.checkpoint_counts[o.name] * o.activation_bytes_factor
        for o in problem.checkpoint_options
    )
    lines.append(
        f"{'op':<16} {'strategy':<12} {'compute s':>11} {'mem GiB':>8}  "
        "runner-up, the rest unchanged (columns: all blocks)"
    )
    for i, table in enumerate(problem.ops):
        s = solution.strategy[i]
        best: tuple[float, float, int] | None = None
        for alt in range(len(table)):
            if alt == s or not math.isfinite(table.compute_s[alt]):
                continue
            trial = list(solution.strategy)
            trial[i] = alt
            other = evaluate(problem, tuple(trial), solution.checkpoint_counts)
            key = (other.time_s - ev.time_s, other.memory_bytes - ev.memory_bytes, alt)
            if best is None or key < best:
                best = key
        why = "-"
        if best is not None:
            dt, dm, alt = best
            fits = ev.memory_bytes + dm <= limit
            why = f"{table.names[alt]}: {dt:+.3g} s, {dm / 2**30:+.3g} GiB" + (
                "" if fits else " (over the limit)"
            )
        mem = problem.repeat * table.state_bytes[s] + kept * table.activation_bytes[s]
        lines.append(
            f"{(table.op or f'op{i}'):<16} {table.names[s]:<12} "
            f"{problem.repeat * table.compute_s[s]:>11.4g} "
            f"{_gib(mem):>8}  {why}"
        )
    return "\n".join(lines)
