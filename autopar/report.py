"""Tables a person reads: estimates, the model zoo, cluster presets (rich)."""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.estimate import Estimate, checkpoint_text

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
        for sm in est.stage_memory:
            st.add_row(str(sm.stage), str(sm.blocks),
                       *(f"{v / GIB:,.2f}" for v in sm.breakdown.values()),
                       f"{sm.peak_bytes / GIB:,.2f}")
        parts.append(st)
    if est.notes:
        notes = titled_table("Notes", show_header=False)
        notes.add_column()
        for n in est.notes:
            notes.add_row(n)
        parts.append(notes)
    return Group(*parts)

