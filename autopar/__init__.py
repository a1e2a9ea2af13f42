"""autopar: automatic parallelism planner and compiler for training large models with PyTorch.

The public names load on first use (PEP 562): ``import autopar.costmodel`` or
``import autopar.core`` runs this file first, and must not drag in the search, the passes or the
tracer. The layers and who may import whom are in ``docs/architecture.md``.
"""

import sys
from importlib import import_module
from types import ModuleType

from autopar import _moved
from autopar.core import model_spec as _model_spec
from autopar.core import plan as _plan

__version__ = "0.1.0"

_OWNERS = {
    "AutoparError": "autopar.core.errors",
    "Checkpoint": "autopar.core.specs",
    "ParallelConfig": "autopar.core.specs",
    "Precision": "autopar.core.specs",
    "Schedule": "autopar.core.specs",
    "TrainSpec": "autopar.core.specs",
    "Estimate": "autopar.core.estimate",
    "Plan": "autopar.core.plan",
    "ClusterSpec": "autopar.costmodel.cluster",
    "GraphIR": "autopar.analysis.graph",
    "trace": "autopar.analysis.tracing",
    "estimate": "autopar.api",
    "optimize": "autopar.api",
    "plan_for": "autopar.api",
    "workload_of": "autopar.api",
    "diff": "autopar.report.text",
    "compare": "autopar.report.text",
    # the execution API imports torch.distributed's pipelining and DTensor machinery and the
    # Triton kernels, about 0.9 s that planning does not need
    "ParallelProgram": "autopar.passes",
    "dry_run": "autopar.dryrun.run",
    "DryRun": "autopar.dryrun.run",
    "check_plans": "autopar.dryrun.plan_check",
    "PlanCheck": "autopar.dryrun.plan_check",
    "device_mesh": "autopar.passes",
    "parallelize": "autopar.passes",
    "profile": "autopar.measure.profiling",
    "Profile": "autopar.costmodel.profile",
    "calibrate": "autopar.measure.calibration",
}
"""Where each public name is defined."""
__all__ = sorted([*_OWNERS, "models"])


def __getattr__(name: str) -> object:
    if name == "models":
        return import_module("autopar.models")
    if name in _OWNERS:
        value = getattr(import_module(_OWNERS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autopar' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(ModuleType):
    """The package, keeping its public functions: a module imported by an old path
    (``import autopar.dry_run``, ``autopar/_moved.py``) is bound on its parent by the import
    system, which would hide the function ``autopar.dry_run``; the function is kept."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, ModuleType) and name in _OWNERS:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
_moved.install()


def _report(plan: object, width: int = 110) -> str:
    return import_module("autopar.report.text").plan_report(plan, width)


def _explain(plan: object) -> str:
    return import_module("autopar.report.text").plan_explain(plan)


def _export(plan: object, *args: object, **kwargs: object) -> object:
    return import_module("autopar.exports.folder").export_plan(plan, *args, **kwargs)


# The plan is data and imports nothing above the core; its report, explanation and export are
# owned by the report module and the passes, and bound here, at the top.
_plan.VIEWS.update(report=_report, explain=_explain, export=_export)


def _spec_behaviour(name: str):
    def call(*args: object, **kwargs: object) -> object:
        return getattr(import_module("autopar.models.spec"), name)(*args, **kwargs)
    return call


# A model spec is data in the core; what it does with the models (parse a --model argument,
# build the model) is owned by the models layer and bound here, at the top, the same way.
_model_spec.BEHAVIOUR.update({name: _spec_behaviour(name) for name in
                              ("parse", "of", "zoo", "same_model", "build", "model_fix")})
