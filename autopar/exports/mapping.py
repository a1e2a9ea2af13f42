"""What an export is: files for another framework, and the table of how each plan field maps.

Every exporter (``megatron``, ``deepspeed``, ``torchtitan``, ``bridge``) turns one ``Plan`` into an
``Export``: the files the target reads, and one ``Row`` per plan field saying what it became and
how well (``Fit``). The folder's ``README.md`` is that table (``readme``), so nothing the plan
decided is dropped without a word. A plan the target cannot express is refused with an
``AutoparError`` (``refuse``) before any file is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from autopar.core.errors import AutoparError
from autopar.core.plan import Plan

GIB = 2**30


class Fit(StrEnum):
    """How a plan field maps to the target."""

    EXACT = "exact"
    """The target runs what the plan decided."""
    CLOSE = "close"
    """The target runs something near it; the note says what differs and which way the time and
    memory move."""
    NONE = "no equivalent"
    """The target's configuration has no place for it; the note says what to do instead."""


@dataclass(frozen=True)
class Row:
    """One plan field in the target's terms."""

    field: str
    """The plan field: ``config.tp``, ``train.precision``, ``model.num_layers``..."""
    value: str
    """Its value in the plan."""
    target: str
    """What it became in the target (a flag, a key, a line), or empty."""
    fit: Fit
    note: str = ""


@dataclass(frozen=True)
class Export:
    """One target's files for a plan and the mapping that made them."""

    target: str
    """The framework, as people name it (``Megatron-LM``)."""
    files: Mapping[str, str]
    """File name -> text."""
    rows: tuple[Row, ...]
    source: str
    """Where the target's names were read: repository, path and commit, or package version."""
    usage: str
    """How to use the files (Markdown)."""
    executable: frozenset[str] = field(default_factory=frozenset)
    """Files to mark executable."""

    def mismatches(self) -> tuple[Row, ...]:
        """The rows that do not map exactly."""
        return tuple(r for r in self.rows if r.fit is not Fit.EXACT)


def refuse(what: str, where: str, fix: str) -> AutoparError:
    """The error of a plan a target cannot express (raised by the exporter)."""
    return AutoparError(what, where=where, fix=fix)


def plan_rows(plan: Plan, handled: Mapping[str, Row]) -> tuple[Row, ...]:
    """Every plan field, in the plan's order: the exporter's row for it, or a row saying the
    target has no place for it (so no field is left out of the table)."""
    values = plan_values(plan)
    handled = {**_recipe_row(plan, handled), **_grad_dtype_row(plan), **handled}
    rows = [handled.get(name) or Row(name, value, "", Fit.NONE,
                                     "not carried to this target")
            for name, value in values.items()]
    rows += [r for name, r in handled.items() if name not in values]
    return tuple(rows)


def _recipe_row(plan: Plan, handled: Mapping[str, Row]) -> dict[str, Row]:
    """``train.fp8_recipe``'s row: carried with the precision (its row says how) under fp8,
    nothing to carry under any other precision."""
    recipe = plan.train.fp8_recipe.value
    if plan.train.precision.value != "fp8":
        return {"train.fp8_recipe": Row("train.fp8_recipe", f"{recipe} (unused)", "", Fit.EXACT,
                                        "read only under precision fp8")}
    precision = handled.get("train.precision")
    if precision is None:
        return {}
    return {"train.fp8_recipe": Row("train.fp8_recipe", recipe, precision.target, precision.fit,
                                    "with train.precision: see its row")}


def _grad_dtype_row(plan: Plan) -> dict[str, Row]:
    """``train.grad_dtype``'s row where the precision does not read it (``bf16-pure``,
    ``fp32``); an exporter's own row wins."""
    if plan.train.precision.value in ("bf16", "fp8", "fp16"):
        return {}
    return {"train.grad_dtype": Row("train.grad_dtype", f"{plan.train.grad_dtype} (unused)",
                                    "", Fit.EXACT, "read only under bf16, fp8 and fp16: "
                                    "see train.precision's row")}


def plan_values(plan: Plan) -> dict[str, str]:
    """The plan's fields as text, by their export names (``config.tp``, ``stage_blocks``,
    ``train.seq_len``...): ``autopar.report.text.config_text``'s words."""
    from autopar.report.text import config_text

    out = {"nodes x gpus_per_node": f"{plan.nodes} x {plan.gpus_per_node}"}
    for name, value in config_text(plan).items():
        out[name if name == "stage_blocks" else f"config.{name}"] = value
    for name, value in plan.train.to_dict().items():
        out[f"train.{name}"] = str(value)
    out.setdefault("train.fp8_recipe", f"{plan.train.fp8_recipe.value} (unused)")
    out.setdefault("train.grad_dtype", plan.train.grad_dtype.value)
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def readme(plan: Plan, export: Export) -> str:
    """The export folder's ``README.md``: the plan, how to use the files, what differs first,
    then the whole mapping table."""
    est = plan.estimate
    lines = [f"# {plan.model}: {plan.summary()} for {export.target}", "",
             f"autopar's plan for {plan.nodes} node(s) x {plan.gpus_per_node} GPUs of "
             f"`{plan.cluster}`, written as {export.target} configuration. autopar predicts "
             f"{est.step_time_s:.4g} s per step, {est.tokens_per_s:,.0f} tokens/s, MFU "
             f"{est.mfu:.1%}, {est.peak_memory_bytes / GIB:.2f} GiB peak on the most loaded GPU "
             f"-- for autopar's own program; {export.target} runs its own kernels and "
             "schedules, so measure.", "",
             f"Names read from: {export.source}.", "", "## Use", "", export.usage.strip(), ""]
    off = export.mismatches()
    lines += ["## What does not map exactly", ""]
    if off:
        lines += [f"- **{r.field} = {r.value}** ({r.fit}): {r.note or 'see the table'}"
                  for r in off]
    else:
        lines.append("Nothing: every plan field maps exactly.")
    lines += ["", "## Every plan field", "", "| plan field | value | becomes | fit | note |",
              "|---|---|---|---|---|"]
    lines += [f"| {_cell(r.field)} | {_cell(r.value)} | {_cell(r.target) or '-'} | {r.fit} | "
              f"{_cell(r.note)} |" for r in export.rows]
    return "\n".join(lines) + "\n"


Exporter = Callable[[Plan], Export]
