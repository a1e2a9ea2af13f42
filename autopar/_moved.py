"""Old import paths of modules that moved into packages keep working, with a warning.

Before the packages (``docs/architecture.md``), autopar's modules sat flat in ``autopar/``:
``autopar.dry_run``, ``autopar.verify_worker``, ``autopar.report_html``, ... A user's script or a
``-m`` command line may still name one. ``MOVED`` maps each old path to its module now, and
``install`` puts a finder on ``sys.meta_path`` that answers an old path with the module itself
(one object under two names: ``monkeypatch`` and ``isinstance`` see the same thing) and warns
once with the new path. Nothing in autopar imports an old path (``tests/unit/test_layering.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

MOVED: dict[str, str] = {
    "autopar.admissibility": "autopar.analysis.admissibility",
    "autopar.graph": "autopar.analysis.graph",
    "autopar.tracing": "autopar.analysis.tracing",
    "autopar.tracing_blocks": "autopar.analysis.tracing_blocks",
    "autopar.tracing_errors": "autopar.analysis.tracing_errors",
    "autopar.workload": "autopar.analysis.workload",
    "autopar.module_strategies": "autopar.analysis.module_strategies",
    "autopar.ops": "autopar.analysis.ops",
    "autopar.training": "autopar.models.training",
    "autopar.execution": "autopar.report.execution",
    "autopar.report_charts": "autopar.report.charts",
    "autopar.report_html": "autopar.report.html",
    "autopar.dry_run": "autopar.dryrun.run",
    "autopar.memory_account": "autopar.dryrun.memory_account",
    "autopar.gpu_kernels": "autopar.dryrun.gpu_kernels",
    "autopar.plan_check": "autopar.dryrun.plan_check",
    "autopar.verify_cases": "autopar.verify.cases",
    "autopar.verify_decoders": "autopar.verify.decoders",
    "autopar.verify_dropout": "autopar.verify.dropout",
    "autopar.verify_measures": "autopar.verify.measures",
    "autopar.verify_models": "autopar.verify.models",
    "autopar.verify_reference": "autopar.verify.reference",
    "autopar.verify_worker": "autopar.verify.worker",
    "autopar.profiling": "autopar.measure.profiling",
    "autopar.profiling_worker": "autopar.measure.profiling_worker",
    "autopar.calibration": "autopar.measure.calibration",
    "autopar.validation": "autopar.measure.validation",
    "autopar.cli_args": "autopar.cli.args",
    "autopar.cli_compare": "autopar.cli.compare",
    "autopar.cli_dryrun": "autopar.cli.dryrun",
    "autopar.cli_export": "autopar.cli.export",
    "autopar.cli_profile": "autopar.cli.profile",
    "autopar.cli_verify": "autopar.cli.verify",
    "autopar.passes.export": "autopar.exports.folder",
    "autopar.passes.train_template": "autopar.exports.train_template",
}
"""Old module path -> where it lives now (a moved package's submodules follow it:
``autopar.ops.registry`` is ``autopar.analysis.ops.registry``). ``autopar.verify``,
``autopar.report`` and ``autopar.cli`` kept their names as packages that export what the
modules did."""


def new_name(name: str) -> str | None:
    """The module an old path ``name`` names now, or None where it did not move."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old):]
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new}; import it from there",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when ``create_module`` imported it under its own name."""


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None):
        new = new_name(name)
        return None if new is None else importlib.util.spec_from_loader(name, _Alias(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
