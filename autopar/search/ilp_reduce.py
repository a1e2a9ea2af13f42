r"""The per-block ILP made smaller, exactly, before a solver sees it: ops of one or two neighbours
eliminated by dynamic programming.

``ilp``'s program is a pairwise cost over the ops' strategies:
:math:`\min_s \sum_i u_i(s_i) + \sum_{(i,j)} C^{ij}(s_i, s_j)`, with :math:`u_i` an op's own
time over the ``repeat`` blocks (and what ``ilp`` folds into it: separable pairs, an op's pair
with itself) and :math:`C^{ij}` the non-separable resharding matrices (``ilp.pair_costs``).
Most ops of a transformer block sit on a chain (a norm, an activation, a residual add): they
have at most two neighbours once the separable pairs are folded. Such an op :math:`i` leaves the
program without changing its optimum (variable elimination in a min-sum network):

* no neighbour: its best strategy is :math:`\arg\min_a u_i(a)`;
* one neighbour :math:`j`: :math:`u_j(b) \mathrel{+}= \min_a [u_i(a) + C^{ij}(a, b)]`;
* two neighbours :math:`j, k`: :math:`C^{jk}(b, c) \mathrel{+}= \min_a [u_i(a) + C^{ij}(a, b)
  + C^{ik}(a, c)]`, a new pair (or added to theirs), folded into :math:`u_j, u_k` when separable.

Each elimination records its arg-min table; once the solver has chosen the ops left (none, when
the network reduces away), the eliminated ones are read back from their tables in the reverse
order. An infinite cost (a forbidden strategy or pair) stays infinite through the minima. Ties
go to the lowest strategy index. The ops left -- those with three or more neighbours -- and
their costs form a smaller ``BlockProblem`` (``repeat`` 1, every cost already summed over the
blocks) that ``ilp.solve`` hands the back end. ``tests/unit/search/test_ilp_reduce.py`` holds
the reduced solve to brute force and to the whole program's optimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autopar.search.ilp_types import BlockProblem, Edge, StrategyTable


@dataclass
class Reduction:
    """What is left of a problem, and how to read the eliminated ops back."""

    left: list[int]
    """The ops the solver still has to choose, in index order."""
    core: BlockProblem | None
    """Their program (op ``k`` of it is op ``left[k]``); None when no op is left."""
    steps: list[tuple] = field(default_factory=list)
    """Eliminations in order: (op, neighbours, arg-min table)."""

    def expand(self, chosen: dict[int, int], ops: int) -> tuple[int, ...]:
        """Every op's strategy from the ``chosen`` ones of ``left``."""
        out = dict(chosen)
        for op, nbrs, table in reversed(self.steps):
            out[op] = table[tuple(out[n] for n in nbrs)]
        return tuple(out[i] for i in range(ops))


def split_separable(matrix: list[list[float]]) -> tuple[list[float], list[float]] | None:
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


def _from_zero(values: list[float]) -> tuple[float, ...]:
    """``values`` less their smallest finite one (a constant that moves no arg-min), so that
    the smaller program's times are non-negative as ``StrategyTable`` and ``Edge`` want."""
    low = min((v for v in values if math.isfinite(v)), default=0.0)
    return tuple(v - low if math.isfinite(v) else v for v in values)


