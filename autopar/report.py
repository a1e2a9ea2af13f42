"""Tables a person reads: estimates, plans (``plan_report``, ``plan_explain``, ``diff``), the model
zoo, cluster presets (rich)."""

from __future__ import annotations

import io

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from autopar.costmodel.cluster import ClusterSpec
from autopar.core.estimate import Estimate, checkpoint_text
from autopar.core.layout import Style
from autopar.core.plan import Plan
from autopar.execution import execution_lines

GIB = 2**30


class Title:
    """A report's title, ``sentence: summary``, on one line when it fits the width; otherwise
    the sentence, wrapped between words, over the configuration summary on a line of its own,
    never folded (a summary wider than the console runs past it when printed with
    ``crop=False``, as ``Plan.report`` does)."""

    def __init__(self, sentence: str, summary: str = "") -> None:
        self.sentence = sentence
        self.summary = summary

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        line = f"{self.sentence}: {self.summary}" if self.summary else self.sentence
        if cell_len(line) <= options.max_width or not self.summary:
            yield Text(line, style="bold")
            return
        yield Text(f"{self.sentence}:", style="bold")
        yield Text(self.summary, style="bold", no_wrap=True, overflow="ignore")


def titled_table(title: str, **kwargs: object) -> Table:
    """A rich ``Table`` at least as wide as its title, so the title never wraps."""
    return Table(title=title, min_width=cell_len(title), **kwargs)  # type: ignore[arg-type]


def _fits(need: float, have: float) -> str:
    return "fits" if need <= have else "DOES NOT FIT"


def _seconds(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.3f} s"


def estimate_tables(est: Estimate, cluster: ClusterSpec | None, title: str = "") -> Group:
    """The estimate as tables under the title ``title: configuration summary`` (``Title``),
    then its notes."""
    c = est.config
    head = Table(show_header=False, box=None)
    head.add_column(style="bold")
    head.add_column()
    if cluster is not None:
        head.add_row("cluster", f"{cluster.name}: {cluster.nodes} x {cluster.gpus_per_node} "
                                f"{cluster.gpu.name}")
    head.add_row("parallel", f"dp {c.dp}  tp {c.tp}  pp {c.pp}  cp {c.cp}  ep {c.ep}  "
                             f"zero {c.zero}  sp {'on' if c.sequence_parallel else 'off'}")
    head.add_row("pipeline", f"{c.schedule}  v={c.virtual_stages}  micro-batch {c.micro_batch} x "
                             f"{est.num_microbatches}")
    head.add_row("checkpoint", f"{checkpoint_text(c.checkpoint)}   "
                               f"offload {'on' if c.offload else 'off'}")
    head.add_row("step time", _seconds(est.step_time_s))
    head.add_row("throughput", f"{est.tokens_per_s:,.0f} tokens/s")
    head.add_row("MFU / HFU", f"{est.mfu:.1%} / {est.hfu:.1%}")
    head.add_row("peak memory", f"{est.peak_memory_bytes / GIB:,.2f} GiB of "
                                f"{est.usable_memory_bytes / GIB:,.2f} GiB usable "
                                f"({_fits(est.peak_memory_bytes, est.usable_memory_bytes)})")
    if est.host_memory_bytes:
        head.add_row("host memory", f"{est.host_memory_bytes / GIB:,.2f} GiB of "
                                    f"{est.usable_host_memory_bytes / GIB:,.2f} GiB per node, "
                                    "the offloaded optimizer states ("
                                    f"{_fits(est.host_memory_bytes, est.usable_host_memory_bytes)})")

    mem = titled_table("Memory per GPU (most loaded stage)")
    mem.add_column("kind")
    mem.add_column("GiB", justify="right")
    mem.add_column("share", justify="right")
    for k, v in est.memory_breakdown.items():
        mem.add_row(k, f"{v / GIB:,.2f}", f"{v / est.peak_memory_bytes:.1%}")
    mem.add_row("total", f"{est.peak_memory_bytes / GIB:,.2f}", "100%", style="bold")

    tim = titled_table("Time per step")
    tim.add_column("kind")
    tim.add_column("time", justify="right")
    tim.add_column("share", justify="right")
    for k, v in est.time_breakdown.items():
        if v > 0:
            tim.add_row(k, _seconds(v), f"{v / est.step_time_s:.1%}")
    tim.add_row("step", _seconds(est.step_time_s), "100%", style="bold")

    parts: list[Table | Title] = [Title(title or "Estimate", est.summary()), head, mem, tim]
    if len(est.stage_memory) > 1:
        st = titled_table("Peak memory per pipeline stage (GiB)")
        st.add_column("stage", justify="right")
        st.add_column("blocks", justify="right")
        for k in est.stage_memory[0].breakdown:
            st.add_column(k, justify="right")
        st.add_column("total", justify="right")
        st.add_column("peak at")
        for sm in est.stage_memory:
            st.add_row(str(sm.stage), str(sm.blocks),
                       *(f"{v / GIB:,.2f}" for v in sm.breakdown.values()),
                       f"{sm.peak_bytes / GIB:,.2f}", sm.moment)
        parts.append(st)
    if est.notes:
        notes = titled_table("Notes", show_header=False)
        notes.add_column()
        for n in est.notes:
            notes.add_row(n)
        parts.append(notes)
    return Group(*parts)


