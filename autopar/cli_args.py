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
    tp*pp*cp (to 1 without ``gpus``), ``--virtual-stages`` implies the interleaved schedule."""
    from autopar.core.specs import ParallelConfig

    fields = dict(fields)
    if "dp" not in fields:
        inner = int(fields.get("tp", 1)) * int(fields.get("pp", 1)) * int(fields.get("cp", 1))
        if gpus is not None and gpus % inner:
            raise AutoparError(f"tp*pp*cp = {inner} does not divide the {gpus} GPUs; {gpus} is "
                               f"not a multiple of {inner}", where=where,
                               fix="choose degrees whose product divides the GPU count, or --dp")
        fields["dp"] = (gpus or inner) // inner
    if fields.get("virtual_stages", 1) != 1 and "schedule" not in fields:
        fields["schedule"] = "interleaved"
    return ParallelConfig(**fields)  # type: ignore[arg-type]


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
