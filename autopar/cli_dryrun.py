"""``autopar dryrun --plan PLAN.json``: every rank role of a plan, one step on fake tensors.

Registered by ``autopar/cli.py``; the run is ``autopar.dry_run``'s. Prints, per pipeline rank,
the predicted and the dry-run peak memory by kind and the collectives issued; ``--json``
writes the same. Exit status 0 when every role's dry-run peak fits in the cluster's usable
memory, 1 when one does not, 2 for an error a person can act on.
"""

from __future__ import annotations

import argparse
import io
import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from autopar.cli_args import model_spec, progress_bar, read_plan
from autopar.core.errors import AutoparError

if TYPE_CHECKING:
    from autopar.dry_run import DryRun, ProgressFn
    from autopar.plan_check import CheckedPlan

GIB = 2**30


def add_dryrun_parser(sub: argparse._SubParsersAction,
                      parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "dryrun", parents=parents,
        help="run one step of every rank role of a plan on fake tensors: peak memory and "
             "collectives",
        description=__doc__.splitlines()[0])
    p.add_argument("--plan", required=True, metavar="F", help="a plan file (autopar plan --json F)")
    p.add_argument("--model", default=None,
                   help="the model, for a plan file that records none (default: the plan's)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a field of --model (repeatable)")
    p.add_argument("--pp-rank", type=int, action="append", default=None, metavar="R",
                   help="run only this pipeline rank's role (repeatable; default: every role)")
    add_workers_argument(p)
    p.add_argument("--json", default=None, metavar="F", help="also write the result as JSON")
    return p


def add_workers_argument(p: argparse._ActionsContainer) -> None:
    """``--workers N``: ``dry_run``'s ``workers`` (``dryrun`` and ``plan --check``)."""
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes running a plan's rank roles side by side in its dry run "
                        "(default: one per CPU core, at most one per role; 1 runs every role "
                        "in this process)")


@contextmanager
def dry_run_progress() -> Iterator[ProgressFn]:
    """``progress_bar`` as the ``progress(done, total, what)`` callback of ``dry_run`` and
    ``check_plans``."""
    with progress_bar("rank roles") as update:
        yield lambda done, total, what: update(done, total, f"dry run: {what}")


def cmd_dryrun(args: argparse.Namespace, console: Console) -> int:
    from autopar.dry_run import dry_run

    plan = read_plan(args.plan, where="--plan")
    if args.model_arg and not args.model:
        raise AutoparError("--model-arg without --model", where="--model-arg",
                           fix="name --model only for a plan file that records none")
    spec = model_spec(args) if args.model else None
    console.print(f"dry run of {plan.summary()} on {plan.config.world_size} ranks "
                  f"(fake process group, fake tensors)", highlight=False)
    with dry_run_progress() as progress:
        result = dry_run(plan, spec, progress=progress, pp_ranks=args.pp_rank,
                         workers=args.workers)
    console.print(dry_run_table(result))
    console.print(f"peak {result.peak_bytes / GIB:.2f} GiB of {plan.estimate.usable_memory_bytes / GIB:.2f}"
                  f" GiB usable: {'fits' if result.fits else 'DOES NOT FIT'}; "
                  f"{len(result.roles)} roles in {result.wall_s:.1f} s", highlight=False)
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(result.to_dict(), f, indent=2)
        except OSError as err:
            raise AutoparError(f"cannot write {args.json}: {err.strerror}", where="--json",
                               fix="pass a path in a folder that exists") from None
    return 0 if result.fits else 1


def dry_run_table(result: DryRun, title: str | None = None, detail: bool = True) -> Table:
    """Per pipeline rank: predicted and dry-run peak (GiB), the error, whether the dry run fits
    the usable memory; with ``detail``, also the dry run's kinds at its peak and the
    collectives."""
    from autopar.memory_account import KINDS

    usable = result.plan.estimate.usable_memory_bytes
    table = Table(title=title or "memory per rank role: predicted (plan) and dry run "
                                 "(emitted program)")
    kinds = KINDS if detail else ()
    for col in ("pp rank", "stages", "blocks", "predicted GiB", "dry run GiB", "error", "fits",
                *kinds, *(("collectives",) if detail else ())):
        table.add_column(col, justify="left" if col in ("stages", "collectives") else "right")
    for r in result.roles:
        pred = "-" if r.predicted_bytes is None else _gib(r.predicted_bytes)
        err = "-" if r.error is None else f"{r.error:+.1%}"
        row = [str(r.pp_rank), ",".join(map(str, r.stages)), str(r.blocks), pred,
               _gib(r.peak_bytes), err, "yes" if r.peak_bytes <= usable else "NO",
               *(_gib(r.peak_breakdown[k]) for k in kinds)]
        if detail:
            row.append(", ".join(f"{k} {v}" for k, v in r.collectives.items()
                                 if k != "wait_tensor"))
        table.add_row(*row)
    return table


def _gib(n: float) -> str:
    """Bytes in GiB: two decimals from 1 GiB, three significant digits below, down to a
    millionth (a tiny model's MiB would all read 0.00)."""
    v = n / GIB
    if v >= 1 or v <= 0:
        return f"{v:.2f}"
    return f"{v:.{min(6, 2 - math.floor(math.log10(v)))}f}"


def check_report(checked: Sequence[CheckedPlan], width: int = 110) -> str:
    """``plan --check``'s text: per plan dry-run, its per-role table, then what was kept and
    what dropped, and why."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    console.print(f"Dry-run check (autopar.check_plans): {len(checked)} plans, each rank role "
                  "one step on fake tensors", highlight=False)
    for c in checked:
        title = f"{c.label}: {c.plan.summary()}"
        if c.run is None:
            console.print(f"{title}: not dry-run (why: below)", highlight=False)
            continue
        console.print(dry_run_table(c.run, title=f"{title} ({c.run.wall_s:.1f} s)",
                                    detail=False), crop=False)
    kept = [c for c in checked if c.kept]
    if kept:
        console.print(f"kept {kept[0].label} {kept[0].plan.summary()}"
                      + (f" and {len(kept) - 1} runner-up{'s' if len(kept) > 2 else ''}"
                         if len(kept) > 1 else ""), highlight=False)
    for c in checked:
        if not c.kept:
            console.print(f"dropped {c.label} {c.plan.summary()}: {c.problem}", highlight=False)
    return buf.getvalue()
