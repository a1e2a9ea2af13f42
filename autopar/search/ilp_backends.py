"""A backend-neutral mixed-integer linear program and the OR-Tools back ends that solve it.

``autopar.search.ilp`` builds a ``LinearProgram`` (its math is in that module's docstring); this
module only translates it:

* ``solve_mip``: ``ortools.linear_solver.pywraplp`` with one of the MILP solvers that OR-Tools
  bundles (HiGHS, SCIP, CBC). Float coefficients, continuous variables allowed.
* ``solve_cp_sat``: ``ortools.sat.python.cp_model``. Every variable must be integer, and every
  row must have integer coefficients and bounds (the rows ``ilp`` builds have: 0, 1 and -1); the
  objective is scaled to about 2**40 integer levels over its range, with the integer tie-break
  appended below the last level, so it is exactly lexicographic.

``LinearProgram.tiebreak`` — small integer weights that decide between solutions of equal cost —
is exact in CP-SAT and ignored by the MILP solvers.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from enum import StrEnum


class Backend(StrEnum):
    """Which OR-Tools solver runs the program (measured in ``bench/results/solver.md``)."""

    HIGHS = "highs"
    """``pywraplp`` with its bundled HiGHS (branch and cut on the LP relaxation)."""
    CP_SAT = "cp-sat"
    """OR-Tools CP-SAT (portfolio of LP, LNS and SAT workers; wants ~8 workers even on 2 cores)."""
    SCIP = "scip"
    """``pywraplp`` with SCIP."""
    CBC = "cbc"
    """``pywraplp`` with COIN-OR CBC."""


class RawStatus(StrEnum):
    OPTIMAL = "optimal"
    """Proven optimal (to the back end's tolerance)."""
    FEASIBLE = "feasible"
    """A solution, not proven optimal within the time limit."""
    NO_SOLUTION = "no-solution"
    """No solution found within the time limit (or the program is infeasible)."""


@dataclass
class LinearProgram:
    """min objective·v (then tiebreak·v) s.t. lo <= row·v <= hi and the variable bounds."""

    lower: list[float] = field(default_factory=list)
    """Lower bound of each variable."""
    upper: list[float] = field(default_factory=list)
    """Upper bound of each variable."""
    integer: list[bool] = field(default_factory=list)
    """Whether each variable is integer."""
    names: list[str] = field(default_factory=list)
    """Name of each variable (``x[i,s]``, ``e[i,j][a,b]``)."""
    row_vars: list[list[int]] = field(default_factory=list)
    """Variables of each row."""
    row_coefs: list[list[float]] = field(default_factory=list)
    """Coefficients of each row, one per variable of ``row_vars``."""
    row_lo: list[float] = field(default_factory=list)
    """Lower bound of each row (``-inf`` for none)."""
    row_hi: list[float] = field(default_factory=list)
    """Upper bound of each row (``inf`` for none)."""
    row_names: list[str] = field(default_factory=list)
    """Name of each row (``one_strategy[i]``, ``edge_row[i,j][a]``, ...)."""
    objective: dict[int, float] = field(default_factory=dict)
    """Cost coefficients (seconds per unit of the variable)."""
    tiebreak: dict[int, int] = field(default_factory=dict)
    """Non-negative integer weights; among solutions of equal cost the smallest weighted sum wins.
    CP-SAT appends it below the last cost level (its portfolio is not deterministic across
    worker counts); the MILP back ends ignore it (HiGHS and CBC are deterministic by themselves,
    SCIP with one thread)."""

    def add_var(self, lo: float, hi: float, integer: bool, name: str) -> int:
        self.lower.append(lo)
        self.upper.append(hi)
        self.integer.append(integer)
        self.names.append(name)
        return len(self.lower) - 1

    def add_row(
        self, vars_: list[int], coefs: list[float], lo: float, hi: float, name: str
    ) -> None:
        self.row_vars.append(vars_)
        self.row_coefs.append(coefs)
        self.row_lo.append(lo)
        self.row_hi.append(hi)
        self.row_names.append(name)

    def add_cost(self, var: int, cost_s: float) -> None:
        if cost_s:
            self.objective[var] = self.objective.get(var, 0.0) + cost_s


@dataclass(frozen=True)
class RawResult:
    """What a back end returns, before ``ilp`` decodes it."""

    status: RawStatus
    """Whether the back end proved optimality, found a solution, or found none."""
    values: tuple[float, ...] | None
    """One value per variable, or None when no solution was found."""
    gap: float
    """(objective - best bound) / objective; 0 when optimal, inf without a bound."""
    wall_s: float
    """Seconds from building the back end's model to its answer."""


_OBJECTIVE_LEVELS = 2.0**40
"""Integer levels CP-SAT's objective is scaled to over its range (fewer when the tie-break needs
room below 2**52)."""


def _relative_gap(objective: float, bound: float) -> float:
    if not math.isfinite(bound):
        return math.inf
    return max(0.0, objective - bound) / max(abs(objective), 1e-300)


def solve_mip(
    lp: LinearProgram,
    backend: Backend,
    *,
    time_limit_s: float,
    num_workers: int,
    relative_gap: float = 1e-9,
) -> RawResult:
    """Solve with ``pywraplp``; ``backend`` is HIGHS, SCIP or CBC.

    HiGHS and CBC are deterministic (HiGHS checked for 1, 2 and 8 threads; CBC runs on one
    thread), so equal-cost optima resolve the same way on every run without the tie-break, which
    they ignore: a second lexicographic solve for it cost 2-37x the first one
    (``bench/results/solver.md``). SCIP is deterministic with one thread only.
    """
    from ortools.linear_solver import pywraplp

    start = time.perf_counter()
    solver = pywraplp.Solver.CreateSolver(backend.name)
    if solver is None:
        raise RuntimeError(f"OR-Tools was built without the {backend.name} solver")
    inf = solver.infinity()
    # The objective is normalised to coefficients of about 1 so that the solvers' absolute
    # tolerances (1e-6) mean the same on every instance.
    scale = max((abs(c) for c in lp.objective.values()), default=1.0) or 1.0
    vars_ = [
        (solver.IntVar if integral else solver.NumVar)(
            lo if math.isfinite(lo) else -inf, hi if math.isfinite(hi) else inf, name
        )
        for lo, hi, integral, name in zip(lp.lower, lp.upper, lp.integer, lp.names)
    ]
    for js, cs, lo, hi, name in zip(lp.row_vars, lp.row_coefs, lp.row_lo, lp.row_hi, lp.row_names):
        row = solver.Constraint(
            lo if math.isfinite(lo) else -inf, hi if math.isfinite(hi) else inf, name
        )
        for j, c in zip(js, cs):
            row.SetCoefficient(vars_[j], c)
    objective = solver.Objective()
    for j, c in lp.objective.items():
        objective.SetCoefficient(vars_[j], c / scale)
    objective.SetMinimization()
    if backend is not Backend.CBC:  # CBC's command parser rejects "threads" and says so on stdout
        solver.SetNumThreads(num_workers)
    if backend is Backend.HIGHS:
        # HiGHS prints a banner on stdout unless told not to (SuppressOutput is not enough).
        solver.SetSolverSpecificParametersAsString("output_flag = false\n")
    # No solver.SetHint: pywraplp does not pass hints to HiGHS (google/or-tools#4737, added to
    # MathOpt only) and with OR-Tools 9.15 / HiGHS 1.12 the call crashed the process here.
    params = pywraplp.MPSolverParameters()
    params.SetDoubleParam(params.RELATIVE_MIP_GAP, relative_gap)
    solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))
    code = solver.Solve(params)
    if code not in (pywraplp.Solver.OPTIMAL, pywraplp.Solver.FEASIBLE):
        return RawResult(RawStatus.NO_SOLUTION, None, math.inf, time.perf_counter() - start)
    values = tuple(v.solution_value() for v in vars_)
    value = objective.Value()
    if code == pywraplp.Solver.OPTIMAL:
        status, gap = RawStatus.OPTIMAL, 0.0
    else:
        status, gap = RawStatus.FEASIBLE, _relative_gap(value, objective.BestBound())
    return RawResult(status, values, gap, time.perf_counter() - start)


