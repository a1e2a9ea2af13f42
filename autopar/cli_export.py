"""``autopar export PLAN.json FOLDER``: write a runnable training folder for a plan.

Registered by ``autopar/cli.py`` (``add_export_parser`` on its sub-parsers, ``cmd_export`` in its
command table); the folder's contents are ``autopar.passes.export``'s.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from autopar.cli_args import model_spec, read_plan
from autopar.core.errors import AutoparError


def add_export_parser(sub: argparse._SubParsersAction,
                      parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``export`` command to ``sub`` (the ``autopar`` sub-parsers)."""
    p = sub.add_parser(
        "export", parents=parents, help="write a runnable torchrun folder for a plan",
        description="Write FOLDER with plan.json, model.json, train.py (builds the model, "
                    "applies the plan, trains, checkpoints and resumes), launch.sh (torchrun "
                    "for the plan's nodes and GPUs per node) and a README.")
    p.add_argument("plan", help="a plan file (autopar plan --json F)")
    p.add_argument("folder", help="the folder to write (created; must be empty)")
    p.add_argument("--model", default=None,
                   help="the model, for a plan file that records none (default: the plan's)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a field of --model, e.g. --model-arg num_layers=12 (repeatable)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the exported files in a folder that is not empty")
    return p


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    from autopar.passes.export import export_plan

    plan = read_plan(args.plan)
    if args.model_arg and not args.model:
        raise AutoparError("--model-arg without --model", where="--model-arg",
                           fix="the plan records its model; name --model only for a plan file "
                               "that records none")
    spec = model_spec(args) if args.model else None
    folder = export_plan(plan, args.folder, spec, overwrite=args.overwrite)
    console.print(f"wrote {folder}/: plan.json, model.json, train.py, launch.sh, README.md\n"
                  f"plan: {plan.summary()} on {plan.nodes} x {plan.gpus_per_node} GPUs\n"
                  f"run:  bash {folder}/launch.sh --steps 100 --save-every 50", highlight=False)
    return 0
