"""The HTML report's charts, drawn by matplotlib as SVG text to inline in the page (no
JavaScript, nothing fetched when the page is viewed): memory per pipeline stage against the
usable HBM, the pipeline schedule as a Gantt chart, the time per step by kind, and plans' time
side by side.

matplotlib is imported here only, when a chart is drawn (``import autopar`` and ``autopar --help``
never load it). Figures are made with ``matplotlib.figure.Figure`` (no pyplot, no global figure
state); text stays text in the SVG (``svg.fonttype: none``), and each chart's element ids are
prefixed with its name so that several SVGs in one page never share an id.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from autopar.core.errors import AutoparError
from autopar.core.estimate import Estimate
from autopar.core.specs import Schedule
from autopar.costmodel.schedule_slots import schedule_slots

if TYPE_CHECKING:
    from matplotlib.figure import Figure

GIB = 2**30

# one colour per kind, the same in every chart (matplotlib's tab10/tab20 qualitative colours);
# memory kinds and time kinds are never in one chart, time kinds never share a colour
MEMORY_COLOURS = {"params": "#1f77b4", "grads": "#ff7f0e", "optimizer": "#2ca02c",
                  "activations": "#d62728", "buffers": "#9467bd"}
TIME_COLOURS = {"compute": "#1f77b4", "recompute": "#aec7e8", "comm_tp": "#ff7f0e",
                "comm_cp": "#ffbb78", "comm_ep": "#9467bd", "comm_pp": "#2ca02c",
                "comm_dp": "#98df8a", "bubble": "#c7c7c7", "optimizer": "#d62728",
                "offload": "#8c564b"}
IDLE_COLOUR = "#e6e6e6"
_SPARE = ("#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#c49c94", "#f7b6d2")
FORWARD_COLOURS = ("#4c72b0", "#8fa8d8")
"""Forward of chunk 0, 1, ... (alternating): blue."""
BACKWARD_COLOURS = ("#dd8452", "#f0b98f")
"""Backward of chunk 0, 1, ...: orange."""


def colour(kind: str, kinds: Sequence[str] = (), time: bool = False) -> str:
    """The colour of ``kind`` (of time when ``time``, else of memory): its own, or a spare one
    by its place in ``kinds``."""
    own = TIME_COLOURS if time else MEMORY_COLOURS
    if kind in own:
        return own[kind]
    others = [k for k in kinds if k not in own]
    return _SPARE[others.index(kind) % len(_SPARE)] if kind in others else _SPARE[0]


def _figure(width_in: float, height_in: float) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise AutoparError("the HTML report draws its charts with matplotlib, which is not "
                           "installed", where="--html",
                           fix="pip install 'matplotlib>=3.8' (scripts/install.sh installs it)"
                           ) from None
    return Figure(figsize=(width_in, height_in), layout="constrained")


def _svg(fig: Figure, name: str) -> str:
    """The figure as SVG text without its XML prologue, ready to inline in HTML."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "autopar",
                                "font.family": "sans-serif"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    # matplotlib numbers its elements per figure (figure_1, axes_1, ...): prefix every id and
    # every reference to one with the chart's name, so that ids stay unique in the page
    text = re.sub(r'\bid="([^"]+)"', rf'id="{name}-\1"', text)
    return re.sub(r'(url\(#|href="#)([^")]+)', rf"\g<1>{name}-\2", text)


def ordered_kinds(rows: Sequence[dict[str, float]], time: bool = False) -> list[str]:
    """The kinds of ``rows`` in the cost model's order (``TIME_COLOURS``' when ``time``, else
    ``MEMORY_COLOURS``'; a plan read from JSON has its breakdowns' keys sorted by name), others
    after them as they come."""
    own = TIME_COLOURS if time else MEMORY_COLOURS
    seen = list(dict.fromkeys(k for r in rows for k in r))
    return [k for k in own if k in seen] + [k for k in seen if k not in own]