def _integral_row(coefs: list[float], lo: float, hi: float) -> bool:
    """Integer coefficients, and bounds integer or infinite."""
    return all(float(c).is_integer() for c in coefs) and all(
        math.isinf(b) or float(b).is_integer() for b in (lo, hi)
    )


def solve_cp_sat(
    lp: LinearProgram,
    *,
    time_limit_s: float,
    num_workers: int,
    hint: dict[int, int] | None = None,
    seed: int = 0,
) -> RawResult:
    """Solve with CP-SAT (every variable integer, every row integral); ``hint`` is a value per
    variable to start from."""
    from ortools.sat.python import cp_model

    start = time.perf_counter()
    if not all(lp.integer):
        raise ValueError(
            "CP-SAT needs every variable integer; build the program with integral=True"
        )
    model = cp_model.CpModel()
    vars_ = [
        model.new_int_var(int(math.ceil(lo)), int(math.floor(hi)), name)
        for lo, hi, name in zip(lp.lower, lp.upper, lp.names)
    ]
    for js, cs, lo, hi, name in zip(lp.row_vars, lp.row_coefs, lp.row_lo, lp.row_hi, lp.row_names):
        if not _integral_row(cs, lo, hi):
            raise ValueError(f"CP-SAT needs integral rows; row {name} is not")
        expr = cp_model.LinearExpr.weighted_sum([vars_[j] for j in js], [int(c) for c in cs])
        if lo == hi:
            model.add(expr == int(lo))
            continue
        if math.isfinite(lo):
            model.add(expr >= int(lo))
        if math.isfinite(hi):
            model.add(expr <= int(hi))
    # cost levels x tie-break levels stay below 2**52, so the scaled objective is exact in the
    # doubles of CP-SAT's LP relaxation too.
    tie_levels = 1 + sum(w * int(lp.upper[j]) for j, w in lp.tiebreak.items())
    span = sum(abs(c) * lp.upper[j] for j, c in lp.objective.items()) or 1.0
    unit = span / max(2.0**20, min(_OBJECTIVE_LEVELS, 2.0**52 / tie_levels))
    cost = {j: round(c / unit) * tie_levels for j, c in lp.objective.items()}
    for j, w in lp.tiebreak.items():
        cost[j] = cost.get(j, 0) + w
    terms = sorted((j, c) for j, c in cost.items() if c)
    model.minimize(
        cp_model.LinearExpr.weighted_sum([vars_[j] for j, _ in terms], [c for _, c in terms])
    )
    if hint:
        for j, v in sorted(hint.items()):
            model.add_hint(vars_[j], v)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = time_limit_s
    solver.parameters.num_workers = num_workers
    solver.parameters.random_seed = seed
    code = solver.solve(model)
    wall_s = time.perf_counter() - start
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return RawResult(RawStatus.NO_SOLUTION, None, math.inf, wall_s)
    values = tuple(float(solver.value(v)) for v in vars_)
    if code == cp_model.OPTIMAL:
        return RawResult(RawStatus.OPTIMAL, values, 0.0, wall_s)
    gap = _relative_gap(solver.objective_value, solver.best_objective_bound)
    return RawResult(RawStatus.FEASIBLE, values, gap, wall_s)
