"""Start-up time: ``import torch``, ``import autopar`` and ``autopar --help``, each in fresh
interpreters, in one run (issue 15, item 4: autopar's no slower than torch's by more than 0.3 s).

    python bench/startup.py              # 7 fresh interpreters each, the table
    python bench/startup.py --runs 15
    python bench/startup.py --markdown   # the lines of bench/results/startup.md

Each case runs ``sys.executable`` with ``-c`` (``autopar --help`` as ``-m autopar --help``, the
console script's code path; ``-m`` adds runpy's few milliseconds); the cases take turns, run by
run, so that a change in the machine's load falls on all of them. Wall seconds per interpreter,
start to exit, the interpreter's own start included (the ``python -c pass`` row); the median and
the fastest of the runs. The gate compares autopar's medians with ``import torch``'s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from machine import machine_lines

CASES = {
    "python -c pass": ["-c", "pass"],
    "import torch": ["-c", "import torch"],
    "import autopar": ["-c", "import autopar"],
    "autopar --help": ["-m", "autopar", "--help"],
}
LIMIT_S = 0.3
"""How much slower than ``import torch`` ``import autopar`` and ``autopar --help`` may be."""


def measure(runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(runs):
        for name, args in CASES.items():
            start = time.perf_counter()
            subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - start)
    return times


def table(times: dict[str, list[float]]) -> list[str]:
    torch_s = statistics.median(times["import torch"])
    lines = [f"{'case':<16} {'median s':>9} {'fastest s':>10} {'vs import torch':>16}"]
    for name, ts in times.items():
        med = statistics.median(ts)
        lines.append(f"{name:<16} {med:>9.3f} {min(ts):>10.3f} {med - torch_s:>+15.3f}s")
    return lines


def verdict(times: dict[str, list[float]]) -> str:
    torch_s = statistics.median(times["import torch"])
    worst = max(statistics.median(times[n]) for n in ("import autopar", "autopar --help"))
    ok = worst <= torch_s + LIMIT_S
    return (f"{'PASS' if ok else 'FAIL'}: the slower of import autopar and autopar --help takes "
            f"{worst:.3f} s, import torch {torch_s:.3f} s (limit: {LIMIT_S} s more)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7, help="fresh interpreters per case")
    p.add_argument("--markdown", action="store_true", help="the lines of the results file")
    args = p.parse_args()
    import torch

    head = machine_lines(f"python bench/startup.py --runs {args.runs}",
                         f"torch {torch.__version__}")
    times = measure(args.runs)
    if args.markdown:
        print("# Start-up time: `import torch`, `import autopar`, `autopar --help`\n")
        print("\n".join(head) + "\n")
        print("```\n" + "\n".join(table(times)) + "\n```\n")
    else:
        print("\n".join(table(times)))
    print(verdict(times))
    return 0 if "PASS" in verdict(times) else 1


if __name__ == "__main__":
    sys.exit(main())
