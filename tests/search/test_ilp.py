"""The per-candidate ILP against brute force, and the answers it must rediscover."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from autopar.core.errors import AutoparError
from autopar.search.ilp import (
    NO_CHECKPOINT,
    Backend,
    BlockProblem,
    CheckpointOption,
    Edge,
    Solution,
    SolveStatus,
    StrategyTable,
    evaluate,
    explain,
    min_memory,
    solve,
)

BACKENDS = (Backend.HIGHS, Backend.CP_SAT)
OPTIONS = (
    NO_CHECKPOINT,
    CheckpointOption(
        "selective", extra_time_s_per_block=0.3, activation_bytes_factor=0.5, recompute_fraction=0.1
    ),
    CheckpointOption(
        "full", extra_time_s_per_block=0.05, activation_bytes_factor=0.1, recompute_fraction=1.0
    ),
)


def random_problem(seed: int, *, checkpoint: bool = True, ties: bool = False) -> BlockProblem:
    """3-6 ops, 2-4 strategies, a random DAG, one boundary edge, repeat 1-4; ``ties`` copies a
    strategy of every op (same costs, same resharding) so that optima tie."""
    rng = random.Random(seed)
    num_ops = rng.randint(3, 6)
    sizes = [rng.randint(2, 4) for _ in range(num_ops)]
    base = (
        [[rng.randrange(len_) for _ in range(len_)] for len_ in sizes]
        if ties
        else [list(range(k)) for k in sizes]
    )
    cols = [
        [
            (rng.uniform(1, 10), rng.uniform(0, 100), rng.uniform(0, 100), rng.uniform(0, 3))
            for _ in range(k)
        ]
        for k in sizes
    ]
    ops = tuple(
        StrategyTable(
            names=tuple(f"s{s}" for s in range(k)),
            compute_s=tuple(cols[i][base[i][s]][0] for s in range(k)),
            state_bytes=tuple(cols[i][base[i][s]][1] for s in range(k)),
            activation_bytes=tuple(cols[i][base[i][s]][2] for s in range(k)),
            forward_s=tuple(cols[i][base[i][s]][3] for s in range(k)),
            op=f"op{i}",
        )
        for i, k in enumerate(sizes)
    )

    def matrix(i: int, j: int) -> tuple[tuple[float, ...], ...]:
        raw = [[rng.uniform(0, 5) for _ in range(sizes[j])] for _ in range(sizes[i])]
        return tuple(
            tuple(raw[base[i][a]][base[j][b]] for b in range(sizes[j])) for a in range(sizes[i])
        )

    edges = []
    for j in range(1, num_ops):
        for i in rng.sample(range(j), k=min(j, rng.randint(1, 2))):
            edges.append(Edge(i, j, matrix(i, j)))
    boundary = (Edge(num_ops - 1, 0, matrix(num_ops - 1, 0)),)
    return BlockProblem(
        ops,
        tuple(edges),
        rng.randint(1, 4),
        boundary,
        OPTIONS if checkpoint else (NO_CHECKPOINT,),
        fixed_bytes=7.0,
    )


def all_plans(problem: BlockProblem):
    """Every (strategy, checkpoint counts) of a problem."""
    names = [o.name for o in problem.checkpoint_options]
    counts = [
        c
        for c in itertools.product(range(problem.repeat + 1), repeat=len(names))
        if sum(c) == problem.repeat
    ]
    for strategy in itertools.product(*(range(len(t)) for t in problem.ops)):
        if all(math.isfinite(t.compute_s[s]) for t, s in zip(problem.ops, strategy)):
            for c in counts:
                yield strategy, dict(zip(names, c))


def brute_force(
    problem: BlockProblem, limit: float
) -> tuple[float, list[tuple[tuple[int, ...], dict[str, int]]]]:
    """The least time within ``limit`` and every plan within 1e-9 of it."""
    scored = [(evaluate(problem, s, c), s, c) for s, c in all_plans(problem)]
    fitting = [(ev.time_s, s, c) for ev, s, c in scored if ev.memory_bytes <= limit]
    best = min(t for t, _, _ in fitting)
    return best, [(s, c) for t, s, c in fitting if t <= best * (1 + 1e-9)]


def unconstrained_memory(problem: BlockProblem) -> float:
    plans = [evaluate(problem, s, c) for s, c in all_plans(problem)]
    return min(plans, key=lambda ev: ev.time_s).memory_bytes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("binding", [False, True])
def test_matches_brute_force_on_random_small_instances(
    seed: int, binding: bool, backend: Backend
) -> None:
    problem = random_problem(seed, checkpoint=seed % 3 != 0)
    least = min_memory(problem)[2]
    limit = least + 0.4 * (unconstrained_memory(problem) - least) if binding else math.inf
    best, optima = brute_force(problem, limit)
    sol = solve(problem, limit, backend=backend)
    assert sol.status is SolveStatus.OPTIMAL
    assert sol.objective_s == pytest.approx(best, rel=1e-7)
    assert sol.memory_bytes <= limit
    assert (sol.strategy, sol.checkpoint_counts) in optima
    assert sum(sol.checkpoint_counts.values()) == problem.repeat


def test_binding_memory_limit_changes_the_answer() -> None:
    """The random instances above really exercise the memory row: tight limits cost time."""
    changed = 0
    for seed in range(10):
        problem = random_problem(seed)
        least = min_memory(problem)[2]
        limit = least + 0.4 * (unconstrained_memory(problem) - least)
        changed += brute_force(problem, limit)[0] > brute_force(problem, math.inf)[0] * (1 + 1e-9)
    assert changed >= 5


def test_checkpointing_is_chosen_per_block_when_memory_binds() -> None:
    """One op, no strategy choice: the limit fits exactly 3 of 8 blocks without recomputation."""
    op = StrategyTable(
        ("only",),
        compute_s=(1.0,),
        state_bytes=(10.0,),
        activation_bytes=(100.0,),
        forward_s=(0.4,),
    )
    full = CheckpointOption("full", activation_bytes_factor=0.0, recompute_fraction=1.0)
    problem = BlockProblem((op,), repeat=8, checkpoint_options=(NO_CHECKPOINT, full))
    sol = solve(problem, 8 * 10.0 + 3 * 100.0)
    assert sol.checkpoint_counts == {"none": 3, "full": 5}
    assert sol.objective_s == pytest.approx(8 * 1.0 + 5 * 0.4)


@pytest.mark.parametrize("seed", range(6))
def test_min_memory_is_the_least_over_all_plans(seed: int) -> None:
    problem = random_problem(seed)
    strategy, counts, least = min_memory(problem)
    assert least == pytest.approx(
        min(evaluate(problem, s, c).memory_bytes for s, c in all_plans(problem))
    )
    assert evaluate(problem, strategy, counts).memory_bytes == pytest.approx(least)


def test_strategies_are_tied_across_blocks_even_when_alternating_would_be_free() -> None:
    """Boundary resharding is free only between different strategies; a per-block choice would
    alternate, the tied one pays (repeat - 1) boundary reshards."""
    op = StrategyTable(
        ("a", "b"), compute_s=(1.0, 1.2), state_bytes=(0.0, 0.0), activation_bytes=(0.0, 0.0)
    )
    boundary = Edge(0, 0, ((5.0, 0.0), (0.0, 0.1)))
    problem = BlockProblem((op,), repeat=6, boundary_edges=(boundary,))
    sol = solve(problem, math.inf)
    assert sol.strategy == (1,)
    assert sol.objective_s == pytest.approx(6 * 1.2 + 5 * 0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_costs_and_memory_scale_with_repeat(backend: Backend) -> None:
    one = random_problem(3, checkpoint=False)
    one = BlockProblem(one.ops, one.edges, 1, fixed_bytes=0.0)
    many = BlockProblem(one.ops, one.edges, 9, fixed_bytes=0.0)
    a = solve(one, math.inf, backend=backend)
    b = solve(many, math.inf, backend=backend)
    assert b.strategy == a.strategy
    assert b.objective_s == pytest.approx(9 * a.objective_s)
    assert b.memory_bytes == pytest.approx(9 * a.memory_bytes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_infeasible_returns_the_least_memory_plan(backend: Backend) -> None:
    problem = random_problem(5)
    strategy, counts, least = min_memory(problem)
    sol = solve(problem, 0.9 * least, backend=backend)
    assert sol.status is SolveStatus.INFEASIBLE
    assert sol.memory_bytes == pytest.approx(least)
    assert sol.min_memory_bytes == pytest.approx(least)
    assert (sol.strategy, sol.checkpoint_counts) == (strategy, counts)
    assert "nothing fits" in explain(problem, sol)


def _without_wall(sol: Solution) -> tuple:
    return (
        sol.strategy,
        tuple(sol.checkpoint_counts.items()),
        sol.objective_s,
        sol.memory_bytes,
        sol.status,
        sol.gap,
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
def test_same_solution_for_1_2_8_workers(seed: int, backend: Backend) -> None:
    problem = random_problem(100 + seed, ties=True)
    least = min_memory(problem)[2]
    limit = least + 0.5 * (unconstrained_memory(problem) - least)
    best, optima = brute_force(problem, limit)
    assert len(optima) > 1  # the instance has ties to break
    results = {
        workers: _without_wall(solve(problem, limit, num_workers=workers, backend=backend))
        for workers in (1, 2, 8)
    }
    assert len(set(results.values())) == 1, results
    assert results[1][2] == pytest.approx(best, rel=1e-7)
    again = _without_wall(solve(problem, limit, num_workers=8, backend=backend))
    assert again == results[8]


def test_cp_sat_resolves_equal_strategies_to_the_lower_index() -> None:
    op = StrategyTable(
        ("first", "twin"), compute_s=(1.0, 1.0), state_bytes=(1.0, 1.0), activation_bytes=(1.0, 1.0)
    )
    problem = BlockProblem((op, op), (Edge(0, 1, ((0.0, 0.0), (0.0, 0.0))),), repeat=3)
    assert solve(problem, math.inf, backend=Backend.CP_SAT).strategy == (0, 0)


def megatron_mlp(tp: int = 4) -> BlockProblem:
    """Norm -> fc1 (h -> 4h) -> GeLU -> fc2 (4h -> h) -> residual add on a tensor-parallel axis.

    A linear is replicated ("rep"), split by output columns ("col": output sharded on the last
    dim, no communication) or by input rows ("row": input sharded, output partial and all-reduced).
    Resharding a sharded tensor to replicated is an all-gather; slicing a replicated one is free.
    """
    hidden, tokens = 4096, 8192
    flop_per_s, bytes_per_s = 300e12, 100e9
    act = lambda width: tokens * width * 2.0  # noqa: E731  bf16 bytes of a [tokens, width] tensor
    all_reduce = lambda nbytes: 2 * (tp - 1) / tp * nbytes / bytes_per_s  # noqa: E731
    all_gather = lambda nbytes: (tp - 1) / tp * nbytes / bytes_per_s  # noqa: E731

    def linear(name: str, d_in: int, d_out: int) -> StrategyTable:
        flop = 6.0 * tokens * d_in * d_out
        params = d_in * d_out
        return StrategyTable(
            ("rep", "col", "row"),
            compute_s=(
                flop / flop_per_s,
                flop / tp / flop_per_s,
                flop / tp / flop_per_s + all_reduce(act(d_out)),
            ),
            state_bytes=(16.0 * params, 16.0 * params / tp, 16.0 * params / tp),
            activation_bytes=(act(d_in), act(d_in), act(d_in) / tp),
            op=name,
        )

    def pointwise(name: str, width: int, layouts: tuple[str, ...]) -> StrategyTable:
        shards = {"R": 1, "S": tp}
        return StrategyTable(
            layouts,
            compute_s=tuple(act(width) * 3 / 2e12 / shards[x] for x in layouts),
            state_bytes=(0.0,) * len(layouts),
            activation_bytes=tuple(act(width) / shards[x] for x in layouts),
            op=name,
        )

    norm = pointwise("norm", hidden, ("R",))
    fc1 = linear("fc1", hidden, 4 * hidden)
    gelu = pointwise("gelu", 4 * hidden, ("R", "S"))
    fc2 = linear("fc2", 4 * hidden, hidden)
    add = pointwise("residual", hidden, ("R",))
    out_layout = {"rep": "R", "col": "S", "row": "R"}  # what each linear strategy produces
    in_layout = {"rep": "R", "col": "R", "row": "S"}  # what each linear strategy consumes

    def cost(src: str, dst: str, nbytes: float) -> float:
        return all_gather(nbytes) if (src, dst) == ("S", "R") else 0.0

    def edge(i: int, j: int, src: tuple[str, ...], dst: tuple[str, ...], width: int) -> Edge:
        return Edge(i, j, tuple(tuple(cost(a, b, act(width)) for b in dst) for a in src))

    lin_out = tuple(out_layout[n] for n in fc1.names)
    lin_in = tuple(in_layout[n] for n in fc1.names)
    edges = (
        edge(0, 1, ("R",), lin_in, hidden),
        edge(1, 2, lin_out, gelu.names, 4 * hidden),
        edge(2, 3, gelu.names, lin_in, 4 * hidden),
        edge(3, 4, lin_out, ("R",), hidden),
        edge(0, 4, ("R",), ("R",), hidden),
    )
    return BlockProblem((norm, fc1, gelu, fc2, add), edges, repeat=24)


@pytest.mark.parametrize("backend", BACKENDS)
def test_megatron_column_then_row_comes_out_of_the_solve(backend: Backend) -> None:
    problem = megatron_mlp()
    sol = solve(problem, math.inf, backend=backend)
    chosen = {t.op: t.names[s] for t, s in zip(problem.ops, sol.strategy)}
    assert (chosen["fc1"], chosen["gelu"], chosen["fc2"]) == ("col", "S", "row")
    # col-then-row pays exactly one all-reduce (of fc2's output) and no resharding
    assert evaluate(problem, sol.strategy, sol.checkpoint_counts).reshard_s == 0.0
    text = explain(problem, sol)
    assert "fc1" in text and "col" in text


def test_megatron_other_combinations_are_worse() -> None:
    problem = megatron_mlp()
    best = solve(problem, math.inf).objective_s
    for fc1, fc2 in itertools.product(range(3), repeat=2):
        if (fc1, fc2) != (1, 2):
            other = min(
                evaluate(problem, (0, fc1, g, fc2, 0), {"none": 24}).time_s for g in range(2)
            )
            assert other > best * 1.01


def test_forbidden_strategy_is_never_chosen() -> None:
    op = StrategyTable(
        ("fast", "ok"),
        compute_s=(math.inf, 2.0),
        state_bytes=(0.0, 0.0),
        activation_bytes=(0.0, 0.0),
    )
    problem = BlockProblem((op,), repeat=2)
    for backend in BACKENDS:
        assert solve(problem, math.inf, backend=backend).strategy == (1,)


def test_time_limit_returns_best_found_with_a_gap() -> None:
    rng = random.Random(7)
    num_ops, k = 150, 8
    ops = tuple(
        StrategyTable(
            tuple(f"s{s}" for s in range(k)),
            tuple(rng.uniform(0.5, 2.0) for _ in range(k)),
            tuple(rng.uniform(0, 1e8) for _ in range(k)),
            tuple(rng.uniform(0, 1e8) for _ in range(k)),
        )
        for _ in range(num_ops)
    )
    edges = tuple(
        Edge(i, j, tuple(tuple(rng.uniform(0, 1.0) for _ in range(k)) for _ in range(k)))
        for i in range(num_ops)
        for j in (i + 1, i + 3)
        if j < num_ops
    )
    problem = BlockProblem(ops, edges, repeat=1)
    limit = min_memory(problem)[2] * 1.15
    sol = solve(problem, limit, time_limit_s=0.2)
    assert sol.status is SolveStatus.FEASIBLE
    assert sol.gap > 0
    assert sol.memory_bytes <= limit


@pytest.mark.parametrize(
    "build",
    [
        lambda: StrategyTable(("a", "a"), (1.0, 1.0), (0.0, 0.0), (0.0, 0.0)),
        lambda: StrategyTable(("a",), (1.0, 2.0), (0.0,), (0.0,)),
        lambda: StrategyTable(("a",), (-1.0,), (0.0,), (0.0,)),
        lambda: StrategyTable(("a",), (math.inf,), (0.0,), (0.0,)),
        lambda: BlockProblem(
            (StrategyTable(("a",), (1.0,), (0.0,), (0.0,)),), (Edge(0, 1, ((0.0,),)),)
        ),
        lambda: BlockProblem((StrategyTable(("a",), (1.0,), (0.0,), (0.0,)),), repeat=0),
        lambda: BlockProblem(
            (
                StrategyTable(("a",), (1.0,), (0.0,), (0.0,)),
                StrategyTable(("a", "b"), (1.0, 1.0), (0.0, 0.0), (0.0, 0.0)),
            ),
            (Edge(0, 1, ((0.0,),)),),
        ),
    ],
)
def test_bad_tables_are_rejected_with_a_message(build) -> None:
    with pytest.raises(AutoparError):
        build()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_limit_of_exactly_the_least_memory_is_feasible(backend: Backend) -> None:
    problem = random_problem(4)
    strategy, counts, least = min_memory(problem)
    sol = solve(problem, least, backend=backend)
    assert sol.status is SolveStatus.OPTIMAL
    assert sol.memory_bytes <= least
    assert sol.objective_s == pytest.approx(brute_force(problem, least)[0], rel=1e-7)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(6))
def test_forbidden_pairs_are_never_chosen_and_brute_force_agrees(seed: int,
                                                                 backend: Backend) -> None:
    """An infinite resharding cost forbids a pair; costs of 1e-5 s next to it keep their
    precision (a finite big-M of 1e4 s in its place once made HiGHS report a 3x worse plan as
    optimal)."""
    problem = random_problem(seed, checkpoint=False)
    rng = random.Random(seed)
    edges = []
    for edge in problem.edges:
        rows = [[c * 1e-5 for c in row] for row in edge.reshard_s]
        for row in rows[1:]:  # strategy 0 of the producer can always be followed
            row[rng.randrange(len(row))] = math.inf
        edges.append(Edge(edge.src, edge.dst, tuple(tuple(r) for r in rows)))
    problem = BlockProblem(ops=problem.ops, edges=tuple(edges), repeat=problem.repeat)
    best, optima = brute_force(problem, math.inf)
    sol = solve(problem, math.inf, backend=backend)
    assert math.isfinite(sol.objective_s)
    assert sol.objective_s == pytest.approx(best, rel=1e-7)
    assert (sol.strategy, sol.checkpoint_counts) in optima
