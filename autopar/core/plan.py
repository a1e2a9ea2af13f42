"""``Plan``: what the search decided, what it predicts, and what came second.

A frozen dataclass that validates in ``__post_init__`` and round-trips to JSON byte for byte. It
is data: its ``report``/``explain`` live in ``autopar.report.text`` and its ``export`` in
``autopar.exports.folder`` (``VIEWS``), so every layer can depend on it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from autopar.core.errors import AutoparError
from autopar.core.estimate import Estimate
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.core.model_spec import ModelSpec

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
    (see ``autopar.analysis.module_strategies``): ``layers.*.attn.q_proj`` -> ``column``..."""
    ops_without_rules: tuple[str, ...] = ()
    """Ops the strategy registry had no rule for: run replicated."""
    model_spec: ModelSpec | None = None
    """How to build the model again (``autopar.core.model_spec``): what ``verify --plan`` and
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
        """The configuration on one line (``Estimate.summary``), the FP8 recipe of an fp8
        plan (``fp8:tensorwise``) and gradients reduced in a low dtype (``grads:bf16``)."""
        fp8 = (f" fp8:{self.train.fp8_recipe.value}" if self.train.precision.value == "fp8"
               else "")
        grads = (f" grads:{self.train.grad_dtype.value}"
                 if "grad_dtype" in self.train.to_dict() else "")
        return self.estimate.summary() + fp8 + grads

    def report(self, width: int = 110) -> str:
        """The plan as tables under its title: configuration, memory per stage, time, notes,
        what runs, runner-ups (``autopar.report.text.plan_report``)."""
        return _view("report")(self, width=width)

    def explain(self) -> str:
        """Why this plan and not each runner-up: the deltas that decide it
        (``autopar.report.text.plan_explain``)."""
        return _view("explain")(self)

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
        spec = ModelSpec.zoo(self.model)
        if spec is None:
            raise AutoparError(
                f"the plan records no model spec and its model {self.model!r} is not a zoo "
                "preset, so autopar does not know how to build it", where="plan.model",
                fix="re-plan with this version (plan files record their model now), or name "
                    "the model: --model NAME [--model-arg KEY=VALUE ...] (Python: "
                    "model=ModelSpec(...))")
        return spec

    def export(self, folder: str | os.PathLike[str], model: ModelSpec | None = None, *,
               overwrite: bool = False) -> Path:
        """Write a runnable training folder for this plan (``plan.json``, ``model.json``,
        ``train.py``, ``launch.sh``, ``README.md``; ``autopar.exports.folder.export_plan``).
        ``model`` defaults to the recorded one (``spec_for``)."""
        return _view("export")(self, folder, model, overwrite=overwrite)


def _describe(spec: ModelSpec) -> str:
    return json.dumps(spec.to_dict(), sort_keys=True)[:200]


VIEWS: dict[str, Callable[..., Any]] = {}
"""What the plan's ``report``, ``explain`` and ``export`` call. The plan is data: it imports
neither the report nor the passes; the package's ``__init__`` (the top layer) installs them."""


def _view(name: str) -> Callable[..., Any]:
    return VIEWS[name]  # the package is imported before any of its modules, so they are set