def plan_report(plan: Plan, width: int = 110) -> str:
    """The plan as tables under its title (on one line at ``width`` when it fits, the
    configuration summary never broken): configuration, memory per stage, time, notes (the
    ops without a strategy rule among them), what runs, runner-ups."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    title = f"{plan.model} on {plan.cluster} ({plan.nodes} x {plan.gpus_per_node} GPUs)"
    console.print(estimate_tables(plan.estimate, None, title=title), crop=False)
    extra = [_execution_table(plan)]
    if plan.alternatives:
        t = titled_table("Runner-up plans")
        for col in ("#", "plan", "step time", "vs best", "peak GiB", "fits"):
            t.add_column(col, justify="right" if col != "plan" else "left")
        for i, alt in enumerate(plan.alternatives, 1):
            t.add_row(str(i), alt.summary(), f"{alt.estimate.step_time_s:.3f} s",
                      f"{alt.estimate.step_time_s / plan.estimate.step_time_s - 1:+.1%}",
                      f"{alt.estimate.peak_memory_bytes / GIB:.1f}",
                      "yes" if alt.estimate.fits else "no")
        extra.append(t)
    if plan.solver is not None:
        extra.append(f"search: {plan.solver.candidates} candidates priced, "
                     f"{plan.solver.pruned} pruned, {plan.solver.status}"
                     + (f" (gap {plan.solver.gap:.2%})" if plan.solver.gap else ""))
    console.print(Group(*extra))
    return buf.getvalue()


def _execution_table(plan: Plan) -> Table:
    t = titled_table("What runs (autopar.parallelize on torch.distributed)",
                     show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for aspect, text in execution_lines(plan.config, plan.train, sum(plan.stage_blocks)):
        t.add_row(aspect, text)
    split = [(m, s) for m, s in plan.module_strategies if s != Style.REPLICATED]
    if plan.config.tp > 1 and split:
        t.add_row("module styles", ", ".join(f"{m}: {s}" for m, s in split))
    return t


def plan_explain(plan: Plan) -> str:
    """Why this plan and not each runner-up: the deltas that decide it."""
    lines = [f"Chosen: {plan.summary()} -- {plan.estimate.step_time_s:.3f} s per step, "
             f"{plan.estimate.peak_memory_bytes / GIB:.1f} GiB peak of "
             f"{plan.estimate.usable_memory_bytes / GIB:.1f} GiB usable."]
    if not plan.alternatives:
        lines.append("No runner-up: every other candidate was infeasible or pruned.")
    for i, alt in enumerate(plan.alternatives, 1):
        lines.append(f"#{i} {alt.summary()}: " + _why_better(plan.estimate, alt.estimate))
    return "\n".join(lines)


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
