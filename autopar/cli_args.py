"""What the commands share: model field overrides, plan files, the progress bar."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from autopar.core.errors import AutoparError

if TYPE_CHECKING:
    from autopar.core.model_spec import ModelSpec


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


def model_spec(args) -> "ModelSpec":
    """The ``ModelSpec`` of ``--model`` and ``--model-arg`` (and, for a zoo model, ``--seq-len``
    as its ``seq_len`` unless ``--model-arg seq_len`` is given)."""
    from autopar.core.model_spec import ModelSpec

    overrides = model_overrides(args.model_arg)
    spec = ModelSpec.parse(args.model, overrides)
    seq = getattr(args, "seq_len", None)
    if spec.name and seq is not None and "seq_len" not in overrides:
        spec = ModelSpec(spec.name, {**spec.overrides, "seq_len": seq})
    return spec


def config_from_fields(fields: dict[str, object], gpus: int | None, where: str):
    """The ``ParallelConfig`` of the given flags: ``dp`` defaults to the ``gpus`` left over by
    tp*pp*cp (to 1 without ``gpus``), ``--virtual-stages`` implies the interleaved schedule.

    Expert parallelism is carved from the data-parallel ranks (``autopar.core.mesh``), so
    ``ParallelConfig.dp`` counts the ep ranks too. A user who writes ``--ep 2 --dp 2`` for four
    GPUs means DeepSpeed's reading -- dp expert-data-parallel replicas of ep expert shards, ep x
    dp ranks in all -- and gets it: where ``dp*tp*pp*cp`` falls short of ``gpus`` by exactly
    the factor ep, ``dp`` becomes ``dp * ep`` (``expert_dp_note`` says so)."""
    from autopar.core.specs import ParallelConfig

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
