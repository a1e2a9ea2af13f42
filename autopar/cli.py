"""The ``autopar`` command line (also ``python -m autopar``).

Errors a person can act on (``AutoparError``) print one paragraph and exit with status 2; pass
``--debug`` for the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

from autopar.costmodel.cluster import CLUSTER_FILE_SUFFIXES, ClusterSpec, preset_names
from autopar.core.errors import AutoparError
from autopar.cli_args import (config_from_fields, expert_dp_note, model_spec, progress_bar,
                              write_text)
from autopar.cli_compare import add_compare_parser, cmd_compare
from autopar.cli_dryrun import add_dryrun_parser, add_workers_argument, cmd_dryrun
from autopar.cli_export import add_export_parser, cmd_export
from autopar.cli_profile import add_profile_parsers, cmd_calibrate, cmd_profile
from autopar.cli_verify import add_verify_parser
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.core.specs import ParallelConfig, Schedule, TrainSpec, parse_checkpoint

CONFIG_FLAGS = tuple(f.name for f in dataclasses.fields(ParallelConfig))
"""Every ``ParallelConfig`` field, each a flag of ``estimate`` and ``plan``."""


def _add_model_cluster_train(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model, cluster and training step")
    g.add_argument("--model", required=True,
                   help="a zoo preset or family (autopar models), FILE.py:FACTORY, or a "
                        "transformers config (a folder with config.json, or the file)")
    g.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model field, e.g. --model-arg num_layers=12 (repeatable)")
    g.add_argument("--cluster", default=None,
                   help="a cluster preset (autopar clusters) or a YAML/JSON cluster file")
    g.add_argument("--cluster-file", default=None, help="a YAML/JSON cluster file")
    g.add_argument("--nodes", type=int, default=None,
                   help="nodes (default: one node of a preset, a file's own count)")
    g.add_argument("--memory-headroom", type=float, default=None, metavar="F",
                   help="fraction of usable HBM a plan leaves free for what the memory model "
                        "can miss (default: the cluster's, 0.05 for presets; 0 fills it)")
    g.add_argument("--profile", default=None, metavar="FILE",
                   help="price with this machine's measurements (autopar profile); without "
                        "--cluster, plan for the profiled machine's own processes")
    g.add_argument("--calibration", default=None, metavar="FILE",
                   help="efficiency constants fitted by autopar calibrate")
    g.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    g.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sequence (default: the model's)")
    g.add_argument("--precision", default="bf16", help="bf16 | fp16 | bf16-pure | fp32")
    g.add_argument("--optimizer", default="adamw", help="adamw | adam | sgd")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _add_parallel(p: argparse.ArgumentParser, title: str) -> None:
    g = p.add_argument_group(title)
    for axis in ("dp", "tp", "pp", "cp", "ep"):
        g.add_argument(f"--{axis}", type=_positive, default=None, metavar="N")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None, help="ZeRO stage")
    g.add_argument("--micro-batch", type=_positive, default=None, metavar="N")
    g.add_argument("--num-microbatches", type=_positive, default=None, metavar="N")
    g.add_argument("--schedule", choices=[s.value for s in Schedule], default=None)
    g.add_argument("--virtual-stages", type=_positive, default=None, metavar="N")
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--checkpoint", default=None,
                   help="none | selective | matmuls | full, or a comma-separated policy per block")
    g.add_argument("--offload", action=argparse.BooleanOptionalAction, default=None,
                   help="optimizer states in CPU memory")
    g.add_argument("--fusions", type=_names, default=None, metavar="A,B",
                   help="fused kernels, e.g. scale_mask_softmax,bias_dropout_add")


def _model(args: argparse.Namespace):
    """(``ModelSpec``, the model built on the meta device) of ``--model``/``--model-arg``."""
    spec = model_spec(args)
    return spec, spec.build("meta")


def _cluster(args: argparse.Namespace) -> ClusterSpec:
    """``--cluster`` (a preset name, or a cluster file) or ``--cluster-file``, with
    ``--nodes`` (default: the file's nodes, one node of a preset) and ``--memory-headroom``."""
    cluster = _cluster_of(args)
    if getattr(args, "profile", None):
        from autopar.costmodel.profile import Profile

        cluster = cluster.with_profile(Profile.load(args.profile))
    if getattr(args, "memory_headroom", None) is None:
        return cluster
    try:
        return dataclasses.replace(cluster, memory_headroom=args.memory_headroom)
    except AutoparError as err:
        raise AutoparError(f"--memory-headroom {args.memory_headroom}: {err.what}",
                           where="--memory-headroom", fix=err.fix) from None


def _cluster_of(args: argparse.Namespace) -> ClusterSpec:
    if args.cluster and args.cluster_file:
        raise AutoparError(f"both --cluster {args.cluster} and --cluster-file "
                           f"{args.cluster_file} given", where="--cluster / --cluster-file",
                           fix="give one of them")
    if args.nodes is not None and args.nodes < 1:
        raise AutoparError(f"--nodes {args.nodes}: a cluster has at least one node",
                           where="--nodes", fix="pass --nodes 1 or more")
    path = args.cluster_file or (args.cluster if args.cluster and
                                 args.cluster.lower().endswith(CLUSTER_FILE_SUFFIXES) else None)
    if path:
        cluster = ClusterSpec.from_file(path)
        return cluster.with_nodes(args.nodes) if args.nodes else cluster
    if not args.cluster and getattr(args, "profile", None):
        from autopar.costmodel.cluster import profile_cluster
        from autopar.costmodel.profile import Profile

        return profile_cluster(Profile.load(args.profile)).with_nodes(args.nodes or 1)
    if not args.cluster:
        raise AutoparError("no cluster given", where="--cluster / --cluster-file",
                           fix=f"pass --cluster with one of {', '.join(preset_names())}, "
                               "or a cluster file (--cluster my.yaml)")
    return ClusterSpec.preset(args.cluster, nodes=args.nodes or 1)


def _efficiency(args: argparse.Namespace):
    """``--calibration``'s constants, or the defaults."""
    from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY, load_calibration

    path = getattr(args, "calibration", None)
    return load_calibration(path) if path else DEFAULT_EFFICIENCY


def _train(args: argparse.Namespace, model) -> TrainSpec:
    from autopar.tracing import resolve_seq_len

    seq = resolve_seq_len(model, None, args.seq_len)
    return TrainSpec(global_batch=args.global_batch, seq_len=seq, precision=args.precision,
                     optimizer=args.optimizer)


def _given_fields(args: argparse.Namespace) -> dict[str, object]:
    """The ``ParallelConfig`` fields given on the command line, parsed."""
    fields = {name: getattr(args, name) for name in CONFIG_FLAGS
              if getattr(args, name) is not None}
    if "checkpoint" in fields:
        fields["checkpoint"] = parse_checkpoint(str(fields["checkpoint"]))
    return fields


def _config(args: argparse.Namespace, cluster: ClusterSpec) -> ParallelConfig:
    return config_from_fields(_given_fields(args), cluster.num_gpus, "--tp/--pp/--cp")


def cmd_models(args: argparse.Namespace, console: Console) -> int:
    from autopar import models

    table = Table(title="Built-in models (autopar.models)")
    for col in ("name", "family", "parameters", "description"):
        table.add_column(col, justify="right" if col == "parameters" else "left")
    for name in models.names():
        d = models.describe(name)
        table.add_row(name, str(d["family"]), f"{d['params'] / 1e9:,.2f} B", str(d["description"]))
    console.print(table)
    return 0


def cmd_clusters(args: argparse.Namespace, console: Console) -> int:
    for name in preset_names():
        spec = ClusterSpec.preset(name)
        table = Table(title=name, show_header=False)
        table.add_column(style="bold")
        table.add_column()
        for field, value in spec.describe():
            table.add_row(field, value)
        console.print(table)
    return 0


def cmd_estimate(args: argparse.Namespace, console: Console) -> int:
    from autopar.api import estimate
    from autopar.report import estimate_tables

    _, model = _model(args)
    cluster = _cluster(args)
    train = _train(args, model)
    config = _config(args, cluster)
    note = expert_dp_note(_given_fields(args), config)
    if note is not None:
        console.print(note)
    with console.status("tracing and costing..."):
        est = estimate(model, cluster, train, config, efficiency=_efficiency(args))
    console.print(estimate_tables(est, cluster, title=f"{args.model} on {cluster.name}"))
    if args.json:
        write_text(args.json, json.dumps(est.to_dict(), indent=2, default=str), "--json")
    return 0


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from autopar.api import optimize

    spec, model = _model(args)
    cluster = _cluster(args)
    train = _train(args, model)
    constraints = _given_fields(args)
    if args.workers is not None and not args.check:
        raise AutoparError("--workers without --check", where="--workers",
                           fix="add --check (the dry run is what --workers runs side by side)")
    if args.check:  # before the search, which can take a while
        from autopar.dry_run import check_dry_run_call

        check_dry_run_call(args.workers)
    with _searching(f"{spec.label} on {cluster.num_gpus} GPUs") as progress:
        plan = optimize(model, cluster, train, constraints, keep=args.keep + 1,
                        progress=progress, name=spec.label, model_spec=spec,
                        efficiency=_efficiency(args))
    checked = ""
    if args.check:
        plan, checked = _checked(plan, spec, args.workers, console)
    text = plan.report() + (f"\n{plan.explain()}\n" if args.explain else "")
    text += f"\n{checked}" if checked else ""
    console.file.write(text)
    if args.json:
        write_text(args.json, plan.to_json(), "--json")
    if args.html:
        from autopar.report_html import plan_page

        write_text(args.html, plan_page(plan, cluster, check=checked), "--html")
    return 0


def _checked(plan: Plan, spec: ModelSpec, workers: int | None, console: Console
             ) -> tuple[Plan, str]:
    """``plan --check``: (the checked plan, the check's text); when no plan is left, the text
    is printed before the error is raised."""
    from autopar.cli_dryrun import check_report, dry_run_progress
    from autopar.plan_check import PlanCheckError, check_plans

    try:
        with dry_run_progress() as progress:
            check = check_plans(plan, spec, progress=progress, workers=workers)
    except PlanCheckError as err:
        console.file.write(check_report(err.checked))
        raise
    return check.plan, check_report(check.checked)


@contextmanager
def _searching(label: str) -> Iterator[Callable[[int, int], None]]:
    """``progress_bar`` as the ``progress(done, total)`` callback of ``optimize``."""
    with progress_bar(f"planning {label}") as update:
        # candidates come best bound first; the bound usually ends the search before total
        yield lambda done, total: update(done, total, f"searching {label}: candidates")


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from autopar.cli_verify import cmd_verify as run_verify

    return run_verify(args, console, _given_fields)


COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "models": cmd_models,
    "clusters": cmd_clusters,
    "estimate": cmd_estimate,
    "plan": cmd_plan,
    "verify": cmd_verify,
    "export": cmd_export,
    "compare": cmd_compare,
    "dryrun": cmd_dryrun,
    "profile": cmd_profile,
    "calibrate": cmd_calibrate,
}


