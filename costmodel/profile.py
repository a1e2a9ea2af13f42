"""A measured profile of one machine: what its operators and collectives take, and lookups in it.

``autopar profile`` (``autopar/measure/profiling.py``) measures, with the machine's own software stack,
the work the cost model prices: GEMMs over a grid of shapes, attention forward and backward
(``scaled_dot_product_attention``), memory-bound kernels, the optimizer step, and each collective
over message sizes on each group layout it could form. This module holds the result (a frozen
``Profile`` of measured tables), reads and writes it as versioned JSON, and answers lookups:

* interpolated piecewise-linearly in log-log space (log seconds against log size; trilinear over
  log M, log N, log K for GEMMs), so exact at every measured point and monotone between two
  neighbouring ones;
* ``None`` outside the measured range (and for a dtype, a group layout or a collective that was
  not measured), so the caller prices that term analytically instead.

``compute.estimate_op_s``, ``collectives.estimate_collective_s`` and ``step``'s optimizer term ask
``ClusterSpec.profile`` first. Which terms came from measurement is counted while a step is priced
(``recording``, ``note``) and lands in ``Estimate.measured``.

Sizes follow ``collectives``' convention (all-gather: the gathered output; reduce-scatter: the full
input; all-to-all: what one rank holds; send-recv: what is sent); memory-bound work is keyed by the
bytes the kernels read and write, attention by its forward FLOPs (``ops.attention.sdpa_flop``:
``4 * rows * keys * head_dim``, causal masking not subtracted), the optimizer by parameters.
"""

from __future__ import annotations

import bisect
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from autopar.core.collectives import Collective
from autopar.core.errors import AutoparError, read_json

FORMAT_VERSION = 1
"""Version of the profile file layout; a file of another version is refused, not guessed at."""

TERMS = ("gemm", "grouped_gemm", "attention", "memory-bound", "optimizer",
         Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
         Collective.ALL_TO_ALL, Collective.SEND_RECV)
"""The priced terms a profile can supply, in report order."""


def _interp_1d(xs: Sequence[float], x: float) -> tuple[int, float] | None:
    """(index of the left point, weight of the right one) of ``x`` in ascending ``xs`` in log
    space, or ``None`` outside ``[xs[0], xs[-1]]``."""
    if x <= 0 or not xs or x < xs[0] * (1 - 1e-9) or x > xs[-1] * (1 + 1e-9):
        return None
    if len(xs) == 1:
        return 0, 0.0
    i = min(max(bisect.bisect_right(xs, x) - 1, 0), len(xs) - 2)
    lo, hi = math.log(xs[i]), math.log(xs[i + 1])
    w = min(1.0, max(0.0, (math.log(x) - lo) / (hi - lo)))
    return i, w


def _ascending(values: Sequence[float], name: str, where: str) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if not out or any(not math.isfinite(v) or v <= 0 for v in out) or \
            any(b <= a for a, b in zip(out, out[1:])):
        raise AutoparError(f"{name} must be positive numbers in ascending order, got {values!r}",
                           where=where, fix="re-measure with `autopar profile`")
    return out


def _positive(values: Sequence[float], n: int, name: str, where: str) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if len(out) != n or any(not math.isfinite(v) or v <= 0 for v in out):
        raise AutoparError(f"{name} must be {n} positive seconds, got {len(out)} values",
                           where=where, fix="re-measure with `autopar profile`")
    return out


@dataclass(frozen=True)
class Curve:
    """Seconds measured at ascending sizes ``x`` (bytes, FLOPs or parameters)."""

    x: tuple[float, ...]
    seconds: tuple[float, ...]

    @classmethod
    def of(cls, x: Sequence[float], seconds: Sequence[float], where: str = "curve") -> Curve:
        xs = _ascending(x, f"{where}.x", where)
        return cls(xs, _positive(seconds, len(xs), f"{where}.seconds", where))

    def at(self, x: float) -> float | None:
        """Seconds at ``x``, log-log interpolated; ``None`` outside the measured sizes."""
        hit = _interp_1d(self.x, x)
        if hit is None:
            return None
        i, w = hit
        if w == 0.0:
            return self.seconds[i]
        return math.exp((1 - w) * math.log(self.seconds[i]) + w * math.log(self.seconds[i + 1]))

    def to_dict(self) -> dict[str, list[float]]:
        return {"x": list(self.x), "seconds": list(self.seconds)}


