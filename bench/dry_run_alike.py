"""The dry run's alike ranks read off three of them, against every role run, on plans too long for
the unit tests (``autopar/dryrun/alike.py``; ``tests/unit/dryrun/test_alike.py`` has pp 8).

    python bench/dry_run_alike.py              # tiny-llama, pp 16, interleaved v 2 and v 4
    python bench/dry_run_alike.py --markdown   # the table for bench/results/dry_run_405b.md

Each plan is dry-run twice in this process (``workers=1``): with every role run
(``every_role=True``) and as by default. Prints, per plan, the ranks read off and the ranks they
were read off, whether every peak and every kind equals the role's own dry run, and both wall
times. Exits 1 when a read-off peak differs.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import autopar
from autopar.core.estimate import block_ranges
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig, TrainSpec

CASES = {
    # one block a chunk: every chunk of a rank holds the same blocks
    "tiny-llama pp16 interleaved v4": (64, dict(pp=16, schedule="interleaved", virtual_stages=4),
                                       64),
    "tiny-llama pp16 interleaved v2": (32, dict(pp=16, schedule="interleaved", virtual_stages=2),
                                       32),
}
"""name -> (layers, the plan's layout, micro-batches a step)."""


def plan_of(layers: int, layout: dict, microbatches: int):
    spec = ModelSpec(name="tiny-llama", overrides={"num_layers": layers, "seq_len": 64})
    c = ParallelConfig(**{"dp": 1, "micro_batch": 1, "zero": 1, **layout})
    cluster = autopar.ClusterSpec.preset("hgx-h100-80g", nodes=max(1, c.world_size // 8))
    return autopar.plan_for(spec.build("meta"), cluster,
                            TrainSpec(global_batch=microbatches, seq_len=64), c, model_spec=spec)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    rows, same_all = [], True
    for name, (layers, layout, n) in CASES.items():
        plan = plan_of(layers, layout, n)
        began = time.perf_counter()
        read = autopar.dry_run(plan, workers=1)
        read_s = time.perf_counter() - began
        began = time.perf_counter()
        every = autopar.dry_run(plan, workers=1, every_role=True)
        every_s = time.perf_counter() - began
        same = all(a.peak_breakdown == b.peak_breakdown
                   for a, b in zip(every.roles, read.roles))
        same_all &= same
        what = "; ".join(f"{block_ranges(ranks)} off {block_ranges(run)}"
                         for run, ranks in read.read_off.items()) or "none"
        rows.append((name, plan.summary(), what, "identical" if same else "DIFFERENT",
                     f"{every_s:.1f}", f"{read_s:.1f}"))
    header = ("plan", "summary", "ranks read off", "peaks and kinds", "every role s",
              "read off s")
    if args.markdown:
        print(f"`python bench/dry_run_alike.py --markdown`, torch {torch.__version__}, one "
              "process:\n")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        for row in rows:
            print("  ".join(f"{h}: {v}" for h, v in zip(header, row)))
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