def _memory_bars(rows: Sequence[dict[str, float]], labels: Sequence[str],
                 usable_bytes: Sequence[float], before_headroom_bytes: float | None,
                 title: str, name: str) -> str:
    kinds = ordered_kinds(rows)
    fig = _figure(max(9.0, min(13.0, 4.0 + 0.8 * len(rows))), 4.4)
    ax = fig.add_subplot()
    x = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for kind in kinds:
        heights = [r.get(kind, 0.0) / GIB for r in rows]
        ax.bar(x, heights, bottom=bottom, label=kind, color=colour(kind, kinds), width=0.7)
        bottom = [b + h for b, h in zip(bottom, heights)]
    usable = [u / GIB for u in usable_bytes]
    if len(set(usable)) == 1:
        ax.axhline(usable[0], color="#c0392b", linewidth=1.5,
                   label=f"usable HBM {usable[0]:,.1f} GiB")
    else:
        ax.hlines(usable, [i - 0.45 for i in x], [i + 0.45 for i in x], color="#c0392b",
                  linewidth=1.5, label="usable HBM")
    top = max([*usable, *bottom])
    if before_headroom_bytes is not None:
        before = before_headroom_bytes / GIB
        ax.axhline(before, color="#c0392b", linewidth=1, linestyle="--",
                   label=f"HBM less reserved {before:,.1f} GiB (above usable: the headroom)")
        top = max(top, before)
    ax.set_xticks(x, labels, fontsize=8 if len(rows) <= 16 else 6)
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(0, top * 1.12)
    ax.set_title(title)
    handles, names = ax.get_legend_handles_labels()
    lines = len(handles) - len(kinds)  # the HBM lines, then the kinds top of the stack first
    order = list(range(len(kinds), len(handles))) + list(range(len(kinds) - 1, -1, -1))
    assert lines >= 1 and len(order) == len(handles)
    ax.legend([handles[i] for i in order], [names[i] for i in order], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return _svg(fig, name)


def memory_chart(est: Estimate, hbm_before_headroom_bytes: float | None = None) -> str:
    """Peak memory of each pipeline stage's most loaded GPU as bars stacked by kind, against
    the usable HBM (a red line) and, where known, the HBM before the headroom is taken off (a
    dashed line: the band between the two is the headroom)."""
    stages = list(est.stage_memory)
    if stages:
        labels = [f"stage {sm.stage}\n{sm.blocks} blocks" for sm in stages]
        rows = [sm.breakdown for sm in stages]
    else:
        labels, rows = ["all stages"], [est.memory_breakdown]
    before = hbm_before_headroom_bytes
    if before is not None and before <= est.usable_memory_bytes:
        before = None
    return _memory_bars(rows, labels, [est.usable_memory_bytes] * len(rows), before,
                        "Peak memory per pipeline stage (most loaded GPU), by kind", "memory")


def plans_memory_chart(estimates: Sequence[Estimate], labels: Sequence[str]) -> str:
    """Each plan's most loaded GPU as one bar stacked by kind, against its usable HBM."""
    return _memory_bars([e.memory_breakdown for e in estimates], _wrapped(labels),
                        [e.usable_memory_bytes for e in estimates], None,
                        "Peak memory of each plan's most loaded GPU, by kind", "plans-memory")


def _wrapped(labels: Sequence[str], width: int = 22) -> list[str]:
    import textwrap

    return ["\n".join(textwrap.wrap(label, width)) for label in labels]


def microbatch_times(est: Estimate) -> tuple[float, float]:
    """(forward, backward) seconds of one micro-batch through all of a stage's blocks, from the
    estimate's step split: the cost model prices every stage at the slowest one's micro-batch
    time (``compute + recompute + comm_tp/cp/ep/pp``, over the micro-batches); of it the forward
    is a third of the compute (the backward runs two matmuls for each forward one) and half the
    communication, the backward the rest and the recompute."""
    t = est.time_breakdown
    m = est.num_microbatches
    comm = sum(t.get(k, 0.0) for k in ("comm_tp", "comm_cp", "comm_ep", "comm_pp"))
    forward = (t.get("compute", 0.0) / 3 + comm / 2) / m
    backward = (2 * t.get("compute", 0.0) / 3 + t.get("recompute", 0.0) + comm / 2) / m
    return forward, backward


def gantt_chart(est: Estimate) -> str:
    """The pipeline schedule of one step as a Gantt chart: a row per stage, a bar per
    micro-batch's forward (blue) and backward (orange) of each model chunk, laid out by
    ``costmodel.schedule_slots``; the grey between them is the bubble."""
    c = est.config
    schedule = c.schedule if c.pp > 1 else Schedule.ONE_F_ONE_B
    forward, backward = microbatch_times(est)
    slots = schedule_slots(schedule, c.pp, est.num_microbatches, c.virtual_stages, forward,
                           backward)
    span = max(s.end_s for s in slots)
    scale, unit = (1e3, "ms") if span < 10 else (1.0, "s")
    fig = _figure(13.0, max(2.4, min(9.0, 1.2 + 0.32 * c.pp)))
    ax = fig.add_subplot()
    ax.barh(range(c.pp), [span * scale] * c.pp, height=0.8, color=IDLE_COLOUR, zorder=0)
    label_min = span / 60  # a bar wider than this gets its micro-batch number
    for s in slots:
        if s.end_s - s.start_s >= label_min:
            ax.text((s.start_s + s.end_s) / 2 * scale, s.stage, str(s.microbatch),
                    ha="center", va="center", fontsize=6, color="white", zorder=2)
    # one collection per stage, pass and chunk parity (thousands of bars: one patch each
    # would take seconds to draw)
    spans: dict[tuple[int, bool, int], list[tuple[float, float]]] = {}
    for s in slots:
        spans.setdefault((s.stage, s.backward, s.chunk % 2), []).append(
            (s.start_s * scale, (s.end_s - s.start_s) * scale))
    # a white edge between bars, where the bars are wide enough (some 3 pixels of 1,000) not
    # to be all edge
    narrowest = min(s.end_s - s.start_s for s in slots)
    edge = 0.3 if narrowest >= span / 300 else 0.0
    for (stage, backward_pass, parity), xs in spans.items():
        colours = BACKWARD_COLOURS if backward_pass else FORWARD_COLOURS
        ax.broken_barh(xs, (stage - 0.4, 0.8), facecolors=colours[parity], edgecolor="white",
                       linewidth=edge, zorder=1)
    ax.set_yticks(range(c.pp), [f"stage {i}" for i in range(c.pp)],
                  fontsize=8 if c.pp <= 16 else 6)
    ax.invert_yaxis()
    ax.set_xlim(0, span * scale)
    ax.set_xlabel(f"time in the step ({unit})")
    bubble = est.time_breakdown.get("bubble", 0.0)
    chunks = f", {c.virtual_stages} chunks per stage" if schedule is Schedule.INTERLEAVED else ""
    ax.set_title(f"Pipeline schedule: {schedule}, {est.num_microbatches} micro-batches"
                 f"{chunks}; bubble {duration(bubble)} "
                 f"({bubble / est.step_time_s:.1%} of the step)")
    from matplotlib.patches import Patch

    legend = [Patch(color=FORWARD_COLOURS[0], label="forward"),
              Patch(color=BACKWARD_COLOURS[0], label="backward (+ recompute)"),
              Patch(color=IDLE_COLOUR, label="idle (bubble)")]
    if schedule is Schedule.INTERLEAVED:
        legend[2:2] = [Patch(color=FORWARD_COLOURS[1], label="forward, odd chunk"),
                       Patch(color=BACKWARD_COLOURS[1], label="backward, odd chunk")]
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8,
              frameon=False)
    return _svg(fig, "gantt")


