"""Compare the OR-Tools back ends of ``autopar.search.ilp`` on Alpa-style block instances.

    python bench/solver_compare.py            # all instances, writes bench/results/solver.md
    python bench/solver_compare.py --quick    # block instances only, prints the table

Instances (all synthetic, generated here with fixed seeds):

* ``gpt-*`` / ``llama-*``: transformer blocks of 1–2 layers (21–48 ops; hidden 4096, micro-batch 2,
  sequence 2048, bf16) on a 2-D mesh, repeated 24–128 times. Activation
  layouts give each mesh axis to the batch dim, the hidden dim or nobody (9 strategies); a linear
  layer gives each axis to batch, in-features, out-features or nobody (16 strategies). Compute is a
  roofline (312 TFLOP/s, 2 TB/s) plus the layer's own all-reduces; resharding is all-gather /
  all-to-all on the axis that changes (axis 0 at 25 GB/s, axis 1 at 150 GB/s), forward and
  backward.
* ``synthetic-structured-500`` / ``synthetic-random-500``: the sizes of FINDINGS.md "Solvers":
  500 ops x 8 strategies, 694 edges (a chain plus 195 skips), repeat 1; structured from a 2x4
  mesh, random costs.

The ILP has no memory limit or checkpointing (``autopar.search.optimize`` decides those), so every
instance is solved for time alone.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import ortools
from machine import machine_lines

from autopar.search.ilp import Backend, BlockProblem, Edge, StrategyTable, solve

PEAK_FLOP_PER_S = 312e12
HBM_BYTES_PER_S = 2.0e12
AXIS_BYTES_PER_S = (25e9, 150e9)
LATENCY_S = 10e-6
ACT_DIMS = ("B", "H", None)
LINEAR_ROLES = ("B", "K", "N", None)


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: str  # "elementwise" | "linear" | "attention"
    width: int  # hidden size of the output (linear: out features)
    in_width: int  # hidden size of the input (linear: in features)
    inputs: tuple[int, ...]  # op indices inside the block; -1 = the block input
    flop_per_elem: float = 1.0


def _layer(base: int, hidden: int, ffn: int, llama: bool, prev: int) -> list[OpSpec]:
    """One transformer layer as ops; ``prev`` indexes the layer input (-1: the block's input)."""
    ops: list[OpSpec] = []

    def add(
        name: str, kind: str, width: int, in_width: int, inputs: tuple[int, ...], **kw: float
    ) -> int:
        ops.append(OpSpec(name, kind, width, in_width, inputs, **kw))  # type: ignore[arg-type]
        return base + len(ops) - 1

    h, f = hidden, ffn
    if llama:
        x = add("rms.pow", "elementwise", h, h, (prev,))
        x = add("rms.mean", "elementwise", h, h, (x,))
        x = add("rms.rsqrt", "elementwise", h, h, (x,))
        x = add("rms.mul", "elementwise", h, h, (prev, x))
        n1 = add("rms.weight", "elementwise", h, h, (x,))
        q = add("q_proj", "linear", h, h, (n1,))
        k = add("k_proj", "linear", h // 4, h, (n1,))
        v = add("v_proj", "linear", h // 4, h, (n1,))
        q = add("rope.q", "elementwise", h, h, (q,), flop_per_elem=6)
        k = add("rope.k", "elementwise", h // 4, h // 4, (k,), flop_per_elem=6)
        a = add("attention", "attention", h, h, (q, k, v))
        o = add("o_proj", "linear", h, h, (a,))
        r1 = add("residual1", "elementwise", h, h, (prev, o))
        x = add("rms2.pow", "elementwise", h, h, (r1,))
        x = add("rms2.mean", "elementwise", h, h, (x,))
        x = add("rms2.rsqrt", "elementwise", h, h, (x,))
        x = add("rms2.mul", "elementwise", h, h, (r1, x))
        n2 = add("rms2.weight", "elementwise", h, h, (x,))
        g = add("gate_proj", "linear", f, h, (n2,))
        u = add("up_proj", "linear", f, h, (n2,))
        g = add("silu", "elementwise", f, f, (g,), flop_per_elem=4)
        m = add("swiglu.mul", "elementwise", f, f, (g, u))
        d = add("down_proj", "linear", h, f, (m,))
        add("residual2", "elementwise", h, h, (r1, d))
        return ops
    n1 = add("ln1", "elementwise", h, h, (prev,), flop_per_elem=8)
    qkv = add("qkv", "linear", 3 * h, h, (n1,))
    qkv = add("qkv.bias", "elementwise", 3 * h, 3 * h, (qkv,))
    q = add("q.view", "elementwise", h, 3 * h, (qkv,), flop_per_elem=0)
    k = add("k.view", "elementwise", h, 3 * h, (qkv,), flop_per_elem=0)
    v = add("v.view", "elementwise", h, 3 * h, (qkv,), flop_per_elem=0)
    a = add("attention", "attention", h, h, (q, k, v))
    a = add("attn.view", "elementwise", h, h, (a,), flop_per_elem=0)
    o = add("proj", "linear", h, h, (a,))
    o = add("proj.bias", "elementwise", h, h, (o,))
    o = add("dropout1", "elementwise", h, h, (o,))
    r1 = add("residual1", "elementwise", h, h, (prev, o))
    n2 = add("ln2", "elementwise", h, h, (r1,), flop_per_elem=8)
    x = add("fc1", "linear", f, h, (n2,))
    x = add("fc1.bias", "elementwise", f, f, (x,))
    x = add("gelu", "elementwise", f, f, (x,), flop_per_elem=8)
    x = add("fc2", "linear", h, f, (x,))
    x = add("fc2.bias", "elementwise", h, h, (x,))
    x = add("dropout2", "elementwise", h, h, (x,))
    x = add("residual2", "elementwise", h, h, (r1, x))
    add("ln_out.identity", "elementwise", h, h, (x,), flop_per_elem=0)
    return ops


def _shards(layout: tuple[str | None, ...], dim: str, mesh: tuple[int, ...]) -> int:
    return math.prod(n for d, n in zip(layout, mesh) if d == dim)


def _reshard_s(
    src: tuple[str | None, ...],
    dst: tuple[str | None, ...],
    full_bytes: float,
    mesh: tuple[int, ...],
) -> float:
    """Forward + backward time to turn layout ``src`` into ``dst`` (all-gather / all-to-all)."""
    total = 0.0
    for axis, (a, b) in enumerate(zip(src, dst)):
        if a == b or a is None:  # equal, or slicing a replicated tensor: free
            continue
        n = mesh[axis]
        local = full_bytes / math.prod(
            m for k, (d, m) in enumerate(zip(dst, mesh)) if d is not None and k != axis
        )
        moved = local * (n - 1) / n if b is None else local * (n - 1) / n / n
        total += LATENCY_S + moved / AXIS_BYTES_PER_S[axis]
    return 2.0 * total


def _allreduce_s(bytes_: float, n: int, axis: int) -> float:
    return 0.0 if n == 1 else LATENCY_S + 2 * (n - 1) / n * bytes_ / AXIS_BYTES_PER_S[axis]


def transformer_block(
    *,
    layers: int,
    llama: bool,
    mesh: tuple[int, int],
    repeat: int,
    micro_batch: int = 2,
    seq: int = 2048,
    hidden: int = 4096,
    dtype_bytes: int = 2,
) -> BlockProblem:
    ffn = 4 * hidden if not llama else int(8 * hidden / 3) // 256 * 256
    specs: list[OpSpec] = []
    prev = -1
    for _ in range(layers):
        specs += _layer(len(specs), hidden, ffn, llama, prev)
        prev = len(specs) - 1
    tokens = micro_batch * seq
    act_layouts = list(itertools.product(ACT_DIMS, repeat=len(mesh)))
    lin_layouts = list(itertools.product(LINEAR_ROLES, repeat=len(mesh)))
    tables: list[StrategyTable] = []
    out_layout: list[list[tuple[str | None, ...]]] = []  # per op, per strategy
    in_layout: list[list[tuple[str | None, ...]]] = []
    for spec in specs:
        names, compute, outs, ins = [], [], [], []
        if spec.kind == "linear":
            for roles in lin_layouts:
                sb, sk, sn = (_shards(roles, r, mesh) for r in ("B", "K", "N"))
                flop = 6.0 * tokens * spec.in_width * spec.width / (sb * sk * sn)
                comm = sum(
                    _allreduce_s(tokens * spec.width * dtype_bytes / (sb * sn), mesh[ax], ax)
                    for ax, r in enumerate(roles)
                    if r == "K"
                )
                comm += sum(
                    _allreduce_s(tokens * spec.in_width * dtype_bytes / (sb * sk), mesh[ax], ax)
                    for ax, r in enumerate(roles)
                    if r == "N"
                )
                weight = spec.in_width * spec.width / (sk * sn)
                comm += sum(
                    _allreduce_s(weight * dtype_bytes, mesh[ax], ax)
                    for ax, r in enumerate(roles)
                    if r == "B"
                )
                names.append("".join({"B": "b", "K": "k", "N": "n", None: "r"}[r] for r in roles))
                compute.append(flop / PEAK_FLOP_PER_S + comm)
                ins.append(tuple({"B": "B", "K": "H"}.get(r) for r in roles))  # type: ignore[arg-type]
                outs.append(tuple({"B": "B", "N": "H"}.get(r) for r in roles))  # type: ignore[arg-type]
        else:
            for layout in act_layouts:
                sb, sh = _shards(layout, "B", mesh), _shards(layout, "H", mesh)
                elems = tokens * spec.width / (sb * sh)
                if spec.kind == "attention":
                    flop = 3 * 4.0 * micro_batch * seq * seq * spec.width / (sb * sh)
                    t = flop / PEAK_FLOP_PER_S
                else:
                    t = (
                        3
                        * (
                            elems * spec.flop_per_elem / PEAK_FLOP_PER_S
                            + 2 * elems * dtype_bytes / HBM_BYTES_PER_S
                        )
                        if spec.flop_per_elem
                        else 0.0
                    )
                    if (
                        spec.name.startswith(("ln", "rms"))
                        and spec.name.endswith(("1", "2", "mean"))
                        and sh > 1
                    ):
                        t += LATENCY_S  # statistics all-reduce over a sharded hidden dim
                names.append("".join({"B": "b", "H": "h", None: "r"}[d] for d in layout))
                compute.append(t)
                ins.append(layout)
                outs.append(layout)
        tables.append(StrategyTable(tuple(names), tuple(compute), op=spec.name))
        out_layout.append(outs)
        in_layout.append(ins)

    def edge(src: int, dst: int, width: int) -> Edge:
        full = tokens * width * dtype_bytes
        return Edge(
            src,
            dst,
            tuple(
                tuple(_reshard_s(o, i, full, mesh) for i in in_layout[dst]) for o in out_layout[src]
            ),
        )

    edges, boundary = [], []
    last = len(specs) - 1
    for j, spec in enumerate(specs):
        for src in spec.inputs:
            width = specs[src].width if src >= 0 else hidden
            if src < 0:
                boundary.append(edge(last, j, hidden))
            else:
                edges.append(edge(src, j, width))
    return BlockProblem(tuple(tables), tuple(edges), repeat, tuple(boundary))


def synthetic_500(structured: bool, seed: int = 0) -> BlockProblem:
    """500 ops x 8 strategies, 694 edges (chain + 195 skips), repeat 1 (the FINDINGS sizes)."""
    rng = random.Random(seed)
    mesh = (2, 4)
    layouts = list(itertools.product(ACT_DIMS, repeat=2))[:8]
    num_ops = 500
    pairs = [(i, i + 1) for i in range(num_ops - 1)]
    while len(pairs) < 694:
        i = rng.randrange(num_ops - 6)
        pair = (i, i + rng.randint(2, 6))
        if pair not in pairs:
            pairs.append(pair)
    tables, edges = [], []
    if structured:
        widths = [rng.choice((1024, 4096, 8192)) for _ in range(num_ops)]
        for i in range(num_ops):
            params = rng.choice((0, 0, 8192 * 8192, 8192 * 32768)) / 8
            compute = []
            for layout in layouts:
                sb, sh = _shards(layout, "B", mesh), _shards(layout, "H", mesh)
                flop = 6 * 8192 * params * 8 / (sb * sh) + 8192 * widths[i] * 10 / (sb * sh)
                grad_sync = sum(
                    _allreduce_s(2 * params / sh, mesh[ax], ax)
                    for ax, d in enumerate(layout)
                    if d == "B"
                )
                tp_comm = sum(  # a sharded weight's partial outputs are all-reduced
                    _allreduce_s(8192 * widths[i] * 2 / sb, mesh[ax], ax)
                    for ax, d in enumerate(layout)
                    if d == "H" and params
                )
                compute.append(flop / PEAK_FLOP_PER_S + grad_sync + tp_comm)
            names = tuple(
                "".join({"B": "b", "H": "h", None: "r"}[d] for d in layout) for layout in layouts
            )
            tables.append(StrategyTable(names, tuple(compute), op=f"op{i}"))
        for i, j in pairs:
            full = 8192 * widths[i] * 2
            edges.append(
                Edge(
                    i,
                    j,
                    tuple(tuple(_reshard_s(a, b, full, mesh) for b in layouts) for a in layouts),
                )
            )
    else:
        for i in range(num_ops):
            compute = tuple(rng.uniform(0.5, 2.0) for _ in range(8))
            for _ in range(16):  # the retired state and activation bytes: still drawn, so that
                rng.random()  # the costs stay those of the instance measured with them
            tables.append(StrategyTable(tuple(f"s{k}" for k in range(8)), compute, op=f"op{i}"))
        for i, j in pairs:
            edges.append(
                Edge(
                    i,
                    j,
                    tuple(
                        tuple(0.0 if a == b else rng.uniform(0, 1.0) for b in range(8))
                        for a in range(8)
                    ),
                )
            )
    return BlockProblem(tuple(tables), tuple(edges), 1)


def instances(quick: bool) -> list[tuple[str, BlockProblem]]:
    out = []
    blocks = [
        ("gpt-21ops-2x4-r24", dict(layers=1, llama=False, mesh=(2, 4), repeat=24)),
        ("gpt-42ops-4x4-r48", dict(layers=2, llama=False, mesh=(4, 4), repeat=48)),
        ("llama-24ops-2x8-r128", dict(layers=1, llama=True, mesh=(2, 8), repeat=128)),
        ("llama-48ops-4x4-r40", dict(layers=2, llama=True, mesh=(4, 4), repeat=40)),
    ]
    for name, kw in blocks:
        out.append((name, transformer_block(**kw)))  # type: ignore[arg-type]
    if not quick:
        out.append(("synthetic-structured-500", synthetic_500(True)))
        out.append(("synthetic-random-500", synthetic_500(False)))
    return out


def describe(problem: BlockProblem) -> str:
    sizes = [len(t) for t in problem.ops]
    edges = len(problem.edges) + len(problem.boundary_edges)
    return (
        f"{len(problem.ops)} ops, {min(sizes)}-{max(sizes)} strategies, {edges} edges, "
        f"repeat {problem.repeat}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="block instances only; no file")
    parser.add_argument("--time-limit-s", type=float, default=120.0)
    parser.add_argument("--repeats", type=int, default=3, help="runs per block instance (median)")
    parser.add_argument("--backends", default="highs,cp-sat,scip,cbc")
    args = parser.parse_args()
    backends = [Backend(b) for b in args.backends.split(",")]
    rows = []
    problems = instances(args.quick)
    for name, problem in problems:
        print(f"{name}: {describe(problem)}", flush=True)
        runs = 1 if name.startswith("synthetic") else args.repeats
        for backend in backends:
            times, solver_times = [], []
            for _ in range(runs):
                start = time.perf_counter()
                sol = solve(problem, time_limit_s=args.time_limit_s, backend=backend)
                times.append(time.perf_counter() - start)
                solver_times.append(sol.wall_s)
            total_s, wall_s = statistics.median(times), statistics.median(solver_times)
            status = sol.status.value
            if status != "optimal":
                status += f", gap {sol.gap:.2g}"
            rows.append(
                (
                    name,
                    backend.value,
                    total_s,
                    min(times),
                    max(times),
                    wall_s,
                    sol.objective_s,
                    status,
                )
            )
            print(
                f"  {backend.value:7s} {total_s:8.2f} s "
                f"(min {min(times):.2f}, max {max(times):.2f}, "
                f"solver {wall_s:.2f}) objective {sol.objective_s:.9g} s {status}",
                flush=True,
            )
    table = [
        "| instance | backend | seconds (median) | min-max | solver only | objective (s) "
        "| status |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, backend, total_s, lo, hi, wall_s, obj, status in rows:
        table.append(
            f"| {name} | {backend} | {total_s:.2f} | {lo:.2f}-{hi:.2f} | {wall_s:.2f} | "
            f"{obj:.9g} | {status} |"
        )
    sizes = ["| instance | size |", "|---|---|"]
    for name, problem in problems:
        sizes.append(f"| {name} | {describe(problem)} |")
    print("\n".join(table))
    if args.quick:
        return
    header = [
        "# Solver back ends of the per-candidate ILP (`autopar/search/ilp.py`)",
        "",
        *machine_lines("python bench/solver_compare.py", f"OR-Tools {ortools.__version__}"),
        "- Each solve: `autopar.search.ilp.solve(problem, backend=...)`, num_workers=8,",
        f"  time limit {args.time_limit_s:.0f} s; block instances run {args.repeats} times",
        "  (median and min-max), the 500-op ones once. 'seconds' includes building the model in",
        "  Python; 'solver only' is the back end's own wall time.",
        "- Instances: see the docstring of `bench/solver_compare.py`.",
        "",
    ]
    out = Path(__file__).parent / "results" / "solver.md"
    existing = out.read_text() if out.exists() else ""
    notes = existing.split("<!-- notes -->", 1)[1] if "<!-- notes -->" in existing else "\n"
    body = header + sizes + [""] + table
    out.write_text("\n".join(body) + "\n\n<!-- notes -->" + notes)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
