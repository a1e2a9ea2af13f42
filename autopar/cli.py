"""The ``autopar`` command line (also ``python -m autopar``).

Errors a person can act on (``AutoparError``) print one paragraph and exit with status 2; pass
``--debug`` for the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table

from autopar.costmodel.cluster import ClusterSpec, preset_names
from autopar.costmodel.errors import AutoparError
from autopar.costmodel.specs import ParallelConfig, TrainSpec, parse_checkpoint


def _add_model_cluster_train(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model, cluster and training step")
    g.add_argument("--model", required=True,
                   help="a zoo preset or family (autopar models), or FILE.py:FACTORY")
    g.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model field, e.g. --model-arg num_layers=12 (repeatable)")
    g.add_argument("--cluster", default=None, help="a cluster preset (autopar clusters)")
    g.add_argument("--cluster-file", default=None, help="a YAML/JSON cluster file")
    g.add_argument("--nodes", type=int, default=None, help="nodes of the cluster preset")
    g.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    g.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sequence (default: the model's)")
    g.add_argument("--precision", default="bf16", help="bf16 | fp16 | bf16-pure | fp32")
    g.add_argument("--optimizer", default="adamw", help="adamw | adam | sgd")


def _add_parallel(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("parallel configuration (ParallelConfig fields)")
    for axis in ("dp", "tp", "pp", "cp", "ep"):
        g.add_argument(f"--{axis}", type=int, default=None)
    g.add_argument("--zero", type=int, default=None, help="ZeRO stage 0-3")
    g.add_argument("--micro-batch", type=int, default=None)
    g.add_argument("--num-microbatches", type=int, default=None)
    g.add_argument("--schedule", default=None, help="gpipe | 1f1b | interleaved")
    g.add_argument("--virtual-stages", type=int, default=None)
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--checkpoint", default=None,
                   help="none | selective | full, or a comma-separated policy per block")
    g.add_argument("--offload", action=argparse.BooleanOptionalAction, default=None)


def _parse_value(text: str) -> object:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _model(args: argparse.Namespace):
    from autopar import models
    from autopar.user_model import is_user_model, load_user_model

    if is_user_model(args.model):
        return load_user_model(args.model)

    overrides: dict[str, object] = {}
    for item in args.model_arg:
        key, sep, value = item.partition("=")
        if not sep:
            raise AutoparError(f"--model-arg {item!r} is not KEY=VALUE", where="--model-arg",
                               fix="write e.g. --model-arg num_layers=12")
        overrides[key.strip()] = _parse_value(value.strip())
    if args.seq_len is not None:
        overrides.setdefault("seq_len", args.seq_len)
    return models.build(args.model, device="meta", **overrides)


def _cluster(args: argparse.Namespace) -> ClusterSpec:
    if args.cluster_file:
        cluster = ClusterSpec.from_file(args.cluster_file)
        return cluster.with_nodes(args.nodes) if args.nodes else cluster
    if not args.cluster:
        raise AutoparError("no cluster given", where="--cluster / --cluster-file",
                           fix=f"pass --cluster with one of {', '.join(preset_names())}, "
                               "or --cluster-file")
    return ClusterSpec.preset(args.cluster, nodes=args.nodes or 1)


def _train(args: argparse.Namespace, model) -> TrainSpec:
    from autopar.tracing import resolve_seq_len

    seq = resolve_seq_len(model, None, args.seq_len)
    return TrainSpec(global_batch=args.global_batch, seq_len=seq, precision=args.precision,
                     optimizer=args.optimizer)


def _config(args: argparse.Namespace, cluster: ClusterSpec) -> ParallelConfig:
    fields: dict[str, object] = {}
    for name in ("tp", "pp", "cp", "ep", "zero", "micro_batch", "num_microbatches", "schedule",
                 "virtual_stages", "sequence_parallel", "offload"):
        value = getattr(args, name)
        if value is not None:
            fields[name] = value
    if args.checkpoint is not None:
        fields["checkpoint"] = parse_checkpoint(args.checkpoint)
    if args.dp is not None:
        fields["dp"] = args.dp
    else:
        inner = int(fields.get("tp", 1)) * int(fields.get("pp", 1)) * int(fields.get("cp", 1))
        if cluster.num_gpus % inner:
            raise AutoparError(
                f"tp*pp*cp = {inner} does not divide the {cluster.num_gpus} GPUs of the cluster",
                where="--tp/--pp/--cp", fix="choose degrees whose product divides the GPU count")
        fields["dp"] = cluster.num_gpus // inner
    if fields.get("virtual_stages", 1) != 1 and "schedule" not in fields:
        fields["schedule"] = "interleaved"
    return ParallelConfig(**fields)  # type: ignore[arg-type]


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

    model = _model(args)
    cluster = _cluster(args)
    train = _train(args, model)
    config = _config(args, cluster)
    with console.status("tracing and costing..."):
        est = estimate(model, cluster, train, config)
    console.print(estimate_tables(est, cluster, title=f"{args.model} on {cluster.name}"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(est.to_dict(), f, indent=2, default=str)
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, Console], int]] = {
    "models": cmd_models,
    "clusters": cmd_clusters,
    "estimate": cmd_estimate,
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autopar", description=__doc__.splitlines()[0])
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("models", help="list the built-in model zoo")
    sub.add_parser("clusters", help="list the cluster presets")
    est = sub.add_parser("estimate", help="predict step time and memory of one configuration")
    _add_model_cluster_train(est)
    _add_parallel(est)
    est.add_argument("--json", default=None, metavar="F", help="also write the estimate as JSON")
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
