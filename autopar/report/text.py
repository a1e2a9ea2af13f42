"""Tables a person reads: estimates, plans (``plan_report``, ``plan_explain``, ``diff``,
``compare``), the model zoo, cluster presets (rich)."""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from autopar.costmodel.cluster import ClusterSpec
from autopar.core.errors import AutoparError
from autopar.core.estimate import Estimate, checkpoint_text
from autopar.core.layout import Style
from autopar.core.plan import Plan
from autopar.core.specs import Schedule
from autopar.report.execution import execution_lines

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


def measured_text(measured: dict[str, float]) -> str:
    """Which terms a profile priced: ``measured: gemm, all-reduce; partly: attention (50%);
    analytical: optimizer`` (``Estimate.measured``)."""
    full = [t for t, f in measured.items() if f >= 1.0]
    part = [f"{t} ({f:.0%})" for t, f in measured.items() if 0.0 < f < 1.0]
    none = [t for t, f in measured.items() if f <= 0.0]
    words = [(label, names) for label, names in
             (("measured", full), ("partly measured", part), ("analytical", none)) if names]
    return "; ".join(f"{label}: {', '.join(names)}" for label, names in words)


def estimate_tables(est: Estimate, cluster: ClusterSpec | None, title: str = "") -> Group:
    """The estimate as tables under the title ``title: configuration summary`` (``Title``),
    then its notes."""
    parts: list[Table | Title] = [Title(title or "Estimate", est.summary()),
                                  head_table(est, cluster), memory_table(est), time_table(est)]
    if len(est.stage_memory) > 1:
        parts.append(stage_table(est))
    if est.notes:
        parts.append(notes_table(est))
    return Group(*parts)


def head_table(est: Estimate, cluster: ClusterSpec | None) -> Table:
    """The configuration and the headline figures: step time, throughput, MFU, peak memory."""
    c = est.config
    head = Table(show_header=False, box=None)
    head.add_column(style="bold")
    head.add_column()
    if cluster is not None:
        domain = (f", NVLink domains of {cluster.domain_gpus}" if cluster.nvlink_domain
                  else "")
        head.add_row("cluster", f"{cluster.name}: {cluster.nodes} x {cluster.gpus_per_node} "
                                f"{cluster.gpu.name}{domain}")
    experts = f"ep {c.ep}" + (f"  etp {c.etp}" if c.etp > 1 else "") + (
        " (over tp)" if c.experts_fold_tp and c.ep > 1 else "")
    head.add_row("parallel", f"dp {c.dp}  tp {c.tp}  pp {c.pp}  cp {c.cp}  {experts}  "
                             f"zero {c.zero}  sp {'on' if c.sequence_parallel else 'off'}")
    # what the interleaved schedule is with one chunk (costmodel/pipeline.py): 1F1B's bubble,
    # torch's interleaved warm-up (more micro-batches in flight than 1F1B's)
    one_chunk = (" (one model chunk per rank: 1F1B's bubble, but torch's interleaved "
                 "warm-up keeps 2(pp-1-r)+1 micro-batches in flight on rank r where 1F1B keeps "
                 "pp-r; --schedule 1f1b holds less)"
                 if c.schedule is Schedule.INTERLEAVED and c.virtual_stages == 1 and c.pp > 1
                 else "")
    head.add_row("pipeline", f"{c.schedule}  v={c.virtual_stages}  micro-batch {c.micro_batch} x "
                             f"{est.num_microbatches}{one_chunk}")
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
    if est.measured:
        head.add_row("priced by", measured_text(est.measured))
    return head


def memory_table(est: Estimate) -> Table:
    """Bytes by kind on the most loaded GPU, with their share."""
    mem = titled_table("Memory per GPU (most loaded stage)")
    mem.add_column("kind")
    mem.add_column("GiB", justify="right")
    mem.add_column("share", justify="right")
    for k, v in est.memory_breakdown.items():
        mem.add_row(k, f"{v / GIB:,.2f}", f"{v / est.peak_memory_bytes:.1%}")
    mem.add_row("total", f"{est.peak_memory_bytes / GIB:,.2f}", "100%", style="bold")
    return mem


def time_table(est: Estimate) -> Table:
    """Seconds per step by kind (those above zero), with their share."""
    tim = titled_table("Time per step")
    tim.add_column("kind")
    tim.add_column("time", justify="right")
    tim.add_column("share", justify="right")
    for k, v in est.time_breakdown.items():
        if v > 0:
            tim.add_row(k, _seconds(v), f"{v / est.step_time_s:.1%}")
    tim.add_row("step", _seconds(est.step_time_s), "100%", style="bold")
    return tim


