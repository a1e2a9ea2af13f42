"""``autopar calibrate``: fit a few named ``Efficiency`` constants to measured training steps.

A measured run is one real training step's time (and, if known, its peak memory) under one
configuration. Two inputs are read:

* a **runs file**::

    {"runs": [{"name": "gpt-dp4", "model": "gpt-tiny" | {"name": "gpt", "overrides": {...}},
               "cluster": "hgx-h100-80g" | {cluster file layout} | "profile",
               "nodes": 1,
               "train": {"global_batch": 8, "seq_len": 128, "precision": "fp32",
                         "optimizer": "adamw"},
               "config": {ParallelConfig.to_dict() fields},
               "step_s": 0.84, "peak_bytes": 123456789, "source": "train.py log, median of
               steps 3-10"}]}

  ``"cluster": "profile"`` (with ``--profile``) prices the run on the profiled machine's own
  cluster; a train.py log or a verify run gives ``step_s`` as the median of its steps.
* the **published runs** of ``tests/data/published_runs.json`` (Megatron-LM Table 1): each
  row's step time is its FLOPs over its achieved rate, its configuration re-created as
  ``autopar.measure.validation`` does; or of ``tests/data/korthikanti_table5.json`` (Korthikanti et
  al. Tables 3 and 5): each row is two runs, its iteration time under full recomputation and
  under sequence parallelism with selective recomputation (``validation.check_recompute_row``).

The fit minimises the mean squared log error of the step time over the runs, one constant at a
time (golden-section search in log space inside ``BOUNDS``), for ``ROUNDS`` rounds (one when
one constant is fitted): few
constants, bounded, no solver library. Peak memory does not depend on ``Efficiency``; it is
shown in the error table, not fitted.

A constant that ends at a bound of ``BOUNDS`` has not found the measurement: no value in the
range explains it (a step time in the wrong unit, a run priced under another configuration
than it ran, a term the constant does not scale). Such a fit is refused with the error it
leaves, rather than written: a calibration stuck at 0.05 would price every later plan wrong.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from autopar.core.errors import AutoparError, read_json
from autopar.core.estimate import Estimate
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.efficiency import (DEFAULT_EFFICIENCY, FITTABLE, Efficiency,
                                          calibration_dict)
from autopar.costmodel.profile import Profile

if TYPE_CHECKING:
    from autopar.measure.validation import RecomputeCheck

BOUNDS = (0.05, 1.0)
"""Every fitted constant is a fraction of a peak: searched in [0.05, 1]."""
ROUNDS = 2
GOLDEN_STEPS = 12
"""Golden-section steps per constant and round: the bracket shrinks by 0.618^12 (~3e-3 of the
log range, a factor of ~1.01)."""
DEFAULT_FIT = ("matmul_mainloop",)
"""What ``autopar calibrate`` fits unless told: the constant every GEMM's price scales by."""


@dataclass(frozen=True)
class MeasuredRun:
    """One measured step and how to price it under a given ``Efficiency``."""

    name: str
    step_s: float
    peak_bytes: float | None
    predict: Callable[[Efficiency], Estimate]


@dataclass(frozen=True)
class ErrorRow:
    name: str
    measured_s: float
    predicted_s: float
    measured_peak_bytes: float | None
    predicted_peak_bytes: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0


@dataclass(frozen=True)
class Calibration:
    efficiency: Efficiency
    fitted: dict[str, float]
    before: tuple[ErrorRow, ...]
    after: tuple[ErrorRow, ...]
    source: str

    def to_dict(self) -> dict[str, object]:
        d = calibration_dict(self.fitted, self.source,
                             datetime.datetime.now(datetime.timezone.utc).isoformat(
                                 timespec="seconds"))
        d["errors_before"] = [r.error for r in self.before]
        d["errors_after"] = [r.error for r in self.after]
        return d


def errors(runs: Sequence[MeasuredRun], eff: Efficiency) -> tuple[ErrorRow, ...]:
    rows = []
    for r in runs:
        est = r.predict(eff)
        rows.append(ErrorRow(r.name, r.step_s, est.step_time_s, r.peak_bytes,
                             est.peak_memory_bytes))
    return tuple(rows)


def _memoised(runs: Sequence[MeasuredRun]) -> list[MeasuredRun]:
    """``runs`` whose predictions are kept per ``Efficiency`` (the fit asks again for the
    starting and the best values)."""
    out = []
    for r in runs:
        cache: dict[Efficiency, Estimate] = {}

        def predict(eff: Efficiency, r=r, cache=cache) -> Estimate:
            if eff not in cache:
                cache[eff] = r.predict(eff)
            return cache[eff]
        out.append(replace(r, predict=predict))
    return out


