"""``check_plans(plan)``: the planner's choice and its runner-ups, each dry-run before it is kept.

The planner admits a plan by its memory model; the dry run (``autopar.dryrun.run``) runs the
emitted program of every rank role for one step on fake tensors and measures what it holds.
``check_plans`` dry-runs the chosen plan and then each runner-up, best first, and drops every
plan whose dry run does not fit -- a role's dry-run peak above the usable memory the plan was
made for (``Estimate.usable_memory_bytes``: the cluster's ``usable_hbm_bytes``, its
``memory_headroom`` taken off) -- or that the passes refuse to run (``AutoparError`` from the
dry run: a context-parallel plan, say). The first plan left is the checked plan, the others
left its runner-ups. ``autopar plan --check`` prints what it found (``autopar/cli/dryrun.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.costmodel.hardware import format_bytes
from autopar.dryrun.run import DryRun, ProgressFn, check_dry_run_call, dry_run


@dataclass(frozen=True)
class CheckedPlan:
    """One plan's dry run within ``check_plans``."""

    plan: Plan
    """The plan as the planner made it (without runner-ups of its own)."""
    index: int
    """Its place in the planner's order: 0 the chosen plan, ``i`` the runner-up ``#i``."""
    run: DryRun | None
    """Its dry run; ``None`` where the passes refused the plan (``problem`` says why)."""
    problem: str | None
    """Why it was dropped; ``None`` when it was kept."""

    @property
    def kept(self) -> bool:
        return self.problem is None

    @property
    def label(self) -> str:
        return _label(self.index)


@dataclass(frozen=True)
class PlanCheck:
    """What ``check_plans`` returns: the checked plan and every plan's dry run."""

    plan: Plan
    """The first plan whose dry run fits, with the runner-ups whose dry run fits too."""
    checked: tuple[CheckedPlan, ...]
    """Every plan dry-run, in the planner's order."""

    @property
    def kept(self) -> tuple[CheckedPlan, ...]:
        return tuple(c for c in self.checked if c.kept)

    @property
    def dropped(self) -> tuple[CheckedPlan, ...]:
        return tuple(c for c in self.checked if not c.kept)


class PlanCheckError(AutoparError):
    """No plan's dry run fits; ``checked`` holds what each dry run found."""

    def __init__(self, what: str, *, where: str = "", fix: str = "",
                 checked: tuple[CheckedPlan, ...] = ()) -> None:
        self.checked = checked
        super().__init__(what, where=where, fix=fix)


def check_plans(plan: Plan, model: ModelSpec | None = None, *,
                progress: ProgressFn | None = None, workers: int | None = None) -> PlanCheck:
    """Dry-run ``plan`` and its runner-ups (``plan.alternatives``) in order and keep those whose
    every rank role's dry-run peak fits the usable memory (see the module docstring).

    ``model`` names the model for a plan that records none (``Plan.spec_for``); ``workers`` is
    ``dry_run``'s. ``progress(done, total, what)`` counts rank roles over all the plans, as
    ``dry_run``'s counts them over one. Raises ``PlanCheckError`` (an ``AutoparError``) when no
    plan is left, and ``AutoparError`` for a model or ``workers`` no plan could run with."""
    check_dry_run_call(workers)
    spec = plan.spec_for(model)  # the runner-ups record none: they are run with the chosen's
    plans = (replace(plan, alternatives=()), *plan.alternatives)
    total = sum(p.config.pp for p in plans)
    before = 0
    checked: list[CheckedPlan] = []
    for index, candidate in enumerate(plans):
        step = _within(progress, before, total, _label(index))
        try:
            run = dry_run(candidate, spec, progress=step, workers=workers)
        except AutoparError as err:
            checked.append(CheckedPlan(candidate, index, None, f"the passes refuse it: {err.what}"))
        else:
            checked.append(CheckedPlan(candidate, index, run, _problem(run)))
        before += candidate.config.pp
    if progress is not None:
        progress(total, total, "done")
    kept = [c.plan for c in checked if c.kept]
    if not kept:
        raise _none_fits(plan, tuple(checked))
    first, rest = kept[0], tuple(kept[1:])
    # a runner-up records neither the model nor the search: the chosen plan's are its own now
    checked_plan = replace(first, alternatives=rest, model_spec=plan.model_spec,
                           solver=plan.solver)
    return PlanCheck(checked_plan, tuple(checked))


def _within(progress: ProgressFn | None, before: int, total: int, label: str
            ) -> ProgressFn | None:
    """One plan's dry-run progress as progress over every plan's roles."""
    if progress is None:
        return None

    def step(done: int, _total: int, what: str) -> None:
        progress(before + done, total, f"{label}: {what}")

    return step


def _label(index: int) -> str:
    """``chosen plan`` or ``runner-up #i``, as the plan's report numbers them."""
    return "chosen plan" if index == 0 else f"runner-up #{index}"


def _problem(run: DryRun) -> str | None:
    if run.fits:
        return None
    worst = max(run.roles, key=lambda r: r.peak_bytes)
    predicted = worst.predicted_bytes
    return (f"its dry run needs {format_bytes(int(worst.peak_bytes))} on pipeline rank "
            f"{worst.pp_rank}, over the {format_bytes(int(run.plan.estimate.usable_memory_bytes))}"
            f" usable (predicted "
            f"{'-' if predicted is None else format_bytes(int(predicted))})")


def _none_fits(plan: Plan, checked: tuple[CheckedPlan, ...]) -> PlanCheckError:
    reasons = "; ".join(f"{c.label} {c.plan.summary()}: {c.problem}" for c in checked)
    return PlanCheckError(
        f"no plan of the {len(checked)} checked fits when its program is dry-run: {reasons}",
        where=f"{plan.model} on {plan.cluster} ({plan.nodes} x {plan.gpus_per_node} GPUs)",
        fix="give the step more memory per GPU: more GPUs (--nodes), a larger "
            "--memory-headroom (the search then keeps more room for what its memory model "
            "misses), or a smaller --global-batch or --micro-batch; --keep N checks more "
            "runner-ups",
        checked=checked)
