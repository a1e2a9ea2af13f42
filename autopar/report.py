"""Tables a person reads: estimates, the model zoo, cluster presets (rich)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.estimate import Estimate

GIB = 2**30


def _seconds(s: float) -> str:
    return f"{s * 1e3:,.1f} ms" if s < 1 else f"{s:,.3f} s"


def estimate_tables(est: Estimate, cluster: ClusterSpec | None, title: str = "") -> Group:
    c = est.config
    head = Table(title=title or "Estimate", show_header=False, box=None)
    head.add_column(style="bold")
    head.add_column()
    ckpt = c.checkpoint if isinstance(c.checkpoint, str) else ",".join(c.checkpoint)
    if cluster is not None:
        head.add_row("cluster", f"{cluster.name}: {cluster.nodes} x {cluster.gpus_per_node} "
                                f"{cluster.gpu.name}")
    head.add_row("parallel", f"dp {c.dp}  tp {c.tp}  pp {c.pp}  cp {c.cp}  ep {c.ep}  "
                             f"zero {c.zero}  sp {'on' if c.sequence_parallel else 'off'}")
    head.add_row("pipeline", f"{c.schedule}  v={c.virtual_stages}  micro-batch {c.micro_batch} x "
                             f"{est.num_microbatches}")
    head.add_row("checkpoint", f"{ckpt}   offload {'on' if c.offload else 'off'}")
    head.add_row("step time", _seconds(est.step_time_s))
    head.add_row("throughput", f"{est.tokens_per_s:,.0f} tokens/s")
    head.add_row("MFU / HFU", f"{est.mfu:.1%} / {est.hfu:.1%}")
    head.add_row("peak memory", f"{est.peak_memory_bytes / GIB:,.2f} GiB of "
                                f"{est.usable_memory_bytes / GIB:,.2f} GiB usable "
                                f"({'fits' if est.fits else 'DOES NOT FIT'})")

    mem = Table(title="Memory per GPU (most loaded stage)")
    mem.add_column("kind")
    mem.add_column("GiB", justify="right")
    mem.add_column("share", justify="right")
    for k, v in est.memory_breakdown.items():
        mem.add_row(k, f"{v / GIB:,.2f}", f"{v / est.peak_memory_bytes:.1%}")
    mem.add_row("total", f"{est.peak_memory_bytes / GIB:,.2f}", "100%", style="bold")

    tim = Table(title="Time per step")
    tim.add_column("kind")
    tim.add_column("time", justify="right")
    tim.add_column("share", justify="right")
    for k, v in est.time_breakdown.items():
        if v > 0:
            tim.add_row(k, _seconds(v), f"{v / est.step_time_s:.1%}")
    tim.add_row("step", _seconds(est.step_time_s), "100%", style="bold")

    parts: list[Table] = [head, mem, tim]
    if len(est.stage_memory) > 1:
        st = Table(title="Peak memory per pipeline stage (GiB)")
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
    group = Group(*parts)
    if est.notes:
        notes = Table(title="Notes", show_header=False)
        notes.add_column()
        for n in est.notes:
            notes.add_row(n)
        group = Group(*parts, notes)
    return group

