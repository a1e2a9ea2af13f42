"""``autopar export PLAN.json FOLDER [--format F]``: a plan as files a training framework reads.

Registered by ``autopar/cli/main.py`` (``add_export_parser`` on its sub-parsers, ``cmd_export`` in its
command table). The default format, ``autopar``, is the runnable torchrun folder of
``autopar.exports.folder``; ``megatron``, ``deepspeed``, ``torchtitan`` and ``bridge`` are
``autopar.exports``'; ``all`` (or a comma-separated list) writes each into ``FOLDER/<format>/``.
"""

from __future__ import annotations

import argparse

from rich.console import Console

from autopar.cli.args import model_spec, read_plan
from autopar.core.errors import AutoparError
from autopar.exports import FORMATS


def add_export_parser(sub: argparse._SubParsersAction,
                      parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``export`` command to ``sub`` (the ``autopar`` sub-parsers)."""
    p = sub.add_parser(
        "export", parents=parents,
        help="write a plan as a runnable torchrun folder, or as another framework's config",
        description="Write FOLDER for a plan. --format autopar (the default): plan.json, "
                    "model.json, train.py (builds the model, applies the plan, trains, "
                    "checkpoints and resumes), launch.sh (torchrun for the plan's nodes and GPUs "
                    "per node) and a README. megatron: megatron_args.sh (Megatron-LM arguments); "
                    "deepspeed: ds_config.json; torchtitan: a Trainer.Config function and its "
                    "saved JSON; bridge: Megatron-Bridge recipe overrides. Each README lists "
                    "what maps exactly and what does not; a plan a target cannot run is refused.")
    p.add_argument("plan", help="a plan file (autopar plan --json F)")
    p.add_argument("folder", help="the folder to write (created; must be empty)")
    p.add_argument("--model", default=None,
                   help="the model, for a plan file that records none (default: the plan's)")
    p.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a field of --model, e.g. --model-arg num_layers=12 (repeatable)")
    p.add_argument("--format", default="autopar", metavar="F",
                   help=f"{' | '.join(FORMATS)} | all, or a comma-separated list "
                        "(default autopar)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the exported files in a folder that is not empty")
    p.add_argument("--allow-approximate", action="store_true",
                   help="write a model whose architecture the target's switches do not express "
                        "(megatron, bridge) anyway; its README says what is not carried")
    return p


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    plan = read_plan(args.plan)
    if args.model_arg and not args.model:
        raise AutoparError("--model-arg without --model", where="--model-arg",
                           fix="the plan records its model; name --model only for a plan file "
                               "that records none")
    spec = model_spec(args) if args.model else None
    from autopar.exports import export_formats, formats_of

    names = formats_of(args.format)
    written = export_formats(plan, args.folder, names, spec, overwrite=args.overwrite,
                             allow_approximate=args.allow_approximate)
    console.print(f"plan: {plan.summary()} on {plan.nodes} x {plan.gpus_per_node} GPUs",
                  highlight=False)
    for name, folder in written.items():
        files = ", ".join(sorted(p.name for p in folder.iterdir() if p.is_file()))
        console.print(f"wrote {folder}/ ({name}): {files}", highlight=False, soft_wrap=True)
    if "autopar" in written:
        console.print(f"run:  bash {written['autopar']}/launch.sh --steps 100 --save-every 50",
                      highlight=False)
    return 0
