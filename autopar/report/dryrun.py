"""The dry run's tables: predicted against dry-run peak memory per pipeline rank
(``autopar dryrun``), and ``plan --check``'s account of the plans it dry-ran, kept and dropped."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from autopar.dryrun.plan_check import CheckedPlan
    from autopar.dryrun.run import DryRun, RoleRun

GIB = 2**30


def dry_run_table(result: DryRun, title: str | None = None, detail: bool = True) -> Table:
    """Per pipeline rank: predicted and dry-run peak (GiB), the error, whether the dry run fits
    the usable memory; with ``detail``, also the micro-batches the role ran of the step's
    (``autopar/dryrun/steady.py``) or the alike ranks its peak was read off
    (``autopar/dryrun/alike.py``), the dry run's kinds at its peak and the collectives issued
    in those micro-batches."""
    usable = result.plan.estimate.usable_memory_bytes
    table = Table(title=title or "memory per rank role: predicted (plan) and dry run "
                                 "(emitted program)")
    # the kinds of bytes in the dry run's own order (``autopar.dryrun.memory_account.KINDS``)
    kinds = tuple(result.roles[0].peak_breakdown) if detail and result.roles else ()
    for col in ("pp rank", "stages", "blocks", *(("micro-batches run",) if detail else ()),
                "predicted GiB", "dry run GiB", "error", "fits", *kinds,
                *(("collectives",) if detail else ())):
        table.add_column(col, justify="left" if col in ("stages", "collectives") else "right")
    for r in result.roles:
        pred = "-" if r.predicted_bytes is None else _gib(r.predicted_bytes)
        err = "-" if r.error is None else f"{r.error:+.1%}"
        row = [str(r.pp_rank), ",".join(map(str, r.stages)), str(r.blocks),
               *((microbatches_text(r),) if detail else ()), pred,
               _gib(r.peak_bytes), err, "yes" if r.peak_bytes <= usable else "NO",
               *(_gib(r.peak_breakdown[k]) for k in kinds)]
        if detail:
            row.append(", ".join(f"{k} {v}" for k, v in r.collectives.items()
                                 if k != "wait_tensor"))
        table.add_row(*row)
    return table


def microbatches_text(r: RoleRun) -> str:
    """The micro-batches a role ran of its step's, or the ranks its peak was read off."""
    if r.inferred_from:
        return f"none: read off {','.join(map(str, r.inferred_from))}"
    return f"{r.microbatches} of {r.step_microbatches}"


def read_off_lines(result: DryRun) -> list[str]:
    """One line per group of roles whose peaks were read off the same alike ranks
    (``DryRun.read_off``) rather than run."""
    return [f"pipeline ranks {', '.join(map(str, ranks))}: read off ranks "
            f"{', '.join(map(str, run))}, which run the same program (not run themselves)"
            for run, ranks in result.read_off.items()]


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
        for line in read_off_lines(c.run):
            console.print(line, highlight=False)
    kept = [c for c in checked if c.kept]
    if kept:
        console.print(f"kept {kept[0].label} {kept[0].plan.summary()}"
                      + (f" and {len(kept) - 1} runner-up{'s' if len(kept) > 2 else ''}"
                         if len(kept) > 1 else ""), highlight=False)
    for c in checked:
        if not c.kept:
            console.print(f"dropped {c.label} {c.plan.summary()}: {c.problem}", highlight=False)
    return buf.getvalue()