def _nonnegative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autopar", description=__doc__.splitlines()[0])
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    # --debug is also accepted after the command; SUPPRESS keeps the one given before it
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("models", help="list the built-in model zoo", parents=[debug])
    sub.add_parser("clusters", help="list the cluster presets", parents=[debug])
    est = sub.add_parser("estimate", help="predict step time and memory of one configuration",
                         parents=[debug])
    _add_model_cluster_train(est)
    _add_parallel(est, "parallel configuration (ParallelConfig fields; dp defaults to the rest)")
    est.add_argument("--json", default=None, metavar="F", help="also write the estimate as JSON")
    plan = sub.add_parser("plan", help="search for the fastest plan that fits", parents=[debug],
                          description="Search for the fastest parallel plan that fits; print "
                                      "its report and why it beat the runner-ups.")
    _add_model_cluster_train(plan)
    _add_parallel(plan, "constraints (ParallelConfig fields the search must keep)")
    out = plan.add_argument_group("output")
    out.add_argument("--json", default=None, metavar="F", help="write the plan as JSON")
    out.add_argument("--html", default=None, metavar="F", help="write the report as one self-contained HTML page (charts: memory per "
                          "stage, pipeline schedule, time per step, runner-ups)")
    out.add_argument("--keep", type=_nonnegative, default=3, metavar="N",
                     help="runner-up plans to keep and compare (default 3)")
    out.add_argument("--explain", action=argparse.BooleanOptionalAction, default=True,
                     help="print why this plan and not the runner-ups (default on)")
    check = plan.add_argument_group("dry-run check")
    check.add_argument("--check", action="store_true",
                       help="dry-run the plan and its runner-ups (every rank role, one step on "
                            "fake tensors), drop those whose dry run does not fit, and print "
                            "predicted against dry-run peak per pipeline rank")
    add_workers_argument(check)
    add_verify_parser(sub, [debug], _add_parallel, _positive)
    add_export_parser(sub, [debug])
    add_compare_parser(sub, [debug])
    add_dryrun_parser(sub, [debug])
    add_profile_parsers(sub, [debug])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    console = Console()
    try:
        return COMMANDS[args.command](args, console)
    except AutoparError as err:
        if args.debug:
            raise
        print(f"autopar {args.command}: error: {err.paragraph()}", file=sys.stderr)
        return 2


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