def time_chart(est: Estimate) -> str:
    """The step time split by kind (compute, recompute, exposed communication by kind, bubble,
    optimizer, offload) as horizontal bars with their seconds and share."""
    t = est.time_breakdown
    parts = [(k, t[k]) for k in ordered_kinds([t], time=True) if t[k] > 0]
    fig = _figure(9.0, 0.8 + 0.36 * len(parts))
    ax = fig.add_subplot()
    kinds = [k for k, _ in parts]
    values = [v for _, v in parts]
    scale, unit = (1e3, "ms") if est.step_time_s < 10 else (1.0, "s")
    ax.barh(range(len(parts)), [v * scale for v in values],
            color=[colour(k, kinds, time=True) for k in kinds])
    for i, v in enumerate(values):
        ax.text(v * scale, i, f"  {duration(v)} ({v / est.step_time_s:.1%})",
                va="center", fontsize=8)
    ax.set_yticks(range(len(parts)), kinds)
    ax.invert_yaxis()
    ax.set_xlim(0, max(values) * scale * 1.35)
    ax.set_xlabel(unit)
    ax.set_title(f"Time per step by kind: {duration(est.step_time_s)} in all")
    return _svg(fig, "time")


def duration(seconds: float) -> str:
    """``450.7 ms`` below a second, ``19.2 s`` from it."""
    return f"{seconds * 1e3:,.1f} ms" if abs(seconds) < 1 else f"{seconds:,.1f} s"


