"""Time ``autopar verify`` end to end on the done-when plans of the execution issue.

    python bench/verify_time.py                                   # rich table
    python bench/verify_time.py --markdown > bench/results/verify.md

Each case runs the command line ``autopar verify --model tiny-llama ...`` in a fresh
interpreter, as a user would, and reports its wall time (interpreter start, tracing and
planning, the ranks' start-up, three training steps on both sides, comparison), its exit status
and the largest differences it printed. Target: each under 90 s on a 2-core CPU machine.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

from machine import machine_lines

CASES = (
    "--dp 2 --tp 2 --nproc 4 --steps 3",
    "--tp 2 --pp 2 --schedule 1f1b",
    "--dp 2 --pp 2 --schedule interleaved",
    "--dp 2 --tp 2 --pp 2 --sequence-parallel --zero 2 --steps 3",
)
TARGET_S = 90.0


def run(args: str) -> tuple[float, int, list[str]]:
    cmd = [sys.executable, "-m", "autopar", "verify", "--model", "tiny-llama", *args.split()]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    values = re.findall(r"│ (loss per step|gradients|parameters)[^│]*│[^│]*│[^│]*│\s*([0-9.e+-]+)",
                        out.stdout)
    return wall, out.returncode, [v for _, v in values]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    rows = []
    for case in CASES:
        wall, code, values = run(case)
        rows.append((case, wall, code, values))
    if args.markdown:
        print("# `autopar verify` wall time\n")
        print("\n".join(machine_lines("python bench/verify_time.py --markdown",
                                      f"torch {torch.__version__}")))
        print(f"\nTarget: under {TARGET_S:.0f} s each. Differences: the loss (relative), the "
              "gradients (over each tensor's largest entry), the parameters (in optimizer "
              "moves), as `autopar verify` prints them.\n")
        print("| autopar verify --model tiny-llama ... | wall s | exit | loss | grads | params |")
        print("|---|---|---|---|---|---|")
        for case, wall, code, values in rows:
            v = values + ["-"] * (3 - len(values))
            print(f"| `{case}` | {wall:.1f} | {code} | {v[0]} | {v[1]} | {v[2]} |")
        return
    table = Table(title="autopar verify --model tiny-llama ...")
    for col in ("flags", "wall s", "exit", "loss", "grads", "params"):
        table.add_column(col)
    for case, wall, code, values in rows:
        v = values + ["-"] * (3 - len(values))
        table.add_row(case, f"{wall:.1f}", str(code), *v)
    Console().print(table)


if __name__ == "__main__":
    main()