@dataclass(frozen=True)
class GemmGrid:
    """Seconds of a GEMM (``rows x depth`` times ``depth x cols``) over a full grid of shapes;
    ``seconds`` is rows-major: ``seconds[(i * len(cols) + j) * len(depth) + k]``."""

    rows: tuple[float, ...]
    cols: tuple[float, ...]
    depth: tuple[float, ...]
    seconds: tuple[float, ...]

    @classmethod
    def of(cls, rows: Sequence[float], cols: Sequence[float], depth: Sequence[float],
           seconds: Sequence[float], where: str = "gemm") -> GemmGrid:
        r, c, d = (_ascending(v, f"{where}.{n}", where)
                   for v, n in ((rows, "rows"), (cols, "cols"), (depth, "depth")))
        return cls(r, c, d, _positive(seconds, len(r) * len(c) * len(d), f"{where}.seconds",
                                      where))

    def _s(self, i: int, j: int, k: int) -> float:
        return self.seconds[(i * len(self.cols) + j) * len(self.depth) + k]

    def at(self, rows: float, cols: float, depth: float) -> float | None:
        """Seconds of that GEMM, trilinear in log space; ``None`` outside the grid."""
        hits = [_interp_1d(axis, v) for axis, v in
                ((self.rows, rows), (self.cols, cols), (self.depth, depth))]
        if any(h is None for h in hits):
            return None
        (i, wi), (j, wj), (k, wk) = hits  # type: ignore[misc]
        log_s = 0.0
        for di, fi in ((0, 1 - wi), (1, wi)):
            for dj, fj in ((0, 1 - wj), (1, wj)):
                for dk, fk in ((0, 1 - wk), (1, wk)):
                    f = fi * fj * fk
                    if f > 0.0:
                        log_s += f * math.log(self._s(i + di, j + dj, k + dk))
        return math.exp(log_s)

    def to_dict(self) -> dict[str, list[float]]:
        return {"rows": list(self.rows), "cols": list(self.cols), "depth": list(self.depth),
                "seconds": list(self.seconds)}


def collective_key(kind: str, size: int, per_node: int) -> str:
    """The key of a collective's curve: ``all-reduce/4x4`` (group size x ranks per node)."""
    return f"{kind}/{size}x{per_node}"