def _loss(runs: Sequence[MeasuredRun], eff: Efficiency) -> float:
    return sum(math.log(r.predict(eff).step_time_s / r.step_s) ** 2 for r in runs) / len(runs)


def _golden(f: Callable[[float], float], lo: float, hi: float, steps: int) -> float:
    """The minimiser of ``f`` over log-space [lo, hi] by golden-section search."""
    a, b = math.log(lo), math.log(hi)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(math.exp(c)), f(math.exp(d))
    for _ in range(steps):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(math.exp(c))
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(math.exp(d))
    return math.exp(c if fc <= fd else d)


def calibrate(runs: Sequence[MeasuredRun], fit: Sequence[str] = DEFAULT_FIT, *,
              start: Efficiency = DEFAULT_EFFICIENCY, source: str = "",
              progress: Callable[[int, int, str], None] | None = None) -> Calibration:
    """Fit the constants ``fit`` (names of ``FITTABLE``) to ``runs``; see the module docstring.
    A fitted value is kept only if it lowers the loss."""
    if not runs:
        raise AutoparError("no measured runs to calibrate on", where="--runs",
                           fix="give a file with at least one run (see autopar.measure.calibration)")
    bad = [n for n in fit if n not in FITTABLE]
    if bad or not fit or len(set(fit)) != len(fit) or len(fit) > 3:
        raise AutoparError(f"cannot fit {', '.join(fit) or 'nothing'}", where="--fit",
                           fix=f"name one to three distinct constants of {', '.join(FITTABLE)}")
    runs = _memoised(runs)
    eff = start
    rounds = 1 if len(fit) == 1 else ROUNDS  # one constant: nothing else moved in between
    total, done = rounds * len(fit), 0
    best = _loss(runs, eff)
    for _ in range(rounds):
        for name in fit:
            if progress:
                progress(done, total, f"fitting {name}")
            value = _golden(lambda v: _loss(runs, replace(eff, **{name: v})), *BOUNDS,
                            GOLDEN_STEPS)
            loss = _loss(runs, replace(eff, **{name: value}))
            if loss < best:
                eff, best = replace(eff, **{name: value}), loss
            done += 1
    fitted = {n: getattr(eff, n) for n in fit}
    after = errors(runs, eff)
    stuck = {n: v for n, v in fitted.items() if _at_bound(v)}
    if stuck:
        worst = max(after, key=lambda r: abs(r.error))
        raise AutoparError(
            "no value of " + ", ".join(f"{n} (ended at {v:.3g}, a bound of the range "
                                       f"{BOUNDS[0]:g}..{BOUNDS[1]:g})" for n, v in stuck.items())
            + f" explains the measured runs: {worst.name} is still {worst.error:+.1%} off "
            f"({worst.predicted_s:.4g} s predicted, {worst.measured_s:.4g} s measured)",
            where=source or "--runs",
            fix="check the runs: step_s in seconds (not ms), the configuration, model and "
                "cluster each really ran; or fit a constant that scales the dominant term "
                f"(--fit among {', '.join(FITTABLE)})")
    return Calibration(eff, fitted, errors(runs, start), after, source)


def _at_bound(value: float) -> bool:
    """Whether a fitted ``value`` ended at a bound of ``BOUNDS``, within the golden-section
    search's resolution (its bracket's last width in log space, doubled)."""
    resolution = 2 * (math.log(BOUNDS[1]) - math.log(BOUNDS[0])) * 0.618 ** GOLDEN_STEPS
    return any(abs(math.log(value) - math.log(b)) <= resolution for b in BOUNDS)


# --- reading runs ------------------------------------------------------------------------

def _where(path: Path, i: int, key: str = "") -> str:
    return f"{path}: runs[{i}]" + (f".{key}" if key else "")


def _run_cluster(value: object, nodes: int, profile: Profile | None, where: str) -> ClusterSpec:
    if value == "profile":
        if profile is None:
            raise AutoparError('"cluster": "profile" needs a profile', where=where,
                               fix="pass --profile FILE (written by autopar profile)")
        from autopar.costmodel.cluster import profile_cluster

        return profile_cluster(profile).with_nodes(nodes)
    if isinstance(value, str):
        cluster = ClusterSpec.preset(value, nodes=nodes)
    else:
        cluster = ClusterSpec.from_dict(value, where=where).with_nodes(nodes)
    return cluster.with_profile(profile) if profile is not None else cluster