def plans_time_chart(estimates: Sequence[Estimate], labels: Sequence[str],
                     title: str = "Time per step, plans side by side") -> str:
    """Each plan's step time as one bar stacked by kind (the same colours as ``time_chart``),
    the first plan's step time a dashed line, a plan that does not fit marked; beside it, each
    other plan's time by kind less the first's (the deltas that decide between them)."""
    kinds = [k for k in ordered_kinds([e.time_breakdown for e in estimates], time=True)
             if any(e.time_breakdown.get(k, 0.0) > 0 for e in estimates)]
    longest = max(e.step_time_s for e in estimates)
    scale, unit = (1e3, "ms") if longest < 10 else (1.0, "s")
    n = len(estimates)
    fig = _figure(13.0, 1.4 + 0.5 * n)
    ax, dax = fig.subplots(1, 2, sharey=True, width_ratios=(3, 2)) if n > 1 else \
        (fig.add_subplot(), None)
    left = [0.0] * n
    for kind in kinds:
        widths = [e.time_breakdown.get(kind, 0.0) * scale for e in estimates]
        ax.barh(range(n), widths, left=left, color=colour(kind, kinds, time=True), label=kind,
                height=0.6)
        left = [a + w for a, w in zip(left, widths)]
    first = estimates[0].step_time_s
    for i, e in enumerate(estimates):
        note = (f"  {duration(e.step_time_s)}"
                + (f" ({e.step_time_s / first - 1:+.1%})" if i else "")
                + ("" if e.fits else ", does not fit"))
        ax.text(e.step_time_s * scale, i, note, va="center", fontsize=8)
    ax.axvline(first * scale, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, longest * scale * 1.3)
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=10)
    if dax is not None:
        base = estimates[0].time_breakdown
        step = 0.7 / len(kinds)
        for j, kind in enumerate(kinds):
            deltas = [0.0] + [(e.time_breakdown.get(kind, 0.0) - base.get(kind, 0.0)) * 1e3
                              for e in estimates[1:]]
            dax.barh([i - 0.35 + step * (j + 0.5) for i in range(n)], deltas, height=step,
                     color=colour(kind, kinds, time=True))
        dax.axvline(0, color="black", linewidth=0.8)
        dax.set_xlabel("ms, against the first plan (right: slower)")
        dax.set_title("Time by kind less the first plan's", fontsize=10)
    fig.legend(*ax.get_legend_handles_labels(), loc="outside right upper", fontsize=8,
               frameon=False)
    return _svg(fig, "plans")


def sweep_chart(gpus: Sequence[int], days: Sequence[float], gpu_hours: Sequence[float],
                goodput: Sequence[float]) -> str:
    """``autopar plan --sweep-gpus``: the time to train (days) and the GPU-hours it takes
    against the GPU count, each point labelled with its goodput (the frontier: more GPUs,
    fewer days, more GPU-hours)."""
    fig = _figure(9.0, 3.6)
    left, right = fig.subplots(1, 2)
    left.plot(gpus, days, marker="o", color=colour("compute", time=True))
    for g, d, good in zip(gpus, days, goodput):
        left.annotate(f"{good:.0%}", (g, d), textcoords="offset points", xytext=(4, 4),
                      fontsize=8)
    left.set_xscale("log", base=2)
    left.set_xlabel("GPUs")
    left.set_ylabel("days")
    left.set_title("Time to train (labels: goodput)")
    right.plot(gpus, gpu_hours, marker="o", color=colour("comm_dp", time=True))
    right.set_xscale("log", base=2)
    right.set_xlabel("GPUs")
    right.set_ylabel("GPU-hours")
    right.set_title("GPU-hours to train")
    for ax in (left, right):
        ax.set_xticks(list(gpus), [f"{g:,}" for g in gpus], fontsize=8)
        ax.grid(alpha=0.3)
    return _svg(fig, "sweep")