@dataclass(frozen=True)
class Profile:
    """What one machine measured; see the module docstring. Every table may be missing."""

    device: str
    """What ran the compute, e.g. ``cpu: AMD EPYC 7B13 (2 cores)`` or ``cuda: NVIDIA H100``."""
    compute_dtype: str
    """The cost model's dtype key the compute was measured in (``step.COMPUTE_DTYPE``: fp32
    training computes in "tf32")."""
    torch_version: str
    cuda_version: str | None
    date: str
    """When it was measured (ISO 8601)."""
    backend: str
    """The process-group backend of the collectives (gloo, nccl)."""
    nproc: int
    """Processes that ran at once (compute was measured on all of them together)."""
    gemm: GemmGrid | None = None
    grouped_gemm: GemmGrid | None = None
    """Grouped GEMMs (``grouped_groups`` experts in one kernel), seconds per group by each
    group's (rows, cols, depth); ``grouped_kernel`` says what ran them."""
    grouped_groups: int = 0
    grouped_kernel: str = ""
    """``torch._grouped_mm``, or ``a loop of mm`` where this torch has no grouped kernel."""
    attention_forward: Curve | None = None
    attention_backward: Curve | None = None
    """Keyed, like the forward, by the forward's FLOPs."""
    memory: Curve | None = None
    """Memory-bound kernels keyed by the bytes they read and write."""
    optimizer: Curve | None = None
    """AdamW step keyed by parameters (fp32 states)."""
    collectives: Mapping[str, Curve] = field(default_factory=dict)
    """``collective_key(kind, size, per_node)`` -> seconds by bytes."""
    host_memory_bytes: int | None = None
    """Memory of the machine (a CPU "cluster" shares it between its processes)."""
    source: str = ""
    """The file it was read from, for reports."""

    # lookups: seconds, or None (the caller prices the term analytically)
    def gemm_s(self, rows: float, cols: float, depth: float, dtype: str) -> float | None:
        if self.gemm is None or dtype != self.compute_dtype:
            return None
        return self.gemm.at(rows, cols, depth)

    def grouped_gemm_s(self, groups: int, rows: float, cols: float, depth: float, dtype: str
                       ) -> float | None:
        """``groups`` GEMMs of one shape in one grouped kernel: the measured time per group at
        the shape, times the groups (a grouped kernel's time grows with its tiles). The table
        is keyed as the forward runs (rows: an expert's tokens); a weight gradient, which
        reduces over the tokens, is looked up as the same three matrices in the forward's
        roles (its reduction as the rows)."""
        if self.grouped_gemm is None or dtype != self.compute_dtype:
            return None
        per_group = self.grouped_gemm.at(rows, cols, depth)
        if per_group is None:
            per_group = self.grouped_gemm.at(depth, cols, rows)
        return None if per_group is None else per_group * groups

    def attention_s(self, forward_flop: float, dtype: str, *, backward: bool) -> float | None:
        curve = self.attention_backward if backward else self.attention_forward
        if curve is None or dtype != self.compute_dtype:
            return None
        return curve.at(forward_flop)

    def memory_s(self, nbytes: float) -> float | None:
        return None if self.memory is None else self.memory.at(nbytes)

    def optimizer_s(self, params: float) -> float | None:
        return None if self.optimizer is None else self.optimizer.at(params)

    def collective_s(self, kind: str, nbytes: float, size: int, per_node: int) -> float | None:
        curve = self.collectives.get(collective_key(kind, size, per_node))
        return None if curve is None else curve.at(nbytes)

    # file
    def to_dict(self) -> dict[str, object]:
        tables: dict[str, object] = {
            name: getattr(self, name).to_dict() for name in
            ("gemm", "attention_forward", "attention_backward", "memory", "optimizer")
            if getattr(self, name) is not None}
        tables["collectives"] = {k: c.to_dict() for k, c in self.collectives.items()}
        if self.grouped_gemm is not None:
            tables["grouped_gemm"] = {**self.grouped_gemm.to_dict(),
                                      "groups": self.grouped_groups,
                                      "kernel": self.grouped_kernel}
        return {"format_version": FORMAT_VERSION, "device": self.device,
                "compute_dtype": self.compute_dtype, "torch_version": self.torch_version,
                "cuda_version": self.cuda_version, "date": self.date, "backend": self.backend,
                "nproc": self.nproc, "host_memory_bytes": self.host_memory_bytes,
                "tables": tables}

    @classmethod
    def from_dict(cls, data: object, where: str = "profile") -> Profile:
        if not isinstance(data, Mapping):
            raise AutoparError("a profile must be a JSON object", where=where,
                               fix="pass a file written by `autopar profile --out FILE`")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise AutoparError(f"profile format_version {version!r} is not the one this autopar "
                               f"reads ({FORMAT_VERSION})", where=f"{where}: format_version",
                               fix="re-measure with this version: autopar profile --out FILE")
        try:
            t = data.get("tables", {})
            curves = {n: Curve.of(t[n]["x"], t[n]["seconds"], f"{where}: tables.{n}")
                      for n in ("attention_forward", "attention_backward", "memory", "optimizer")
                      if n in t}
            gemm = None
            if "gemm" in t:
                g = t["gemm"]
                gemm = GemmGrid.of(g["rows"], g["cols"], g["depth"], g["seconds"],
                                   f"{where}: tables.gemm")
            grouped, groups, kernel = None, 0, ""
            if "grouped_gemm" in t:
                g = t["grouped_gemm"]
                grouped = GemmGrid.of(g["rows"], g["cols"], g["depth"], g["seconds"],
                                      f"{where}: tables.grouped_gemm")
                groups, kernel = int(g["groups"]), str(g["kernel"])
            colls = {k: Curve.of(c["x"], c["seconds"], f"{where}: tables.collectives.{k}")
                     for k, c in t.get("collectives", {}).items()}
            host = data.get("host_memory_bytes")
            return cls(device=str(data["device"]), compute_dtype=str(data["compute_dtype"]),
                       torch_version=str(data["torch_version"]),
                       cuda_version=data.get("cuda_version"), date=str(data["date"]),
                       backend=str(data["backend"]), nproc=int(data["nproc"]),
                       gemm=gemm, grouped_gemm=grouped, grouped_groups=groups,
                       grouped_kernel=kernel, collectives=colls,
                       host_memory_bytes=int(host) if host is not None else None,
                       source=where, **curves)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise AutoparError(f"the profile is incomplete or malformed ({type(err).__name__}: "
                               f"{err})", where=where,
                               fix="re-measure with `autopar profile --out FILE`") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Profile:
        data = read_json(path, "profile",
                         "check the path; write one with `autopar profile --out FILE`")
        return cls.from_dict(data, where=str(path))

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))


@dataclass
class Usage:
    """Lookups made while one step was priced: per term, how many the profile answered."""

    measured: dict[str, int] = field(default_factory=dict)
    analytical: dict[str, int] = field(default_factory=dict)

    def fractions(self) -> dict[str, float]:
        """Per term asked for, the fraction of its lookups answered by measurement."""
        terms = [t for t in TERMS if t in self.measured or t in self.analytical]
        return {t: self.measured.get(t, 0) / (self.measured.get(t, 0)
                                              + self.analytical.get(t, 0)) for t in terms}


_USAGE: ContextVar[Usage | None] = ContextVar("autopar_profile_usage", default=None)


def note(term: str, measured: bool) -> None:
    """Count one lookup of ``term`` in the ``recording`` open in this context (if any)."""
    usage = _USAGE.get()
    if usage is not None:
        table = usage.measured if measured else usage.analytical
        table[term] = table.get(term, 0) + 1


@contextmanager
def recording() -> Iterator[Usage]:
    """Count the profile lookups made inside (``note``); nested recordings count separately."""
    usage = Usage()
    token = _USAGE.set(usage)
    try:
        yield usage
    finally:
        _USAGE.reset(token)
