"""``autopar compare A.json B.json [C.json ...]``: plans side by side (``autopar.report.text.compare``).

Registered by ``autopar/cli/main.py`` (``add_compare_parser`` on its sub-parsers, ``cmd_compare`` in
its command table). A file that is missing or not a plan, fewer than two plans, or plans of
different models without ``--any-model`` are errors a person acts on (status 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from autopar.cli.args import read_plan, write_text


def add_compare_parser(sub: argparse._SubParsersAction,
                       parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``compare`` command to ``sub`` (the ``autopar`` sub-parsers)."""
    p = sub.add_parser(
        "compare", parents=parents, help="set plan files side by side",
        description="Print plans side by side: model, cluster and training step, every "
                    "decision, the time per step by kind, throughput and MFU, and the memory "
                    "by kind on the most loaded GPU; rows that differ are marked with *. Then "
                    "each plan against the first: the time deltas that decide.")
    p.add_argument("plans", nargs="+", metavar="PLAN",
                   help="two or more plan files (autopar plan --json F)")
    p.add_argument("--any-model", action="store_true",
                   help="allow plans of different models (a warning is printed)")
    p.add_argument("--html", default=None, metavar="F",
                   help="also write the comparison as one self-contained HTML page (charts of "
                        "time and memory by kind, side by side)")
    p.add_argument("--width", type=int, default=None, metavar="N",
                   help="table width in characters (default: the terminal's, at least 100)")
    return p


def cmd_compare(args: argparse.Namespace, console: Console) -> int:
    from autopar.report.text import compare

    plans = [read_plan(path) for path in args.plans]
    labels = _labels(args.plans)
    width = args.width or max(console.width, 100)
    console.file.write(compare(plans, labels, width=width, any_model=args.any_model))
    if args.html:
        from autopar.report.html import compare_page

        write_text(args.html, compare_page(plans, labels, any_model=args.any_model), "--html")
    return 0


def _labels(paths: list[str]) -> list[str]:
    """Each file's name, or its path where two names are the same."""
    names = [Path(p).name for p in paths]
    return [n if names.count(n) == 1 else p for n, p in zip(names, paths)]
