"""What the commands share: the model, cluster, training and parallel flags and reading them
back, model field overrides, plan files, the progress bar."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig, Schedule, TrainSpec, parse_checkpoint
from autopar.costmodel.cluster import (CLUSTER_FILE_SUFFIXES, ClusterSpec, preset_names,
                                       profile_cluster)
from autopar.costmodel.profile import Profile


def parse_value(text: str) -> object:
    """``12`` -> 12, ``0.1`` -> 0.1, ``true`` -> True, ``none``/``null`` -> None (e.g.
    ``capacity_factor=none``: a dropless MoE), anything else the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None, "null": None}.get(text.lower(), text)


def model_overrides(items: list[str]) -> dict[str, object]:
    """``--model-arg KEY=VALUE`` items as a dict of parsed values."""
    overrides: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise AutoparError(f"--model-arg {item!r} is not KEY=VALUE", where="--model-arg",
                               fix="write e.g. --model-arg num_layers=12")
        overrides[key.strip()] = parse_value(value.strip())
    return overrides


def model_spec(args) -> ModelSpec:
    """The ``ModelSpec`` of ``--model`` and ``--model-arg`` (and, for a zoo model, ``--seq-len``
    as its ``seq_len`` unless ``--model-arg seq_len`` is given)."""
    overrides = model_overrides(args.model_arg)
    spec = ModelSpec.parse(args.model, overrides)
    seq = getattr(args, "seq_len", None)
    if spec.name and seq is not None and "seq_len" not in overrides:
        spec = ModelSpec(spec.name, {**spec.overrides, "seq_len": seq})
    return spec


def config_from_fields(fields: dict[str, object], gpus: int | None, where: str):
    """The ``ParallelConfig`` of the given flags: ``dp`` defaults to the ``gpus`` left over by
    tp*pp*cp (to 1 without ``gpus``), ``--virtual-stages`` implies the interleaved schedule.

    The experts' mesh folds over the data-parallel ranks (and the tp ranks under sequence
    parallelism: ``autopar.core.mesh``), so ``ParallelConfig.dp`` counts the ep ranks too. A user who writes ``--ep 2 --dp 2`` for four
    GPUs means DeepSpeed's reading -- dp expert-data-parallel replicas of ep expert shards, ep x
    dp ranks in all -- and gets it: where ``dp*tp*pp*cp`` falls short of ``gpus`` by exactly
    the factor ep, ``dp`` becomes ``dp * ep`` (``expert_dp_note`` says so)."""
    fields = dict(fields)
    inner = int(fields.get("tp", 1)) * int(fields.get("pp", 1)) * int(fields.get("cp", 1))
    if "dp" not in fields:
        if gpus is not None and gpus % inner:
            raise AutoparError(f"tp*pp*cp = {inner} does not divide the {gpus} GPUs; {gpus} is "
                               f"not a multiple of {inner}", where=where,
                               fix="choose degrees whose product divides the GPU count, or --dp")
        fields["dp"] = (gpus or inner) // inner
    elif _counts_expert_replicas(fields, inner, gpus):
        fields["dp"] = int(fields["dp"]) * int(fields["ep"])  # type: ignore[call-overload]
    if fields.get("virtual_stages", 1) != 1 and "schedule" not in fields:
        fields["schedule"] = "interleaved"
    return ParallelConfig(**fields)  # type: ignore[arg-type]


def _counts_expert_replicas(fields: dict[str, object], inner: int, gpus: int | None) -> bool:
    """Whether ``--dp`` was given as the expert-data-parallel degree beside ``--ep``: ep x dp x
    tp x pp x cp is the GPU count and dp x tp x pp x cp is not."""
    ep, dp = int(fields.get("ep", 1)), int(fields["dp"])  # type: ignore[call-overload]
    return gpus is not None and ep > 1 and dp * inner != gpus and dp * ep * inner == gpus


def expert_dp_note(fields: dict[str, object], config) -> str | None:
    """The sentence saying ``--dp`` was read as expert-data-parallel replicas beside ``--ep``
    (``config_from_fields``), or ``None`` where it was taken as given."""
    given = fields.get("dp")
    if given is None or config.ep == 1 or int(given) == config.dp:  # type: ignore[call-overload]
        return None
    return (f"--dp {given} --ep {config.ep}: {given} expert data-parallel replicas of {config.ep} "
            f"expert shards, i.e. dp {config.dp} with ep {config.ep} carved from it "
            f"(autopar's ParallelConfig.dp counts the ep ranks)")


def read_plan(path: str, where: str = "PLAN"):
    """The ``Plan`` in a JSON file (``Plan.from_file``), or an ``AutoparError`` saying why not,
    located at the command-line argument ``where``."""
    from autopar.core.plan import Plan

    try:
        return Plan.from_file(path)
    except AutoparError as err:
        raise AutoparError(err.what, where=f"{where} {path}", fix=err.fix) from None


