"""A backend-neutral mixed-integer linear program and the OR-Tools back ends that solve it.

``autopar.search.ilp`` builds a ``LinearProgram`` (its math is in that module's docstring); this
module only translates it:

* ``solve_mip``: ``ortools.linear_solver.pywraplp`` with one of the MILP solvers that OR-Tools
  bundles (HiGHS, SCIP, CBC). Float coefficients, continuous variables allowed.
* ``solve_cp_sat``: ``ortools.sat.python.cp_model``. Every variable must be integer and every
  coefficient is scaled to an integer: the objective to about 2**40 levels over its range (with the
  integer tie-break appended below the last level, so it is exactly lexicographic), each row that
  has non-integer coefficients to about 2**40 levels, rounded so that every integer solution also
  satisfies the float row (coefficients up, the upper bound down).

``LinearProgram.tiebreak`` — small integer weights that decide between solutions of equal cost —
is exact in CP-SAT and ignored by the deterministic MILP solvers.
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
    FEASIBLE = "feasible"
    NO_SOLUTION = "no-solution"
    """No solution found within the time limit (or the program is infeasible)."""


@dataclass
class LinearProgram:
    """min objective·v (then tiebreak·v) s.t. lo <= row·v <= hi and the variable bounds."""

    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    row_vars: list[list[int]] = field(default_factory=list)
    row_coefs: list[list[float]] = field(default_factory=list)
    row_lo: list[float] = field(default_factory=list)
    row_hi: list[float] = field(default_factory=list)
    row_names: list[str] = field(default_factory=list)
    objective: dict[int, float] = field(default_factory=dict)
    """Cost coefficients (seconds per unit of the variable)."""
    objective_offset: float = 0.0
    tiebreak: dict[int, int] = field(default_factory=dict)
    """Non-negative integer weights; among solutions of equal cost the smallest weighted sum wins.
    CP-SAT appends it below the last cost level (its portfolio is not deterministic across
    worker counts); the MILP back ends, deterministic by themselves, ignore it."""

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

    @property
    def num_vars(self) -> int:
        return len(self.lower)

    @property
    def num_rows(self) -> int:
        return len(self.row_lo)


@dataclass(frozen=True)
class RawResult:
    status: RawStatus
    values: tuple[float, ...] | None
    """One value per variable, or None when no solution was found."""
    gap: float
    """(objective - best bound) / objective; 0 when optimal, inf without a bound."""
    wall_s: float


_OBJECTIVE_LEVELS = 2.0**40
_ROW_LEVELS = 2.0**40


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

    These solvers are deterministic (HiGHS checked for 1, 2 and 8 threads), so equal-cost optima
    resolve the same way on every run without the tie-break, which they ignore: a second
    lexicographic solve for it cost 2-37x the first one (``bench/results/solver.md``).
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


def _integral_row(coefs: list[float]) -> bool:
    return all(float(c).is_integer() for c in coefs)


def solve_cp_sat(
    lp: LinearProgram,
    *,
    time_limit_s: float,
    num_workers: int,
    hint: dict[int, int] | None = None,
    must_fit: dict[int, int] | None = None,
    seed: int = 0,
) -> RawResult:
    """Solve with CP-SAT (every variable must be integer). ``must_fit`` is a solution (every
    variable) that the rounding of float rows must keep feasible."""
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
    for js, cs, lo, hi in zip(lp.row_vars, lp.row_coefs, lp.row_lo, lp.row_hi):
        if _integral_row(cs) and all(math.isinf(b) or float(b).is_integer() for b in (lo, hi)):
            expr = cp_model.LinearExpr.weighted_sum([vars_[j] for j in js], [int(c) for c in cs])
            if lo == hi:
                model.add(expr == int(lo))
                continue
            if math.isfinite(lo):
                model.add(expr >= int(lo))
            if math.isfinite(hi):
                model.add(expr <= int(hi))
            continue
        # A float row (the memory limit): only "<= hi" is needed; round so that every integer
        # solution of the scaled row satisfies the float row.
        if math.isfinite(lo):
            raise ValueError(
                "float rows with a lower bound are not supported by the CP-SAT back end"
            )
        span = max(max(abs(c) * lp.upper[j] for j, c in zip(js, cs)), abs(hi), 1e-300)
        unit = span / _ROW_LEVELS
        scaled = [math.ceil(c / unit) for c in cs]
        bound = math.floor(hi / unit)
        if must_fit is not None:
            bound = max(bound, sum(c * must_fit[j] for j, c in zip(js, scaled)))
        model.add(cp_model.LinearExpr.weighted_sum([vars_[j] for j in js], scaled) <= bound)
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
