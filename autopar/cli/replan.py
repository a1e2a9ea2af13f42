"""``autopar replan PLAN.json --nodes N | --lost-nodes K | --gpus G``: the plan's model and
batch on the GPUs left, exported so that ``train.py --resume`` continues the old run
(``autopar/search/replan.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from autopar.cli.args import add_trace_cache, positive, read_plan, write_text
from autopar.core.errors import AutoparError
from autopar.costmodel.cluster import CLUSTER_FILE_SUFFIXES, ClusterSpec


def add_replan_parser(sub: argparse._SubParsersAction, parents: list) -> None:
    p = sub.add_parser("replan", parents=parents,
                       help="re-plan a plan on the nodes left and export it to resume",
                       description="Plan the same model and global batch on fewer (or more) "
                                   "GPUs and export it; its train.py --resume continues the "
                                   "old plan's checkpoints.")
    p.add_argument("plan", metavar="PLAN.json", help="the plan the run was started with")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--nodes", type=positive, help="nodes left")
    size.add_argument("--lost-nodes", type=positive, metavar="K", help="nodes lost")
    size.add_argument("--gpus", type=positive, help="GPUs left (whole nodes)")
    p.add_argument("--cluster", default=None,
                   help="the cluster (preset or file), when the plan's is no preset")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="export folder of the new plan (default: replan-<G>gpu beside the plan)")
    p.add_argument("--json", default=None, metavar="F", help="also write the new plan as JSON")
    add_trace_cache(p)
    p.add_argument("--checkpoint-dir", default="checkpoints", metavar="D",
                   help="where the old run saved its checkpoints (for the resume command shown)")


def cmd_replan(args: argparse.Namespace, console: Console) -> int:
    from autopar.api import replan

    plan = read_plan(args.plan, where="PLAN.json")
    cluster = None
    if args.cluster:
        cluster = (ClusterSpec.from_file(args.cluster)
                   if args.cluster.lower().endswith(CLUSTER_FILE_SUFFIXES)
                   else ClusterSpec.preset(args.cluster))
    per = cluster.gpus_per_node if cluster is not None else plan.gpus_per_node
    if args.gpus is not None:
        gpus = args.gpus
    elif args.nodes is not None:
        gpus = args.nodes * per
    else:
        if args.lost_nodes >= plan.nodes:
            raise AutoparError(f"losing {args.lost_nodes} of the plan's {plan.nodes} nodes "
                               "leaves none", where="--lost-nodes", fix="lose fewer nodes")
        gpus = (plan.nodes - args.lost_nodes) * per
    with console.status(f"re-planning {plan.model} on {gpus} GPUs..."):
        result = replan(plan, gpus, cluster, trace_cache=not args.no_cache)
    new = result.plan
    out = Path(args.out) if args.out else Path(args.plan).resolve().parent / f"replan-{gpus}gpu"
    folder = new.export(out, new.model_spec)
    if args.json:
        write_text(args.json, new.to_json(), "--json")
    console.print(f"was: {plan.summary()} on {plan.nodes * plan.gpus_per_node} GPUs "
                  f"({plan.estimate.step_time_s:.3f} s per step)")
    console.print(f"now: {new.summary()} on {gpus} GPUs ({new.estimate.step_time_s:.3f} s per "
                  f"step, {new.estimate.peak_memory_bytes / 2**30:.1f} GiB peak)")
    if result.note:
        console.print(f"note: {result.note}")
    console.print(f"exported to {folder}; resume the old run with\n  bash {folder}/launch.sh "
                  f"--resume --checkpoint-dir {args.checkpoint_dir}")
    return 0