def stage_table(est: Estimate) -> Table:
    """Each pipeline stage's peak by kind, its total and when in the step it is."""
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
    return st


def notes_table(est: Estimate) -> Table:
    """What the estimate assumed or could not cost."""
    notes = titled_table("Notes", show_header=False)
    notes.add_column()
    for n in est.notes:
        notes.add_row(n)
    return notes


def plan_title(plan: Plan) -> str:
    """``model on cluster (nodes x GPUs)``: the title of a plan's report."""
    return f"{plan.model} on {plan.cluster} ({plan.nodes} x {plan.gpus_per_node} GPUs)"


def runner_up_table(plan: Plan) -> Table:
    """The runner-ups, best first: each one's configuration, step time against the plan's,
    peak memory and whether it fits."""
    t = titled_table("Runner-up plans")
    for col in ("#", "plan", "step time", "vs best", "peak GiB", "fits"):
        t.add_column(col, justify="right" if col != "plan" else "left")
    for i, alt in enumerate(plan.alternatives, 1):
        t.add_row(str(i), alt.summary(), f"{alt.estimate.step_time_s:.3f} s",
                  f"{alt.estimate.step_time_s / plan.estimate.step_time_s - 1:+.1%}",
                  f"{alt.estimate.peak_memory_bytes / GIB:.1f}",
                  "yes" if alt.estimate.fits else "no")
    return t


def solver_line(plan: Plan) -> str:
    """How the search ended, in one line (empty when the plan records no search)."""
    if plan.solver is None:
        return ""
    return (f"search: {plan.solver.candidates} candidates priced, {plan.solver.pruned} pruned, "
            f"{plan.solver.status}" + (f" (gap {plan.solver.gap:.2%})" if plan.solver.gap else ""))


def sharding_table(plan: Plan) -> Table:
    """Per module, the tensor-parallel style the passes apply (``Plan.module_strategies``), then
    per op of a block its strategy (``Plan.block_strategies``)."""
    t = titled_table(f"Per-module sharding (tp {plan.config.tp})")
    t.add_column("module or op")
    t.add_column("style or strategy")
    last = len(plan.module_strategies) - 1
    for i, (m, s) in enumerate(plan.module_strategies):
        t.add_row(m, str(s), end_section=i == last)
    for op, s in plan.block_strategies:  # in the block's order
        t.add_row(f"op {op}", s)
    return t


