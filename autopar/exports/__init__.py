"""A plan in the terms of the training frameworks people run: ``autopar export --format``.

One module per target, each turning the same ``Plan`` into an ``Export`` (files and the table of
how every plan field maps, ``exports.mapping``): ``megatron`` (Megatron-LM arguments),
``deepspeed`` (a DeepSpeed config JSON), ``torchtitan`` (a ``Trainer.Config`` function and the
JSON its ``save_config_file`` writes), ``bridge`` (Megatron-Bridge recipe overrides). The
``autopar`` format is autopar's own runnable torchrun folder (``autopar.exports.folder``).

``export_formats(plan, folder, formats)`` writes them: one format into ``folder``, several (or
``all``) each into ``folder/<format>/``. Every target's ``README.md`` lists what maps exactly,
what only approximately and what has no equivalent; a plan a target cannot express is refused
(``AutoparError``) before anything is written.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from importlib import import_module
from pathlib import Path

from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.exports.mapping import Export, Fit, Row, readme

TARGETS: dict[str, str] = {
    "megatron": "autopar.exports.megatron",
    "deepspeed": "autopar.exports.deepspeed",
    "torchtitan": "autopar.exports.torchtitan",
    "bridge": "autopar.exports.bridge",
}
"""Format name -> the module whose ``export(plan)`` makes it."""
FORMATS: tuple[str, ...] = ("autopar", *TARGETS)
"""Every ``--format``; ``all`` names them together."""

__all__ = ["FORMATS", "TARGETS", "Export", "Fit", "Row", "export_formats", "export_target",
           "formats_of"]


def formats_of(text: str | Sequence[str]) -> tuple[str, ...]:
    """The formats a ``--format`` value names (``all``, one name, or a comma-separated list)."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text)
             if n.strip()]
    if names == ["all"]:
        return FORMATS
    bad = [n for n in names if n not in FORMATS]
    if bad or not names:
        raise AutoparError(f"unknown export format {', '.join(bad) or repr(text)}",
                           where="--format",
                           fix=f"use one of {', '.join(FORMATS)}, a comma-separated list of "
                               "them, or all")
    return tuple(dict.fromkeys(names))


def export_target(plan: Plan, name: str, *, allow_approximate: bool = False) -> Export:
    """The ``Export`` of ``plan`` for the target ``name`` (a key of ``TARGETS``), in memory.
    A model whose architecture the target's switches do not express is refused unless
    ``allow_approximate`` (its README then says what is not carried)."""
    return import_module(TARGETS[name]).export(plan, allow_approximate=allow_approximate)


def export_formats(plan: Plan, folder: str | os.PathLike[str],
                   formats: str | Sequence[str] = "autopar", model: ModelSpec | None = None,
                   *, overwrite: bool = False, allow_approximate: bool = False
                   ) -> dict[str, Path]:
    """Write ``plan`` in each of ``formats`` (see ``formats_of``) and return format -> the
    folder written. One format goes into ``folder`` itself, several each into
    ``folder/<format>``. Every target is built first, so a plan one of them refuses writes
    nothing; the folder must be empty unless ``overwrite``."""
    names = formats_of(formats)
    built = {n: _built(plan, n, several=len(names) > 1, allow_approximate=allow_approximate)
             for n in names if n in TARGETS}
    if "autopar" in names:
        from autopar.passes.mesh import executable_spec

        executable_spec(plan, model)  # what export_plan checks, before anything is written
    from autopar.exports.folder import check_folder, export_plan

    out = Path(folder)
    check_folder(out, overwrite)  # the autopar folder's own rule
    single = len(names) == 1
    written: dict[str, Path] = {}
    for name in names:
        target = out if single else out / name
        if name == "autopar":
            written[name] = export_plan(plan, target, model, overwrite=True)
        else:
            written[name] = _write(plan, built[name], target)
    return written


def _built(plan: Plan, name: str, several: bool, allow_approximate: bool = False) -> Export:
    try:
        return export_target(plan, name, allow_approximate=allow_approximate)
    except AutoparError as err:
        if not several:
            raise
        raise AutoparError(f"the {name} export: {err.what}", where=err.where,
                           fix=f"{err.fix.rstrip('.')}; or leave {name} out of --format"
                           ) from None


def _write(plan: Plan, export: Export, folder: Path) -> Path:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in {**export.files, "README.md": readme(plan, export)}.items():
            path = folder / name
            path.write_text(text, encoding="utf-8")
            if name in export.executable:
                path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    except OSError as err:
        raise AutoparError(f"cannot write the export folder {folder}: {err.strerror} "
                           f"({err.filename})", where="the export folder",
                           fix="pass a folder you can create and write to") from None
    return folder