def write_text(path: str, text: str, flag: str) -> None:
    """Write ``text`` to ``path`` (a command's output file), or an ``AutoparError`` located at
    ``flag`` saying why not."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as err:
        raise AutoparError(f"cannot write {path}: {err.strerror}", where=flag,
                           fix="pass a path in a folder that exists and that you can write to"
                           ) from None


@contextmanager
def progress_bar(description: str) -> Iterator[Callable[[int, int, str], None]]:
    """A transient progress bar on stderr, shown only when stderr is a terminal; yields
    ``update(done, total, description)``."""
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                               TextColumn, TimeElapsedColumn)

    stderr = Console(stderr=True)
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                   MofNCompleteColumn(), TimeElapsedColumn(), console=stderr, transient=True,
                   disable=not stderr.is_terminal, redirect_stdout=False, redirect_stderr=False)
    with bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int, text: str) -> None:
            bar.update(task, description=text, completed=done, total=total)

        yield update


CONFIG_FLAGS = tuple(f.name for f in dataclasses.fields(ParallelConfig))
"""Every ``ParallelConfig`` field, each a flag of ``estimate`` and ``plan``."""


def add_model_cluster_train(p: argparse.ArgumentParser) -> None:
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
    g.add_argument("--precision", default="bf16",
                   help="bf16 | fp16 | bf16-pure | fp32 | fp8; plan also takes auto (the best of "
                        "bf16 and fp8) or a list: bf16,fp8")
    g.add_argument("--fp8-recipe", default="tensorwise",
                   help="with --precision fp8: tensorwise (FP8 weight all-gather) | rowwise")
    g.add_argument("--grad-dtype", default="fp32",
                   help="under bf16 and fp8: fp32 (default) | bf16, what the gradients are "
                        "accumulated and reduced in (Megatron-LM's --grad-reduce-in-bf16)")
    g.add_argument("--optimizer", default="adamw", help="adamw | adam | sgd")


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def add_parallel(p: argparse.ArgumentParser, title: str) -> None:
    g = p.add_argument_group(title)
    for axis in ("dp", "tp", "pp", "cp", "ep"):
        g.add_argument(f"--{axis}", type=positive, default=None, metavar="N")
    g.add_argument("--etp", type=positive, default=None, metavar="N",
                   help="expert tensor parallelism: each expert split over N of the tp ranks "
                        "(needs --sequence-parallel; the experts' mesh then folds over tp, so "
                        "--ep may span tp ranks too)")
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=None, help="ZeRO stage")
    g.add_argument("--micro-batch", type=positive, default=None, metavar="N")
    g.add_argument("--num-microbatches", type=positive, default=None, metavar="N")
    g.add_argument("--schedule", choices=[s.value for s in Schedule], default=None)
    g.add_argument("--virtual-stages", type=positive, default=None, metavar="N")
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=None)
    g.add_argument("--checkpoint", default=None,
                   help="none | selective | matmuls | full, or a comma-separated policy per block")
    g.add_argument("--offload", action=argparse.BooleanOptionalAction, default=None,
                   help="optimizer states in CPU memory")
    g.add_argument("--fusions", type=names, default=None, metavar="A,B",
                   help="fused kernels, e.g. scale_mask_softmax,bias_dropout_add")


def model_from_args(args: argparse.Namespace):
    """(``ModelSpec``, the model built on the meta device) of ``--model``/``--model-arg``."""
    spec = model_spec(args)
    return spec, spec.build("meta")


def cluster_from_args(args: argparse.Namespace) -> ClusterSpec:
    """``--cluster`` (a preset name, or a cluster file) or ``--cluster-file``, with
    ``--nodes`` (default: the file's nodes, one node of a preset) and ``--memory-headroom``."""
    cluster = _cluster_named(args)
    if getattr(args, "profile", None):
        cluster = cluster.with_profile(Profile.load(args.profile))
    if getattr(args, "memory_headroom", None) is None:
        return cluster
    try:
        return dataclasses.replace(cluster, memory_headroom=args.memory_headroom)
    except AutoparError as err:
        raise AutoparError(f"--memory-headroom {args.memory_headroom}: {err.what}",
                           where="--memory-headroom", fix=err.fix) from None


def _cluster_named(args: argparse.Namespace) -> ClusterSpec:
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
        return profile_cluster(Profile.load(args.profile)).with_nodes(args.nodes or 1)
    if not args.cluster:
        raise AutoparError("no cluster given", where="--cluster / --cluster-file",
                           fix=f"pass --cluster with one of {', '.join(preset_names())}, "
                               "or a cluster file (--cluster my.yaml)")
    return ClusterSpec.preset(args.cluster, nodes=args.nodes or 1)


def efficiency_from_args(args: argparse.Namespace):
    """``--calibration``'s constants, or the defaults."""
    from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY, load_calibration

    path = getattr(args, "calibration", None)
    return load_calibration(path) if path else DEFAULT_EFFICIENCY


def train_from_args(args: argparse.Namespace, model) -> TrainSpec:
    from autopar.analysis.tracing import resolve_seq_len

    seq = resolve_seq_len(model, None, args.seq_len)
    return TrainSpec(global_batch=args.global_batch, seq_len=seq, precision=args.precision,
                     optimizer=args.optimizer, fp8_recipe=args.fp8_recipe,
                     grad_dtype=args.grad_dtype)


def given_fields(args: argparse.Namespace) -> dict[str, object]:
    """The ``ParallelConfig`` fields given on the command line, parsed."""
    fields = {name: getattr(args, name) for name in CONFIG_FLAGS
              if getattr(args, name) is not None}
    if "checkpoint" in fields:
        fields["checkpoint"] = parse_checkpoint(str(fields["checkpoint"]))
    return fields


def config_from_args(args: argparse.Namespace, cluster: ClusterSpec) -> ParallelConfig:
    return config_from_fields(given_fields(args), cluster.num_gpus, "--tp/--pp/--cp")


def nonnegative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def add_trace_cache(parser: argparse.ArgumentParser) -> None:
    """``--no-cache``: trace the model again instead of reading the cache of traced graphs
    (``analysis/trace_cache.py``), which the commands that trace a model read and fill."""
    parser.add_argument("--no-cache", action="store_true",
                        help="trace the model again, neither reading nor writing the cache of "
                             "traced graphs ($AUTOPAR_CACHE_DIR, default ~/.cache/autopar)")
