"""Time ``autopar.models.build`` + ``autopar.analysis.tracing.trace`` on the big zoo models (meta device).

Each model runs in a fresh Python process, so the peak RSS (``ru_maxrss``) and the times are its
own, import of torch included in the peak but not in the times. Usage::

    python bench/trace_time.py                       # the default models at their preset seq_len
    python bench/trace_time.py --models llama3-405b --seq-len 8192

Prints a table: model, trace method, nodes, blocks, build s, trace s, peak RSS GiB (binary).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

DEFAULT_MODELS = (
    ("gpt-175b", None),
    ("llama3-70b", 8192),
    ("llama3-405b", 8192),
    ("mixtral-8x7b", None),
)
"""(preset, sequence length or None for the preset's own) measured by default."""

_CHILD = r"""
import json, resource, sys, time
import torch
import autopar.models as zoo
from autopar.analysis.tracing import trace
name, seq = sys.argv[1], (int(sys.argv[2]) if sys.argv[2] != "-" else None)
t0 = time.perf_counter()
model = zoo.build(name, device="meta")
t1 = time.perf_counter()
graph = trace(model, seq_len=seq)
t2 = time.perf_counter()
print(json.dumps({
    "model": name, "seq_len": graph.seq_len, "method": graph.method, "nodes": len(graph.nodes),
    "blocks": graph.num_blocks, "params": graph.num_params, "fwd_flop": graph.fwd_flop,
    "build_s": t1 - t0, "trace_s": t2 - t1,
    "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30,
}))
"""


def measure(name: str, seq_len: int | None) -> dict[str, object]:
    """Build and trace ``name`` in a fresh process; its measurements, or an ``error`` entry."""
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, name, str(seq_len) if seq_len else "-"],
        capture_output=True, text=True, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "error": tail}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="presets to time (default: the big four)")
    parser.add_argument("--seq-len", type=int, default=None, help="one sequence length for all")
    args = parser.parse_args(argv)
    if args.models:
        runs = [(m, args.seq_len) for m in args.models]
    else:
        runs = [(m, args.seq_len or s) for m, s in DEFAULT_MODELS]

    from rich.console import Console
    from rich.table import Table

    import torch

    table = Table(title=f"autopar.trace on the meta device (torch {torch.__version__})")
    for col in ("model", "seq", "method", "nodes", "blocks", "params (B)", "fwd TFLOP",
                "build s", "trace s", "peak RSS GiB"):
        table.add_column(col, justify="left" if col in ("model", "method") else "right")
    for name, seq in runs:
        r = measure(name, seq)
        if "error" in r:
            table.add_row(name, "-", "failed", str(r["error"])[:60], *["-"] * 6)
            continue
        table.add_row(
            name, str(r["seq_len"]), str(r["method"]), str(r["nodes"]), str(r["blocks"]),
            f"{float(r['params']) / 1e9:.1f}", f"{float(r['fwd_flop']) / 1e12:.0f}",
            f"{r['build_s']:.2f}", f"{r['trace_s']:.2f}", f"{r['peak_rss_gib']:.2f}",
        )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
