"""The exact reduction of the per-block ILP (``autopar/search/ilp_reduce.py``): the ops of one or
two neighbours eliminated, the rest solved, every op read back -- held to brute force."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from autopar.search.ilp import evaluate, pair_costs, solve
from autopar.search.ilp_reduce import reduce_problem
from autopar.search.ilp_types import BlockProblem, Edge, SolveStatus, StrategyTable


def brute_force(problem: BlockProblem) -> tuple[float, list[tuple[int, ...]]]:
    """The least time over every assignment, and the assignments within 1e-9 of it."""
    scored = [(evaluate(problem, s).time_s, s)
              for s in itertools.product(*(range(len(t)) for t in problem.ops))]
    best = min(t for t, _ in scored)
    return best, [s for t, s in scored if t <= best * (1 + 1e-9)]


def dense_problem(seed: int, *, forbid: float = 0.0) -> BlockProblem:
    """6-8 ops of 2-3 strategies, each pair joined with probability 0.5 (so that some ops keep
    three or more neighbours and a core is left for the back end), a boundary edge, repeat
    1-3; ``forbid``: the chance that a resharding entry is infinite."""
    rng = random.Random(seed)
    n = rng.randint(6, 8)
    sizes = [rng.randint(2, 3) for _ in range(n)]
    ops = tuple(StrategyTable(tuple(f"s{s}" for s in range(k)),
                              tuple(rng.uniform(1, 10) for _ in range(k)), op=f"op{i}")
                for i, k in enumerate(sizes))

    def matrix(i: int, j: int):
        return tuple(tuple(math.inf if rng.random() < forbid else rng.uniform(0, 5)
                           for _ in range(sizes[j])) for _ in range(sizes[i]))

    edges = tuple(Edge(i, j, matrix(i, j)) for i, j in itertools.combinations(range(n), 2)
                  if rng.random() < 0.5)
    return BlockProblem(ops, edges, rng.randint(1, 3), (Edge(n - 1, 0, matrix(n - 1, 0)),))


@pytest.mark.parametrize("seed", range(30))
def test_reduced_solve_is_a_brute_force_optimum(seed: int) -> None:
    problem = dense_problem(seed)
    best, optima = brute_force(problem)
    sol = solve(problem)
    assert sol.status is SolveStatus.OPTIMAL
    assert sol.objective_s == pytest.approx(best, rel=1e-9)
    assert sol.strategy in optima


def test_dense_instances_leave_a_core_and_sparse_ones_none() -> None:
    """What the tests above exercise: both the back end on a core and the read-back alone."""
    left = [len(reduce_problem(p, pair_costs(p)).left) for p in map(dense_problem, range(30))]
    assert sum(k > 0 for k in left) >= 10 and sum(k == 0 for k in left) >= 1


@pytest.mark.parametrize("seed", range(20))
def test_forbidden_pairs_agree_with_brute_force_and_the_whole_program(seed: int) -> None:
    problem = dense_problem(seed, forbid=0.3)
    feasible = math.isfinite(brute_force(problem)[0])
    sol, whole = solve(problem), solve(problem, reduce=False)
    if not feasible:
        assert (sol.strategy, sol.gap) == (whole.strategy, whole.gap) and math.isinf(sol.gap)
        return
    assert sol.objective_s == pytest.approx(whole.objective_s, rel=1e-9)
    assert sol.objective_s == pytest.approx(brute_force(problem)[0], rel=1e-9)


def test_a_chain_reduces_away_and_ties_go_to_the_lower_index() -> None:
    """A 60-op chain (a block's norms, projections and adds) needs no back end; where two
    strategies cost the same everywhere, the lower index is chosen."""
    rng = random.Random(3)
    ops = [StrategyTable(("a", "b", "c"), (1.0, 1.0, rng.uniform(1, 3))) for _ in range(60)]
    same = ((0.0, 0.0, 2.0), (0.0, 0.0, 2.0), (2.0, 2.0, 0.5))
    edges = [Edge(i, i + 1, same) for i in range(59)]
    problem = BlockProblem(tuple(ops), tuple(edges), repeat=4, boundary_edges=(Edge(59, 0, same),))
    reduction = reduce_problem(problem, pair_costs(problem))
    assert reduction is not None and reduction.left == [] and reduction.core is None
    sol = solve(problem)
    assert sol.status is SolveStatus.OPTIMAL and sol.gap == 0.0
    assert sol.objective_s == pytest.approx(solve(problem, reduce=False).objective_s, rel=1e-12)
    assert set(sol.strategy) <= {0, 2} and 1 not in sol.strategy


def test_larger_sparse_instances_agree_with_the_whole_program() -> None:
    """120 ops, chains with skip edges every few ops (residual branches): the reduced and the
    whole program reach the same time."""
    rng = random.Random(11)
    n, k = 120, 4
    ops = tuple(StrategyTable(tuple(f"s{s}" for s in range(k)),
                              tuple(rng.uniform(0.5, 2.0) for _ in range(k))) for _ in range(n))
    edges = tuple(Edge(i, j, tuple(tuple(rng.uniform(0, 1.0) for _ in range(k))
                                   for _ in range(k)))
                  for i in range(n) for j in (i + 1, i + 4) if j < n and (j == i + 1 or i % 5 == 0))
    problem = BlockProblem(ops, edges, repeat=8)
    reduced, whole = solve(problem), solve(problem, reduce=False)
    assert reduced.status is whole.status is SolveStatus.OPTIMAL
    assert reduced.objective_s == pytest.approx(whole.objective_s, rel=1e-9)
