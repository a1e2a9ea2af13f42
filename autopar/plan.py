"""``Plan``: what the search decided, what it predicts, and what came second.

A frozen dataclass that validates in ``__post_init__``, round-trips to JSON byte for byte, prints
itself as a table (``report``) and explains itself against its runner-ups (``explain``). It
imports nothing of the search or the passes, so the passes can depend on it.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table

from autopar.costmodel.errors import AutoparError
from autopar.costmodel.estimate import Estimate
from autopar.costmodel.specs import ParallelConfig, TrainSpec
from autopar.model_spec import ModelSpec

GIB = 2**30
FORMAT_VERSION = 2
"""Version 2 records ``model_spec``; version 1 files (without it) still load."""
_REQUIRED = ("model", "cluster", "nodes", "gpus_per_node", "train", "config", "estimate",
             "stage_blocks")
_PLAN_FIX = "pass a plan written by `autopar plan --json F` or Plan.to_json()"


@dataclass(frozen=True)
class SolverInfo:
    """How the search ended."""

    status: str
    """``optimal`` (proven within the search space), ``feasible`` (a time limit was hit)."""
    gap: float
    """Relative optimality gap of the inner solves when a time limit was hit (0 otherwise)."""
    candidates: int
    """Outer candidates (mesh x schedule x micro-batching x ...) priced."""
    pruned: int
    """Candidates discarded by pruning rules before pricing."""
    wall_s: float = 0.0
    """Search wall time; not part of the JSON (it would break byte-identical output)."""


@dataclass(frozen=True)
class Plan:
    """A parallel training plan for one model on one cluster."""

    model: str
    """Model name (zoo preset or class name)."""
    cluster: str
    """Cluster name."""
    nodes: int
    gpus_per_node: int
    train: TrainSpec
    config: ParallelConfig
    """The decisions: mesh, ZeRO, micro-batching, schedule, checkpointing, offload, fusions."""
    estimate: Estimate
    """Predicted step time and memory."""
    stage_blocks: tuple[int, ...]
    """Blocks per pipeline stage, first stage first (it also holds the embedding, the last the
    head)."""
    block_strategies: tuple[tuple[str, str], ...] = ()
    """(op, strategy) for the ops of one block, tied across the repeated blocks."""
    module_strategies: tuple[tuple[str, str], ...] = ()
    """(module, style) that the tensor-parallel pass applies, folded from the per-op strategies
    (see ``autopar.module_strategies``): ``layers.*.attn.q_proj`` -> ``column``..."""
    ops_without_rules: tuple[str, ...] = ()
    """Ops the strategy registry had no rule for: run replicated."""
    model_spec: ModelSpec | None = None
    """How to build the model again (``autopar.model_spec``): what ``verify --plan`` and
    ``export`` rebuild; ``None`` when the planner was given a model it cannot describe (then
    they need the model named)."""
    alternatives: tuple[Plan, ...] = ()
    """Runner-up plans, best first."""
    solver: SolverInfo | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(f"a plan needs nodes >= 1 and gpus_per_node >= 1, got "
                             f"{self.nodes} x {self.gpus_per_node}")
        if self.config.world_size != self.nodes * self.gpus_per_node:
            raise ValueError(f"config covers {self.config.world_size} GPUs, the cluster has "
                             f"{self.nodes * self.gpus_per_node}")
        if len(self.stage_blocks) != self.config.pp:
            raise ValueError(f"{len(self.stage_blocks)} stage sizes for pp={self.config.pp}")
        if any(b < 1 for b in self.stage_blocks):
            raise ValueError(f"every pipeline stage needs a block: {self.stage_blocks}")

    # ----- JSON -----
    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "format": FORMAT_VERSION,
            "model": self.model, "cluster": self.cluster, "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node, "train": self.train.to_dict(),
            "config": self.config.to_dict(), "estimate": self.estimate.to_dict(),
            "stage_blocks": list(self.stage_blocks),
            "block_strategies": [list(s) for s in self.block_strategies],
            "module_strategies": [list(s) for s in self.module_strategies],
            "ops_without_rules": list(self.ops_without_rules),
            "alternatives": [a.to_dict() for a in self.alternatives],
        }
        if self.model_spec is not None:
            out["model_spec"] = self.model_spec.to_dict()
        if self.solver is not None:
            out["solver"] = {"status": self.solver.status, "gap": self.solver.gap,
                             "candidates": self.solver.candidates, "pruned": self.solver.pruned}
        return out

    def to_json(self) -> str:
        """Deterministic JSON: identical inputs give byte-identical text."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=1) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        """Inverse of ``to_dict``; ``AutoparError`` naming what is missing or wrong."""
        if not isinstance(d, dict):
            raise AutoparError(f"a plan is a JSON object, not {type(d).__name__}",
                               where="the plan", fix=_PLAN_FIX)
        missing = [k for k in _REQUIRED if k not in d]
        if missing:
            raise AutoparError(f"the plan has no {', '.join(missing)}", where="the plan",
                               fix=_PLAN_FIX)
        if d.get("format", 1) > FORMAT_VERSION:
            raise AutoparError(f"the plan is format {d['format']}, this autopar reads up to "
                               f"{FORMAT_VERSION}", where="the plan's format",
                               fix="upgrade autopar, or re-plan with this version")
        try:
            return cls._from_dict(d)
        except AutoparError:
            raise
        except (ValueError, KeyError, TypeError) as err:
            raise AutoparError(f"the plan does not load ({type(err).__name__}: {err})",
                               where="the plan", fix=_PLAN_FIX) from None

    @classmethod
    def _from_dict(cls, d: dict) -> Plan:
        solver = d.get("solver")
        spec = d.get("model_spec")
        return cls(
            model=d["model"], cluster=d["cluster"], nodes=d["nodes"],
            gpus_per_node=d["gpus_per_node"], train=TrainSpec(**d["train"]),
            config=ParallelConfig.from_dict(d["config"]),
            estimate=Estimate.from_dict(d["estimate"]),
            stage_blocks=tuple(d["stage_blocks"]),
            block_strategies=tuple(tuple(s) for s in d.get("block_strategies", ())),
            module_strategies=tuple(tuple(s) for s in d.get("module_strategies", ())),
            ops_without_rules=tuple(d.get("ops_without_rules", ())),
            alternatives=tuple(cls.from_dict(a) for a in d.get("alternatives", ())),
            solver=SolverInfo(**solver) if solver else None,
            model_spec=ModelSpec.from_dict(spec, "the plan's model_spec") if spec else None,
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """The plan in JSON ``text`` (``to_json``'s); ``from_file`` reads a file."""
        if not isinstance(text, (str, bytes, bytearray)):
            raise AutoparError(f"Plan.from_json takes JSON text, not a {type(text).__name__}",
                               where="Plan.from_json", fix="pass Plan.to_json()'s text, or "
                               "read a file with Plan.from_file(path)")
        try:
            data = json.loads(text)
        except ValueError as err:
            looks_like_path = isinstance(text, str) and "\n" not in text and (
                text.endswith(".json") or Path(text).exists())
            raise AutoparError(
                f"Plan.from_json was given {text[:60]!r}, which is "
                + ("a file path, not JSON text" if looks_like_path else f"not JSON ({err})"),
                where="Plan.from_json",
                fix="read a plan file with Plan.from_file(path)" if looks_like_path
                else _PLAN_FIX) from None
        return cls.from_dict(data)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Plan:
        """The plan in the JSON file ``path``; a relative factory path of its model spec is
        relative to the file's folder (``ModelSpec.resolved``)."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as err:
            raise AutoparError(f"cannot read the plan file {p}: {err.strerror}", where=str(p),
                               fix=_PLAN_FIX) from None
        try:
            plan = cls.from_json(text)
        except AutoparError as err:
            raise AutoparError(f"{p} is not a plan file: {err.what}", where=str(p),
                               fix=err.fix) from None
        if plan.model_spec is not None:
            plan = replace(plan, model_spec=plan.model_spec.resolved(p.resolve().parent))
        return plan

    # ----- for people -----
    def summary(self) -> str:
        """The configuration on one line (``Estimate.summary``)."""
        return self.estimate.summary()

    def report(self, width: int = 110) -> str:
        """The plan as tables under its title (on one line at ``width`` when it fits, the
        configuration summary never broken): configuration, memory per stage, time, notes (the
        ops without a strategy rule among them), what runs, runner-ups."""
        from autopar.report import estimate_tables, titled_table

        buf = io.StringIO()
        console = Console(file=buf, width=width, force_terminal=False, color_system=None)
        title = f"{self.model} on {self.cluster} ({self.nodes} x {self.gpus_per_node} GPUs)"
        console.print(estimate_tables(self.estimate, None, title=title), crop=False)
        extra = [self._execution_table()]
        if self.alternatives:
            t = titled_table("Runner-up plans")
            for col in ("#", "plan", "step time", "vs best", "peak GiB", "fits"):
                t.add_column(col, justify="right" if col != "plan" else "left")
            for i, alt in enumerate(self.alternatives, 1):
                t.add_row(str(i), alt.summary(), f"{alt.estimate.step_time_s:.3f} s",
                          f"{alt.estimate.step_time_s / self.estimate.step_time_s - 1:+.1%}",
                          f"{alt.estimate.peak_memory_bytes / GIB:.1f}",
                          "yes" if alt.estimate.fits else "no")
            extra.append(t)
        if self.solver is not None:
            extra.append(f"search: {self.solver.candidates} candidates priced, "
                         f"{self.solver.pruned} pruned, {self.solver.status}"
                         + (f" (gap {self.solver.gap:.2%})" if self.solver.gap else ""))
        if extra:
            console.print(Group(*extra))
        return buf.getvalue()

    def _execution_table(self) -> Table:
        from autopar.execution import execution_lines
        from autopar.report import titled_table

        t = titled_table("What runs (autopar.parallelize on torch.distributed)",
                         show_header=False)
        t.add_column(style="bold")
        t.add_column()
        for aspect, text in execution_lines(self.config, self.train, sum(self.stage_blocks)):
            t.add_row(aspect, text)
        split = [(m, s) for m, s in self.module_strategies if s != "replicated"]
        if self.config.tp > 1 and split:
            t.add_row("module styles", ", ".join(f"{m}: {s}" for m, s in split))
        return t

    def explain(self) -> str:
        """Why this plan and not each runner-up: the deltas that decide it."""
        lines = [f"Chosen: {self.summary()} -- {self.estimate.step_time_s:.3f} s per step, "
                 f"{self.estimate.peak_memory_bytes / GIB:.1f} GiB peak of "
                 f"{self.estimate.usable_memory_bytes / GIB:.1f} GiB usable."]
        if not self.alternatives:
            lines.append("No runner-up: every other candidate was infeasible or pruned.")
        for i, alt in enumerate(self.alternatives, 1):
            lines.append(f"#{i} {alt.summary()}: " + _why_better(self.estimate, alt.estimate))
        return "\n".join(lines)

    def spec_for(self, given: ModelSpec | None = None) -> ModelSpec:
        """The model to run this plan with: the one it records, or ``given`` for a plan
        recording none (an older plan file, or a model the planner could not describe); a zoo
        preset named by ``model`` as the last resort. ``AutoparError`` when ``given`` is
        another model than the recorded one (``ModelSpec.same_model``)."""
        recorded = self.model_spec
        if recorded is not None and given is not None and not given.same_model(recorded):
            raise AutoparError(
                f"the plan was made for {recorded.label} ({_describe(recorded)}); the model "
                f"given is {given.label} ({_describe(given)})", where="--model / model",
                fix="leave the model out (the plan records it), or re-plan the model you mean")
        spec = given or recorded
        if spec is not None:
            return spec
        from autopar import models

        if self.model not in models.names():
            raise AutoparError(
                f"the plan records no model spec and its model {self.model!r} is not a zoo "
                "preset, so autopar does not know how to build it", where="plan.model",
                fix="re-plan with this version (plan files record their model now), or name "
                    "the model: --model NAME [--model-arg KEY=VALUE ...] (Python: "
                    "model=ModelSpec(...))")
        return ModelSpec(self.model)

    def export(self, folder: str | os.PathLike[str], model: ModelSpec | None = None, *,
               overwrite: bool = False) -> Path:
        """Write a runnable training folder for this plan (``plan.json``, ``model.json``,
        ``train.py``, ``launch.sh``, ``README.md``; ``autopar.passes.export``). ``model``
        defaults to the recorded one (``spec_for``)."""
        from autopar.passes.export import export_plan  # the passes import this module

        return export_plan(self, folder, model, overwrite=overwrite)


def _describe(spec: ModelSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)[:200]


def _why_better(best: Estimate, alt: Estimate) -> str:
    """The breakdown deltas that make ``alt`` slower (or the memory that makes it not fit)."""
    dt = alt.step_time_s - best.step_time_s
    keys = sorted(set(best.time_breakdown) | set(alt.time_breakdown))
    deltas = sorted(((alt.time_breakdown.get(k, 0.0) - best.time_breakdown.get(k, 0.0), k)
                     for k in keys), reverse=True)
    decisive = [f"{k} {d:+.3f} s" for d, k in deltas if abs(d) > 0.05 * abs(dt) and d > 0][:3]
    gains = [f"{k} {d:+.3f} s" for d, k in reversed(deltas) if d < 0][:2]
    text = f"{dt:+.3f} s per step ({dt / best.step_time_s:+.1%})"
    if decisive:
        text += "; it loses on " + ", ".join(decisive)
    if gains:
        text += "; it gains on " + ", ".join(gains)
    if not alt.fits:
        text += f"; and it does not fit ({alt.peak_memory_bytes / GIB:.1f} GiB)"
    return text + "."


def diff(a: Plan, b: Plan) -> str:
    """What changed from plan ``a`` to plan ``b``: decisions, then predictions."""
    lines = [f"a: {a.summary()}", f"b: {b.summary()}"]
    ca, cb = a.config.to_dict(), b.config.to_dict()
    for key in ca:
        if ca[key] != cb[key]:
            lines.append(f"  {key}: {ca[key]} -> {cb[key]}")
    if a.stage_blocks != b.stage_blocks:
        lines.append(f"  stage_blocks: {list(a.stage_blocks)} -> {list(b.stage_blocks)}")
    sa, sb = dict(a.block_strategies), dict(b.block_strategies)
    for op in sorted(set(sa) | set(sb)):
        if sa.get(op) != sb.get(op):
            lines.append(f"  strategy {op}: {sa.get(op)} -> {sb.get(op)}")
    ea, eb = a.estimate, b.estimate
    lines.append(f"  step time: {ea.step_time_s:.3f} s -> {eb.step_time_s:.3f} s "
                 f"({eb.step_time_s / ea.step_time_s - 1:+.1%})")
    lines.append(f"  peak memory: {ea.peak_memory_bytes / GIB:.2f} GiB -> "
                 f"{eb.peak_memory_bytes / GIB:.2f} GiB")
    for k in sorted(set(ea.time_breakdown) | set(eb.time_breakdown)):
        x, y = ea.time_breakdown.get(k, 0.0), eb.time_breakdown.get(k, 0.0)
        if abs(y - x) > 1e-3 * max(ea.step_time_s, 1e-12):
            lines.append(f"  {k}: {x:.3f} s -> {y:.3f} s")
    return "\n".join(lines)
