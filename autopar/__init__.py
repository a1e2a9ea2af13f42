"""autopar: automatic parallelism planner and compiler for training large models with PyTorch.

The public names load on first use (PEP 562): ``import autopar.costmodel`` or
``import autopar.core`` runs this file first, and must not drag in the search, the passes or the
tracer. The layers and who may import whom are in ``docs/architecture.md``.
"""

import sys
from importlib import import_module
from types import ModuleType

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
    "GraphIR": "autopar.graph",
    "trace": "autopar.tracing",
    "estimate": "autopar.api",
    "optimize": "autopar.api",
    "plan_for": "autopar.api",
    "workload_of": "autopar.api",
    "diff": "autopar.report",
    "compare": "autopar.report",
    # the execution API imports torch.distributed's pipelining and DTensor machinery and the
    # Triton kernels, about 0.9 s that planning does not need
    "ParallelProgram": "autopar.passes",
    "dry_run": "autopar.dry_run",
    "DryRun": "autopar.dry_run",
    "check_plans": "autopar.plan_check",
    "PlanCheck": "autopar.plan_check",
    "device_mesh": "autopar.passes",
    "parallelize": "autopar.passes",
    "profile": "autopar.profiling",
    "Profile": "autopar.costmodel.profile",
    "calibrate": "autopar.calibration",
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
    """The package, keeping a public name that is also the name of the module defining it
    (``dry_run`` in ``autopar.dry_run``): importing that module binds it on the package, which
    would hide the function from ``autopar.dry_run(...)`` once anything imported the module
    directly (``from autopar.dry_run import DryRun``). The function is bound instead;
    ``sys.modules`` keeps the module for ``from autopar.dry_run import ...``."""

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, ModuleType) and _OWNERS.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def _report(plan: object, width: int = 110) -> str:
    return import_module("autopar.report").plan_report(plan, width)


def _explain(plan: object) -> str:
    return import_module("autopar.report").plan_explain(plan)


def _export(plan: object, *args: object, **kwargs: object) -> object:
    return import_module("autopar.passes.export").export_plan(plan, *args, **kwargs)


# The plan is data and imports nothing above the core; its report, explanation and export are
# owned by the report module and the passes, and bound here, at the top.
_plan.VIEWS.update(report=_report, explain=_explain, export=_export)