def reduce_problem(problem: BlockProblem,
                   pairs: dict[tuple[int, int], list[list[float]]]) -> Reduction | None:
    """The module docstring's reduction of ``problem`` whose op pairs cost ``pairs``
    (``ilp.pair_costs``); None when the program has no plan (some op, eliminated or left, has
    every strategy forbidden: the caller solves it whole, as before)."""
    L = problem.repeat
    unary = [[L * c if math.isfinite(c) else math.inf for c in t.compute_s]
             for t in problem.ops]
    cost: dict[tuple[int, int], list[list[float]]] = {}
    nbrs: list[set[int]] = [set() for _ in problem.ops]

    def add_pair(i: int, j: int, matrix: list[list[float]]) -> None:
        if i > j:
            i, j = j, i
            matrix = [list(col) for col in zip(*matrix)]
        if (i, j) in cost:
            old = cost[(i, j)]
            matrix = [[x + y for x, y in zip(r, s)] for r, s in zip(old, matrix)]
        split = split_separable(matrix)
        if split is not None:
            for a, v in enumerate(split[0]):
                unary[i][a] += v
            for b, v in enumerate(split[1]):
                unary[j][b] += v
            cost.pop((i, j), None)
            nbrs[i].discard(j)
            nbrs[j].discard(i)
            return
        cost[(i, j)] = matrix
        nbrs[i].add(j)
        nbrs[j].add(i)

    for (i, j), matrix in sorted(pairs.items()):
        if i == j:  # an op's boundary edge to itself: only the diagonal can occur
            for a in range(len(unary[i])):
                unary[i][a] += matrix[a][a]
        else:
            add_pair(i, j, [list(r) for r in matrix])

    def pair(i: int, j: int) -> list[list[float]]:
        """C^{ij} with rows i's strategies."""
        if i < j:
            return cost[(i, j)]
        return [list(col) for col in zip(*cost[(j, i)])]

    def drop(i: int) -> None:
        for n in list(nbrs[i]):
            cost.pop((min(i, n), max(i, n)))
            nbrs[n].discard(i)
        nbrs[i].clear()

    steps: list[tuple] = []
    alive = set(range(len(problem.ops)))
    pending = sorted(i for i in alive if len(nbrs[i]) <= 2)
    while pending:
        i = pending.pop(0)
        if i not in alive or len(nbrs[i]) > 2:
            continue
        around = tuple(sorted(nbrs[i]))
        u = unary[i]
        strategies = range(len(u))
        table: dict[tuple[int, ...], int] = {}
        if not around:
            table[()] = min(strategies, key=lambda a: (u[a], a))
            if not math.isfinite(u[table[()]]):
                return None  # every plan of this part of the network is forbidden
        elif len(around) == 1:
            (j,) = around
            c = pair(i, j)
            for b in range(len(unary[j])):
                best = min(strategies, key=lambda a: (u[a] + c[a][b], a))
                table[(b,)] = best
                unary[j][b] += u[best] + c[best][b]
        else:
            j, k = around
            cj, ck = pair(i, j), pair(i, k)
            new = [[0.0] * len(unary[k]) for _ in unary[j]]
            for b in range(len(unary[j])):
                for c in range(len(unary[k])):
                    best = min(strategies, key=lambda a: (u[a] + cj[a][b] + ck[a][c], a))
                    table[(b, c)] = best
                    new[b][c] = u[best] + cj[best][b] + ck[best][c]
        drop(i)
        alive.discard(i)
        if len(around) == 2:
            add_pair(around[0], around[1], new)
        steps.append((i, around, table))
        for n in around:
            if n in alive and len(nbrs[n]) <= 2 and n not in pending:
                pending.append(n)
        pending.sort()
    left = sorted(alive)
    if any(not any(math.isfinite(v) for v in unary[i]) for i in left):
        return None
    if not left:
        return Reduction(left=[], core=None, steps=steps)
    index = {op: k for k, op in enumerate(left)}
    ops = tuple(StrategyTable(names=problem.ops[i].names, compute_s=_from_zero(unary[i]),
                              op=problem.ops[i].op) for i in left)
    edges = []
    for (i, j), m in sorted(cost.items()):
        low = _from_zero([v for row in m for v in row])
        width = len(m[0])
        edges.append(Edge(src=index[i], dst=index[j],
                          reshard_s=tuple(low[r * width:(r + 1) * width]
                                          for r in range(len(m)))))
    return Reduction(left=left, core=BlockProblem(ops=ops, edges=tuple(edges), repeat=1),
                     steps=steps)
