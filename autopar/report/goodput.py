"""The whole run's table (``autopar plan --tokens``): days, GPU-hours, cost, checkpoints and
interruptions (``costmodel/goodput.py``)."""

from __future__ import annotations

from rich.table import Table

from autopar.costmodel.goodput import Goodput, Reliability
from autopar.report.text import titled_table


def _s(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.2f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


def goodput_table(g: Goodput, r: Reliability) -> Table:
    """Time to train, its cost, and what checkpoints and failures take of it."""
    t = titled_table("Time to train")
    t.add_column("", style="bold")
    t.add_column("")
    rows = [
        ("tokens", f"{g.tokens:.4g} in {g.steps:,.0f} steps of {g.step_s:.3f} s"),
        ("wall time", f"{_s(g.wall_s)} ({_s(g.ideal_s)} with no checkpoint or failure)"),
        ("goodput", f"{g.goodput:.1%} of the wall time is training"),
        ("GPU-hours", f"{g.gpu_hours:,.0f} on {g.gpus:,} GPUs"),
        ("cost", "give --gpu-hour-cost" if g.cost is None else f"{g.cost:,.0f}"),
        ("tokens/s per GPU", f"{g.tokens_per_s_per_gpu:,.0f} over the wall time"),
        ("checkpoint", f"{g.checkpoint_bytes / 1e12:.3g} TB (DCP: master weights and optimizer "
                       f"states), every {g.interval_steps:,} steps ({_s(g.interval_s)}); blocks "
                       f"{_s(g.checkpoint_blocking_s)}"
                       f" (async staging to host), written in {_s(g.checkpoint_write_s)} at "
                       f"{r.storage_bytes_per_s / 1e12:.3g} TB/s"),
        ("interruptions", "none priced (failure rate 0)" if g.interruptions == 0 else
         f"{g.interruptions:,.0f} expected, one every {_s(g.mtbi_s)} "
         f"({r.failure_rate_per_gpu_hour:.3g} per GPU-hour); each costs {_s(g.restart_s)} to "
         f"restart (relaunch {_s(r.relaunch_s)}, load {_s(g.load_s)}) and half an interval "
         "of lost work"),
    ]
    for name, text in rows:
        t.add_row(name, text)
    return t


def sweep_table(rows: list) -> Table:
    """``--sweep-gpus``: per GPU count, the best plan, its step, and the whole run's days,
    goodput, GPU-hours and cost (the frontier: more GPUs, fewer days, more GPU-hours)."""
    t = titled_table("Time to train against GPUs")
    for col in ("GPUs", "plan", "step s", "days", "goodput", "GPU-hours", "cost"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for gpus, plan, run, why in rows:
        if plan is None:
            t.add_row(f"{gpus:,}", f"no plan: {why}", "", "", "", "", "")
            continue
        t.add_row(f"{gpus:,}", plan.summary(), f"{plan.estimate.step_time_s:.3f}",
                  f"{run.wall_days:.2f}", f"{run.goodput:.1%}", f"{run.gpu_hours:,.0f}",
                  "-" if run.cost is None else f"{run.cost:,.0f}")
    return t
