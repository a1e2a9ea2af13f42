"""``autopar models``, ``clusters``, ``estimate`` and ``plan``: the zoo and the presets listed,
one configuration priced, and the search for the fastest plan that fits."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

from autopar.cli.args import (add_model_cluster_train, add_parallel, add_trace_cache,
                              cluster_from_args,
                              config_from_args, efficiency_from_args, expert_dp_note,
                              given_fields, model_from_args, nonnegative, progress_bar,
                              train_from_args, write_text)
from autopar.cli.dryrun import add_workers_argument
from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.costmodel.cluster import ClusterSpec, preset_names


def add_plan_parsers(sub: argparse._SubParsersAction, parents: list) -> None:
    """The parsers of ``models``, ``clusters``, ``estimate`` and ``plan``."""
    debug, = parents
    sub.add_parser("models", help="list the built-in model zoo", parents=[debug])
    sub.add_parser("clusters", help="list the cluster presets", parents=[debug])
    est = sub.add_parser("estimate", help="predict step time and memory of one configuration",
                         parents=[debug])
    add_model_cluster_train(est)
    add_parallel(est, "parallel configuration (ParallelConfig fields; dp defaults to the rest)")
    est.add_argument("--json", default=None, metavar="F", help="also write the estimate as JSON")
    add_trace_cache(est)
    plan = sub.add_parser("plan", help="search for the fastest plan that fits", parents=[debug],
                          description="Search for the fastest parallel plan that fits; print "
                                      "its report and why it beat the runner-ups.")
    add_model_cluster_train(plan)
    add_parallel(plan, "constraints (ParallelConfig fields the search must keep)")
    add_trace_cache(plan)
    out = plan.add_argument_group("output")
    out.add_argument("--json", default=None, metavar="F", help="write the plan as JSON")
    out.add_argument("--html", default=None, metavar="F", help="write the report as one self-contained HTML page (charts: memory per "
                          "stage, pipeline schedule, time per step, runner-ups)")
    out.add_argument("--keep", type=nonnegative, default=3, metavar="N",
                     help="runner-up plans to keep and compare (default 3)")
    out.add_argument("--explain", action=argparse.BooleanOptionalAction, default=True,
                     help="print why this plan and not the runner-ups (default on)")
    run = plan.add_argument_group("the whole run (costmodel/goodput.py)")
    run.add_argument("--tokens", type=float, default=None, metavar="N",
                     help="tokens to train (e.g. 15e12): days, GPU-hours, cost, checkpoints and "
                          "interruptions of the whole run")
    run.add_argument("--gpu-hour-cost", type=float, default=None, metavar="PRICE",
                     help="price of one GPU-hour, for the run's cost")
    run.add_argument("--failure-rate", type=float, default=None, metavar="PER_GPU_HOUR",
                     help="interruptions per GPU-hour (default: the cluster's; presets: Llama 3 "
                          "405B's, 1.97e-5)")
    run.add_argument("--restart-s", type=float, default=None, metavar="S",
                     help="seconds to relaunch after an interruption (default: the cluster's; "
                          "presets: 600, assumed)")
    run.add_argument("--storage-gbps", type=float, default=None, metavar="GB/S",
                     help="checkpoint storage bandwidth, decimal GB/s (default: the cluster's; "
                          "presets: 2000, Llama 3's)")
    run.add_argument("--sweep-gpus", default=None, metavar="A:B",
                     help="plan every GPU count from A to B, doubling (whole nodes), and tabulate "
                          "time to train, goodput and cost against GPUs (needs --tokens)")
    check = plan.add_argument_group("dry-run check")
    check.add_argument("--check", action="store_true",
                       help="dry-run the plan and its runner-ups (every rank role, one step on "
                            "fake tensors), drop those whose dry run does not fit, and print "
                            "predicted against dry-run peak per pipeline rank")
    add_workers_argument(check)


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
    from autopar.report.text import estimate_tables

    _, model = model_from_args(args)
    cluster = cluster_from_args(args)
    train = train_from_args(args, model)
    config = config_from_args(args, cluster)
    note = expert_dp_note(given_fields(args), config)
    if note is not None:
        console.print(note)
    with console.status("tracing and costing..."):
        est = estimate(model, cluster, train, config, efficiency=efficiency_from_args(args),
                       trace_cache=not args.no_cache)
    console.print(estimate_tables(est, cluster, title=f"{args.model} on {cluster.name}"))
    if args.json:
        write_text(args.json, json.dumps(est.to_dict(), indent=2, default=str), "--json")
    return 0


AUTO_PRECISIONS = ("bf16", "fp8")
"""What ``--precision auto`` searches: bf16 and, where the GPU has FP8 tensor cores, fp8."""


def precisions_of(text: str) -> tuple[str, ...]:
    """``--precision``: one precision, ``auto`` (``AUTO_PRECISIONS``) or a comma-separated
    list, each checked against ``Precision``."""
    from autopar.core.specs import Precision

    names = AUTO_PRECISIONS if text == "auto" else tuple(p.strip() for p in text.split(","))
    allowed = ", ".join(p.value for p in Precision)
    for name in names:
        if name not in {p.value for p in Precision}:
            raise AutoparError(f"precision {name!r} is not one of {allowed}", where="--precision",
                               fix=f"give one of {allowed}, 'auto', or a list: bf16,fp8")
    return names


def sweep_sizes(text: str, gpus_per_node: int) -> list[int]:
    """``--sweep-gpus A:B``: GPU counts from A to B, doubling, each a whole number of nodes."""
    try:
        low, high = (int(float(x)) for x in text.split(":"))
    except ValueError:
        raise AutoparError(f"--sweep-gpus {text!r} is not A:B", where="--sweep-gpus",
                           fix="give two GPU counts, e.g. --sweep-gpus 1024:16384") from None
    if not 1 <= low <= high:
        raise AutoparError(f"--sweep-gpus {text}: A must be at least 1 and at most B",
                           where="--sweep-gpus", fix="e.g. --sweep-gpus 1024:16384")
    sizes, n = [], low
    while n <= high:
        nodes = max(1, -(-n // gpus_per_node))  # whole nodes
        if not sizes or nodes * gpus_per_node != sizes[-1]:
            sizes.append(nodes * gpus_per_node)
        n *= 2
    return sizes


def _sweep(args: argparse.Namespace, spec, model, cluster, train, constraints, precisions,
           console: Console) -> int:
    """``--sweep-gpus``: the best plan at each GPU count and its whole run, as a table (and
    ``--json``: every size's run)."""
    from autopar.api import optimize
    from autopar.costmodel.goodput import goodput_of
    from autopar.report.goodput import sweep_table

    if args.tokens is None:
        raise AutoparError("--sweep-gpus without --tokens", where="--sweep-gpus",
                           fix="add --tokens N: the sweep compares the time to train")
    reliability = _reliability(args, cluster)
    params = float(sum(p.numel() for p in model.parameters()))
    rows = []
    for gpus in sweep_sizes(args.sweep_gpus, cluster.gpus_per_node):
        sized = cluster.with_nodes(gpus // cluster.gpus_per_node)
        try:
            with _searching(f"{spec.label} on {gpus} GPUs") as progress:
                plan = optimize(model, sized, train, constraints, keep=1, progress=progress,
                                name=spec.label, model_spec=spec,
                                efficiency=efficiency_from_args(args),
                                precisions=precisions if len(precisions) > 1 else (),
                                trace_cache=not args.no_cache)
        except AutoparError as err:
            rows.append((gpus, None, None, err.what))
            continue
        run = goodput_of(tokens=args.tokens, tokens_per_step=plan.train.tokens_per_step,
                         step_s=plan.estimate.step_time_s, gpus=gpus, params=params,
                         train=plan.train, reliability=reliability,
                         gpu_hour_cost=args.gpu_hour_cost)
        rows.append((gpus, plan, run, ""))
    table = sweep_table(rows)
    console.print(table)
    if args.html:
        from autopar.report.html import sweep_page

        write_text(args.html, sweep_page(f"{spec.label}: time to train against GPUs "
                                         f"({args.tokens:.3g} tokens)", rows, table), "--html")
    if args.json:
        doc = {"sweep": [{"gpus": g, "plan": None if p is None else p.summary(),
                          "step_time_s": None if p is None else p.estimate.step_time_s,
                          "goodput": None if r is None else r.to_dict(), "refused": why}
                         for g, p, r, why in rows]}
        write_text(args.json, json.dumps(doc, sort_keys=True, indent=1) + "\n", "--json")
    return 0 if any(p is not None for _, p, _, _ in rows) else 2


def _reliability(args: argparse.Namespace, cluster):
    """The cluster's ``Reliability`` (its fields), with what the flags set."""
    from dataclasses import replace

    from autopar.costmodel.goodput import Reliability

    given = {"failure_rate_per_gpu_hour": args.failure_rate, "relaunch_s": args.restart_s,
             "storage_bytes_per_s": None if args.storage_gbps is None
             else args.storage_gbps * 1e9}
    return replace(Reliability.of(cluster), **{k: v for k, v in given.items() if v is not None})


def _goodput(args: argparse.Namespace, plan, model, cluster, console: Console):
    """The whole run and its table when ``--tokens`` is given (printed), or ``None``s."""
    given = {"--gpu-hour-cost": args.gpu_hour_cost, "--failure-rate": args.failure_rate,
             "--restart-s": args.restart_s, "--storage-gbps": args.storage_gbps}
    if args.tokens is None:
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise AutoparError(f"{', '.join(extra)} without --tokens", where=extra[0],
                               fix="add --tokens N: they price the whole run")
        return None, None
    from autopar.costmodel.goodput import goodput_of
    from autopar.report.goodput import goodput_table

    reliability = _reliability(args, cluster)
    run = goodput_of(tokens=args.tokens, tokens_per_step=plan.train.tokens_per_step,
                     step_s=plan.estimate.step_time_s,
                     gpus=plan.nodes * plan.gpus_per_node,
                     params=float(sum(p.numel() for p in model.parameters())),
                     train=plan.train, reliability=reliability,
                     gpu_hour_cost=args.gpu_hour_cost)
    table = goodput_table(run, reliability)
    console.print(table)
    return run, table


def cmd_plan(args: argparse.Namespace, console: Console) -> int:
    from autopar.api import optimize

    spec, model = model_from_args(args)
    cluster = cluster_from_args(args)
    precisions = precisions_of(args.precision)
    if len(precisions) > 1:  # searched: the spec takes the first, optimize tries each
        args.precision = precisions[0]
    train = train_from_args(args, model)
    constraints = given_fields(args)
    if args.workers is not None and not args.check:
        raise AutoparError("--workers without --check", where="--workers",
                           fix="add --check (the dry run is what --workers runs side by side)")
    if args.check:  # before the search, which can take a while
        from autopar.dryrun.run import check_dry_run_call

        check_dry_run_call(args.workers)
    if args.sweep_gpus is not None:
        return _sweep(args, spec, model, cluster, train, constraints, precisions, console)
    with _searching(f"{spec.label} on {cluster.num_gpus} GPUs") as progress:
        plan = optimize(model, cluster, train, constraints, keep=args.keep + 1,
                        progress=progress, name=spec.label, model_spec=spec,
                        efficiency=efficiency_from_args(args),
                        precisions=precisions if len(precisions) > 1 else (),
                        trace_cache=not args.no_cache)
    checked = ""
    if args.check:
        plan, checked = _checked(plan, spec, args.workers, console)
    text = plan.report() + (f"\n{plan.explain()}\n" if args.explain else "")
    text += f"\n{checked}" if checked else ""
    console.file.write(text)
    run, run_table = _goodput(args, plan, model, cluster, console)
    if args.json:
        doc = plan.to_json()
        if run is not None:
            data = json.loads(doc)
            data["goodput"] = run.to_dict()
            doc = json.dumps(data, sort_keys=True, indent=1) + "\n"
        write_text(args.json, doc, "--json")
    if args.html:
        from autopar.report.html import plan_page

        write_text(args.html, plan_page(plan, cluster, check=checked, run=run_table), "--html")
    return 0


def _checked(plan: Plan, spec: ModelSpec, workers: int | None, console: Console
             ) -> tuple[Plan, str]:
    """``plan --check``: (the checked plan, the check's text); when no plan is left, the text
    is printed before the error is raised."""
    from autopar.cli.dryrun import dry_run_progress
    from autopar.report.dryrun import check_report
    from autopar.dryrun.plan_check import PlanCheckError, check_plans

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
