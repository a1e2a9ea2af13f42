"""Argument parsing shared by the commands: model field overrides and plan files."""

from __future__ import annotations

from pathlib import Path

from autopar.costmodel.errors import AutoparError


def parse_value(text: str) -> object:
    """``12`` -> 12, ``0.1`` -> 0.1, ``true`` -> True, anything else the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


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


def config_from_fields(fields: dict[str, object], gpus: int | None, where: str):
    """The ``ParallelConfig`` of the given flags: ``dp`` defaults to the ``gpus`` left over by
    tp*pp*cp (to 1 without ``gpus``), ``--virtual-stages`` implies the interleaved schedule."""
    from autopar.costmodel.specs import ParallelConfig

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
    """The ``Plan`` in a JSON file, or an ``AutoparError`` saying why not."""
    from autopar.plan import Plan

    fix = "pass a plan written by `autopar plan --json F` or Plan.to_json()"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise AutoparError(f"cannot read the plan file {path}: {err.strerror}", where=where,
                           fix=fix) from None
    try:
        return Plan.from_json(text)
    except (ValueError, KeyError, TypeError) as err:  # bad JSON, missing or invalid fields
        raise AutoparError(f"{path} is not a plan file ({type(err).__name__}: {err})",
                           where=where, fix=fix) from None