def _json_run(i: int, d: object, path: Path, profile: Profile | None) -> MeasuredRun:
    from autopar.api import plan_for

    if not isinstance(d, dict):
        raise AutoparError("a run must be a JSON object", where=_where(path, i),
                           fix="see the runs format in autopar/measure/calibration.py's docstring")
    try:
        model = d["model"]
        spec = (ModelSpec.parse(model, {}) if isinstance(model, str) else
                ModelSpec.parse(model["name"], dict(model.get("overrides", {}))))
        cluster = _run_cluster(d["cluster"], int(d.get("nodes", 1)), profile,
                               _where(path, i, "cluster"))
        train = TrainSpec(**d["train"])
        config = ParallelConfig.from_dict(d["config"])
        step_s = float(d["step_s"])
        peak = d.get("peak_bytes")
    except KeyError as err:
        raise AutoparError(f"the run has no {err.args[0]!r}", where=_where(path, i),
                           fix="give model, cluster, train, config and step_s") from None
    except (TypeError, ValueError) as err:
        raise AutoparError(f"the run is malformed: {err}", where=_where(path, i),
                           fix="see the runs format in autopar/measure/calibration.py's docstring") from None
    if not step_s > 0:
        raise AutoparError(f"step_s must be positive seconds, got {step_s}",
                           where=_where(path, i, "step_s"), fix="the measured step time")
    built = spec.build("meta")
    from autopar.analysis.tracing import trace

    graph = trace(built, train)
    return MeasuredRun(str(d.get("name", f"run {i}")), step_s,
                       float(peak) if peak is not None else None,
                       lambda eff: plan_for(graph, cluster, train, config, efficiency=eff,
                                            model_spec=spec).estimate)


def _published_run(row: dict) -> MeasuredRun:
    from autopar.analysis.tracing import trace
    from autopar.measure.validation import check_megatron_row, megatron_inputs, published_step_s

    model, _, train = megatron_inputs(row)
    graph = trace(model, train)

    name = (f"Megatron {row['params_billion']}B, {row['num_gpus']} GPUs, "
            f"tp{row['tensor_parallel_size']} pp{row['pipeline_parallel_size']}")
    return MeasuredRun(name, published_step_s(row), None,
                       lambda eff: check_megatron_row(row, efficiency=eff, graph=graph).estimate)


def recompute_runs(row: dict) -> list[MeasuredRun]:
    """A row of Korthikanti et al.'s Table 5 as its two measured runs: full recomputation, and
    sequence parallelism with selective recomputation (one pricing of both per ``Efficiency``)."""
    from autopar.analysis.tracing import trace
    from autopar.measure.validation import check_recompute_row, megatron_inputs

    model, _, train = megatron_inputs(row)
    graph = trace(model, train)  # once: the fit prices the row under many Efficiency values
    name = (f"Korthikanti {row['params_billion']}B, {row['num_gpus']} GPUs, "
            f"tp{row['tensor_parallel_size']} pp{row['pipeline_parallel_size']}")
    checks: dict[Efficiency, RecomputeCheck] = {}

    def check(eff: Efficiency) -> RecomputeCheck:
        if eff not in checks:
            checks[eff] = check_recompute_row(row, efficiency=eff, graph=graph)
        return checks[eff]

    return [MeasuredRun(f"{name}, full recompute", row["iteration_s_full_recompute"], None,
                        lambda eff: check(eff).full),
            MeasuredRun(f"{name}, SP + selective", row["iteration_s_present_work"], None,
                        lambda eff: check(eff).selective)]


def load_runs(path: str, profile: Profile | None = None) -> list[MeasuredRun]:
    """The runs of a runs file or of a published-runs file (see the module docstring)."""
    p = Path(path)
    data = read_json(p, "runs file", "check the path")
    if isinstance(data, dict) and isinstance(data.get("rows"), list):
        return [run for row in data["rows"]
                for run in (recompute_runs(row) if "iteration_s_present_work" in row
                            else [_published_run(row)])]
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise AutoparError("a runs file is an object with a 'runs' list (or the published "
                           "runs' 'rows')", where=str(p),
                           fix="see the runs format in autopar/measure/calibration.py's docstring")
    return [_json_run(i, d, p, profile) for i, d in enumerate(data["runs"])]
