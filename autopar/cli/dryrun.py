"""``autopar dryrun --plan PLAN.json``: every rank role of a plan, one step on fake tensors.

Registered by ``autopar/cli/main.py``; the run is ``autopar.dryrun.run``'s. Prints, per pipeline rank,
the predicted and the dry-run peak memory by kind and the collectives issued; ``--json``
writes the same. Exit status 0 when every role's dry-run peak fits in the cluster's usable
memory, 1 when one does not, 2 for an error a person can act on.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console

from autopar.cli.args import model_spec, progress_bar, read_plan
from autopar.core.errors import AutoparError
from autopar.report.dryrun import GIB, dry_run_table

if TYPE_CHECKING:
    from autopar.dryrun.run import DryRun, ProgressFn


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
    p.add_argument("--all-microbatches", action="store_true",
                   help="run every micro-batch of the step (default: the fewest that reach "
                        "every memory state of the step, which find the same peak; the "
                        "collectives are counted in the micro-batches run)")
    p.add_argument("--every-role", action="store_true",
                   help="run every pipeline rank's role (default: of four or more adjacent "
                        "ranks running the same program, run three and read the others' peaks "
                        "off them where those step evenly)")
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
    from autopar.dryrun.run import dry_run

    plan = read_plan(args.plan, where="--plan")
    if args.model_arg and not args.model:
        raise AutoparError("--model-arg without --model", where="--model-arg",
                           fix="name --model only for a plan file that records none")
    spec = model_spec(args) if args.model else None
    console.print(f"dry run of {plan.summary()} on {plan.config.world_size} ranks "
                  f"(fake process group, fake tensors)", highlight=False)
    with dry_run_progress() as progress:
        result = dry_run(plan, spec, progress=progress, pp_ranks=args.pp_rank,
                         workers=args.workers, all_microbatches=args.all_microbatches,
                         every_role=args.every_role)
    console.print(dry_run_table(result))
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
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