def plan_report(plan: Plan, width: int = 110) -> str:
    """The plan as tables under its title (on one line at ``width`` when it fits, the
    configuration summary never broken): configuration, memory per stage, time, notes (the
    ops without a strategy rule among them), what runs, runner-ups."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    console.print(estimate_tables(plan.estimate, None, title=plan_title(plan)), crop=False)
    extra: list[Table | str] = [execution_table(plan)]
    if plan.alternatives:
        extra.append(runner_up_table(plan))
    if plan.solver is not None:
        extra.append(solver_line(plan))
    console.print(Group(*extra))
    return buf.getvalue()


def execution_table(plan: Plan) -> Table:
    """What ``autopar.parallelize`` runs for the plan, aspect by aspect."""
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


def config_text(plan: Plan) -> dict[str, str]:
    """Every ``ParallelConfig`` field of the plan as text (the micro-batches as priced, the
    checkpoint policy in ``checkpoint_text``'s words), then its stage blocks."""
    c = plan.config
    out = {}
    for key, value in c.to_dict().items():
        if key == "checkpoint":
            value = checkpoint_text(c.checkpoint)
        elif key == "num_microbatches":
            value = plan.estimate.num_microbatches
        elif key == "fusions":
            value = ", ".join(c.fusions) or "none"
        out[key] = str(value)
    out["stage_blocks"] = str(list(plan.stage_blocks))
    return out


def decisions(plan: Plan, ops: bool = True) -> dict[str, str]:
    """What the plan decided, by name, as text: ``config_text``, then the per-op strategies
    (``strategy OP``) or, with ``ops=False``, the module styles the tensor-parallel pass applies
    (``style MODULE``). What ``diff`` and ``compare`` set side by side."""
    out = config_text(plan)
    if ops:
        out.update((f"strategy {op}", s) for op, s in sorted(plan.block_strategies))
    else:
        out.update((f"style {m}", str(s)) for m, s in plan.module_strategies)
    return out


def diff(a: Plan, b: Plan) -> str:
    """What changed from plan ``a`` to plan ``b``: decisions, then predictions."""
    lines = [f"a: {a.summary()}", f"b: {b.summary()}"]
    da, db = decisions(a), decisions(b)
    for key in [*da, *(k for k in db if k not in da)]:
        if da.get(key) != db.get(key):
            lines.append(f"  {key}: {da.get(key)} -> {db.get(key)}")
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


def _model_of(plan: Plan) -> str:
    return plan.model_spec.label if plan.model_spec is not None else plan.model


def check_comparable(plans: Sequence[Plan], labels: Sequence[str],
                     any_model: bool = False) -> None:
    """``AutoparError`` unless there are two plans or more of one model (``any_model`` lets
    plans of different models through; ``compare`` then warns)."""
    if len(plans) < 2:
        raise AutoparError(f"compare needs two plans or more, got {len(plans)}",
                           where="the plans", fix="pass two or more plan files")
    if any_model:
        return
    first = plans[0]
    for plan, label in zip(plans[1:], labels[1:]):
        if not _same_model(first, plan):
            raise AutoparError(
                f"{label} is a plan of {_model_of(plan)}, {labels[0]} one of "
                f"{_model_of(first)}: their time and memory differ by the model as well as by "
                "the plan", where=label,
                fix="compare plans of one model, or pass --any-model (any_model=True) to set "
                    "them side by side anyway")


def _same_model(a: Plan, b: Plan) -> bool:
    if a.model_spec is not None and b.model_spec is not None:
        return a.model_spec.same_model(b.model_spec)
    return a.model == b.model


def compare_tables(plans: Sequence[Plan], labels: Sequence[str] | None = None, *,
                   any_model: bool = False) -> Group:
    """Plans side by side (rich): each one's model, cluster and training step, its decisions
    (``decisions``), its time per step by kind (``Estimate.time_breakdown``), throughput, MFU
    and memory by kind on the most loaded GPU; a row whose values differ is marked ``*`` and
    bold. Under the table, each plan against the first in ``plan_explain``'s words
    (``_why_better``)."""
    labels = list(labels or [chr(ord("a") + i) for i in range(len(plans))])
    check_comparable(plans, labels, any_model)
    t = titled_table("Plans side by side (* marks what differs)")
    t.add_column("", justify="center")
    t.add_column("")
    for label in labels:
        t.add_column(label, justify="right")

    def add(name: str, values: Sequence[str], section_end: bool = False) -> None:
        differs = len(set(values)) > 1
        t.add_row("*" if differs else "", name, *values, style="bold" if differs else None,
                  end_section=section_end)

    add("model", [_model_of(p) for p in plans])
    add("cluster", [f"{p.cluster}: {p.nodes} x {p.gpus_per_node}" for p in plans])
    for key in ("global_batch", "seq_len", "precision", "optimizer"):
        add(key, [str(p.train.to_dict()[key]) for p in plans], key == "optimizer")
    plan_decisions = [decisions(p, ops=False) for p in plans]
    keys = list(dict.fromkeys(k for d in plan_decisions for k in d))
    for i, key in enumerate(keys):
        add(key, [d.get(key, "-") for d in plan_decisions], i == len(keys) - 1)
    ests = [p.estimate for p in plans]
    add("step time", [_seconds(e.step_time_s) for e in ests])
    for kind in list(dict.fromkeys(k for e in ests for k in e.time_breakdown)):
        values = [e.time_breakdown.get(kind, 0.0) for e in ests]
        if any(values):
            add(f"  {kind}", [_seconds(v) for v in values])
    add("tokens/s", [f"{e.tokens_per_s:,.0f}" for e in ests])
    add("MFU / HFU", [f"{e.mfu:.1%} / {e.hfu:.1%}" for e in ests], True)
    add("peak memory GiB", [f"{e.peak_memory_bytes / GIB:,.2f}" for e in ests])
    for kind in list(dict.fromkeys(k for e in ests for k in e.memory_breakdown)):
        add(f"  {kind}", [f"{e.memory_breakdown.get(kind, 0.0) / GIB:,.2f}" for e in ests])
    add("usable GiB", [f"{e.usable_memory_bytes / GIB:,.2f}" for e in ests])
    add("fits", ["yes" if e.fits else "NO" for e in ests])
    parts: list[object] = []
    if not all(_same_model(plans[0], p) for p in plans[1:]):
        parts.append(Text("Warning: these are plans of different models; the differences "
                          "below include the models'.", style="bold"))
    parts.append(t)
    for label, plan in zip(labels[1:], plans[1:]):
        parts.append(f"{label} against {labels[0]}: "
                     + _why_better(plans[0].estimate, plan.estimate))
    return Group(*parts)


def compare(plans: Sequence[Plan], labels: Sequence[str] | None = None, *, width: int = 120,
            any_model: bool = False) -> str:
    """``compare_tables`` as text (``autopar compare``)."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    console.print(compare_tables(plans, labels, any_model=any_model), crop=False)
    return buf.getvalue()
