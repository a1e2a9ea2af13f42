"""``autopar export PLAN.json FOLDER``: write a runnable training folder for a plan.

Registered by ``autopar/cli.py`` (``add_export_parser`` on its sub-parsers, ``cmd_export`` in its
command table); the folder's contents are ``autopar.passes.export``'s.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from autopar.cli_args import model_overrides, read_plan


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
                   help="the zoo preset or family to build (default: the plan's model)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model field, e.g. --model-arg num_layers=12 (repeatable)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the exported files in a folder that is not empty")
    return p


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    from autopar.passes.export import export_plan
    from autopar.training import ModelSpec

    plan = read_plan(args.plan)
    spec = None
    if args.model or args.model_arg:
        spec = ModelSpec(args.model or plan.model, model_overrides(args.model_arg))
    folder = export_plan(plan, args.folder, spec, overwrite=args.overwrite)
    console.print(f"wrote {folder}/: plan.json, model.json, train.py, launch.sh, README.md\n"
                  f"plan: {plan.summary()} on {plan.nodes} x {plan.gpus_per_node} GPUs\n"
                  f"run:  bash {folder}/launch.sh --steps 100 --save-every 50", highlight=False)
    return 0
