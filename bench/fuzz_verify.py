"""Property-based verification over random small models and plans (``autopar.verify.cases``).

    python bench/fuzz_verify.py [--seed 1] [--cases 160] [--steps 2] [--markdown FILE]

Draws ``--cases`` cases from ``--seed`` and runs each: planned with ``autopar.plan_for`` and
verified with ``autopar.verify.run`` on CPU processes, or refused before any process starts. Prints
one line per case as it goes, then the counts by outcome, the refusals by reason, the spread
of the verified measures by precision (what ``autopar/verify/run.py``'s tolerances rest on) and
every crash and mismatch; ``--markdown`` also writes that summary (``bench/results/
fuzz_verify.md`` records a run). Exit status 1 when any case crashed or mismatched.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections import Counter, defaultdict

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from autopar.verify.cases import Outcome, Result, draw_cases, run_case  # noqa: E402


def _spread(values: list[float]) -> str:
    values = sorted(values)
    if not values:
        return "-"
    median = values[len(values) // 2]
    return f"{median:.2e} / {values[-1]:.2e}"


def summary(results: list[Result], seed: int, steps: int, wall_s: float) -> str:
    counts = Counter(r.outcome for r in results)
    lines = [f"# Property-based verification: {len(results)} cases, seed {seed}", "",
             f"Machine: {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, "
             f"Python {platform.python_version()}; {steps} steps per case; "
             f"{wall_s / 60:.1f} min in all.", "",
             "| outcome | cases |", "|---|---|"]
    lines += [f"| {o.value} | {counts.get(o, 0)} |" for o in Outcome]
    by_precision: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.measures:
            for k, v in r.measures.items():
                by_precision[r.case.precision][k].append(v)
    lines += ["", "Measures of the verified cases, median / largest "
              "(`autopar/verify/measures.py`; fp32: loss relative, gradients over each "
              "tensor's largest entry, parameters in optimizer moves, bounds 1e-5, 1e-3, 1e-2; "
              "bf16, fp16, bf16-pure: each over the error one process makes at that precision, "
              "bound 8):", "",
              "| precision | cases | loss | gradients | parameters |", "|---|---|---|---|---|"]
    for prec, m in sorted(by_precision.items()):
        lines.append(f"| {prec} | {len(m['loss'])} | {_spread(m['loss'])} | "
                     f"{_spread(m['grads'])} | {_spread(m['params'])} |")
    reasons = Counter(r.reason.split(". Where:")[0] for r in results
                      if r.outcome is Outcome.REFUSED)
    lines += ["", "Refusals by reason (before any process started):", "",
              "| cases | reason |", "|---|---|"]
    lines += [f"| {n} | {reason} |" for reason, n in reasons.most_common()]
    bad = [r for r in results if r.outcome in (Outcome.CRASHED, Outcome.MISMATCH)]
    lines += ["", f"Crashes and mismatches: {len(bad)}", ""]
    lines += [f"- {r.outcome.value}: {r.case.describe()}: {r.reason[:500]}" for r in bad]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cases", type=int, default=160)
    ap.add_argument("--first", type=int, default=0, help="skip the cases before this index")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--markdown", default=None, metavar="FILE")
    args = ap.parse_args()
    start = time.monotonic()
    results = []
    for case in draw_cases(args.seed, args.cases)[args.first:]:
        r = run_case(case, steps=args.steps)
        results.append(r)
        print(f"{r.outcome.value:9s} {r.wall_s:5.1f} s  {case.describe()}\n    {r.reason[:300]}",
              flush=True)
    text = summary(results, args.seed, args.steps, time.monotonic() - start)
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    return 1 if any(r.outcome in (Outcome.CRASHED, Outcome.MISMATCH) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
