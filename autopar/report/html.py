"""The HTML report: one self-contained page (inline CSS and SVG, no script, nothing fetched when
it is viewed) with ``report_charts``' charts and ``report``'s tables (a rich ``Table`` written as
an HTML table, cell for cell: ``report`` stays the one owner of the rows and their wording).

``plan_page``: memory per pipeline stage against the usable HBM, the pipeline schedule as a Gantt
chart, the step time by kind, the runner-ups side by side with the deltas that decided, the
per-module sharding, what runs. ``compare_page``: plans side by side (``autopar compare --html``).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from autopar.report import charts
from autopar.core.estimate import Estimate
from autopar.core.plan import Plan
from autopar.costmodel.cluster import ClusterSpec, preset_names
from autopar.report import text as report

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       margin: 0 auto; max-width: 1400px; padding: 16px 24px; }
h1 { font-size: 22px; margin: 8px 0 2px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.summary { font-family: ui-monospace, Menlo, Consolas, monospace; color: #444; margin: 0 0 12px; }
.row { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
figure.chart { margin: 0; max-width: 100%; }
figure.chart svg { max-width: 100%; height: auto; }
table { border-collapse: collapse; margin: 4px 0 12px; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding: 2px 0 4px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; vertical-align: top; }
th { background: #f4f4f4; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.bold td { font-weight: 600; }
tr.section-end td { border-bottom: 2px solid #999; }
table.plain td { border: none; padding: 1px 12px 1px 0; }
table.plain td:first-child { font-weight: 600; }
ul.deltas li { margin: 2px 0; }
.note { color: #555; font-size: 12px; }
"""


def _cell(value: object) -> str:
    return html.escape(value.plain if isinstance(value, Text) else str(value))


def table_html(table: Table) -> str:
    """A rich ``Table`` as an HTML table: its title as the caption, its header when it shows
    one, its cells as text, right-justified columns as numbers, bold rows and section ends
    kept."""
    cls = "" if table.show_header else ' class="plain"'
    out = [f"<table{cls}>"]
    if table.title:
        out.append(f"<caption>{_cell(table.title)}</caption>")
    if table.show_header:
        out.append("<thead><tr>" + "".join(f"<th>{_cell(c.header)}</th>" for c in table.columns)
                   + "</tr></thead>")
    columns = [list(c.cells) for c in table.columns]
    numeric = [c.justify == "right" for c in table.columns]
    out.append("<tbody>")
    for i, row in enumerate(table.rows):
        classes = " ".join(n for n, on in (("bold", row.style == "bold"),
                                           ("section-end", row.end_section)) if on)
        attr = f' class="{classes}"' if classes else ""
        cells = "".join(f'<td{" class=num" if numeric[j] else ""}>{_cell(col[i])}</td>'
                        for j, col in enumerate(columns))
        out.append(f"<tr{attr}>{cells}</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _figure(name: str, svg: str, caption: str = "") -> str:
    cap = f'<figcaption class="note">{html.escape(caption)}</figcaption>' if caption else ""
    return f'<figure class="chart" id="chart-{name}">\n{svg}\n{cap}</figure>'


def _page(title: str, body: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


def hbm_before_headroom_bytes(plan: Plan, cluster: ClusterSpec | None = None) -> float | None:
    """HBM per GPU before the headroom is taken off (``gpu.hbm_bytes - hbm_reserved_bytes``) of
    ``cluster``, or of the preset the plan names when it has none; ``None`` when neither is known
    or the preset cannot be the plan's (its value below the plan's usable memory)."""
    if cluster is None:
        if plan.cluster not in preset_names():
            return None
        cluster = ClusterSpec.preset(plan.cluster)
    before = float(cluster.gpu.hbm_bytes - cluster.hbm_reserved_bytes)
    return before if before >= plan.estimate.usable_memory_bytes else None


def _gantt_caption(est: Estimate) -> str:
    forward, backward = charts.microbatch_times(est)
    return (f"One micro-batch through a stage's blocks: forward {forward * 1e3:,.1f} ms, "
            f"backward {backward * 1e3:,.1f} ms (a third of the compute and half the "
            "communication forward; the rest, and the recompute, backward). Laid out by "
            "costmodel/schedule_slots.py from the cost model's schedule rules; the data-parallel "
            "gradient reduction and the optimizer step come after it.")


def plan_page(plan: Plan, cluster: ClusterSpec | None = None, check: str = "",
              run: Table | None = None) -> str:
    """The plan's report as one self-contained HTML page; ``check``, the text of
    ``autopar plan --check``, at its end; ``run``, the whole run's table (``--tokens``:
    ``report/goodput.py``)."""
    est = plan.estimate
    title = report.plan_title(plan)
    labels = ["chosen: " + plan.summary()] + [f"#{i}: {a.summary()}"
                                               for i, a in enumerate(plan.alternatives, 1)]
    memory = [report.memory_table(est)] + ([report.stage_table(est)] if est.stage_memory else [])
    body = [f"<h1>{html.escape(title)}</h1>",
            f'<p class="summary">{html.escape(plan.summary())}</p>',
            table_html(report.head_table(est, cluster)),
            "<h2>Memory per pipeline stage</h2>",
            _figure("memory", charts.memory_chart(est, hbm_before_headroom_bytes(plan, cluster))),
            '<div class="row">' + "".join(table_html(t) for t in memory) + "</div>",
            "<h2>Pipeline schedule</h2>",
            _figure("gantt", charts.gantt_chart(est), _gantt_caption(est)),
            "<h2>Time per step</h2>",
            '<div class="row">' + _figure("time", charts.time_chart(est))
            + table_html(report.time_table(est)) + "</div>",
            "<h2>Runner-ups</h2>",
            _figure("plans", charts.plans_time_chart([est] + [a.estimate
                                                              for a in plan.alternatives],
                                                     labels,
                                                     "Time per step: the plan and its runner-ups")),
            _deltas(plan)]
    if plan.alternatives:
        body.append(table_html(report.runner_up_table(plan)))
    body += ["<h2>Per-module sharding</h2>", table_html(report.sharding_table(plan)),
             "<h2>What runs</h2>", table_html(report.execution_table(plan))]
    if est.notes:
        body.append(table_html(report.notes_table(est)))
    if plan.solver is not None:
        body.append(f'<p class="note">{html.escape(report.solver_line(plan))}</p>')
    if run is not None:
        body += ["<h2>Time to train</h2>", table_html(run)]
    if check:
        body += ["<h2>Dry-run check</h2>", f"<pre>{html.escape(check)}</pre>"]
    return _page(title, body)


def sweep_page(title: str, rows: Sequence, table: Table) -> str:
    """``autopar plan --sweep-gpus --html``: time to train and GPU-hours against GPUs as a
    chart, and the sweep's table (``report/goodput.py:sweep_table``)."""
    done = [(g, r) for g, p, r, _ in rows if p is not None]
    chart = charts.sweep_chart([g for g, _ in done], [r.wall_days for _, r in done],
                               [r.gpu_hours for _, r in done], [r.goodput for _, r in done])
    return _page(title, [f"<h1>{html.escape(title)}</h1>", _figure("sweep", chart),
                         table_html(table)])


def _deltas(plan: Plan) -> str:
    """``plan_explain``'s lines: why this plan and not each runner-up."""
    items = "".join(f"<li>{html.escape(line)}</li>"
                    for line in report.plan_explain(plan).splitlines())
    return f'<ul class="deltas">{items}</ul>'


def compare_page(plans: Sequence[Plan], labels: Sequence[str] | None = None, *,
                 any_model: bool = False) -> str:
    """Plans side by side as one self-contained HTML page: ``compare_tables``' table and
    deltas, each plan's time by kind and memory by kind as bars side by side."""
    labels = list(labels or [chr(ord("a") + i) for i in range(len(plans))])
    group: Group = report.compare_tables(plans, labels, any_model=any_model)
    ests = [p.estimate for p in plans]
    named = [f"{label}: {p.summary()}" for label, p in zip(labels, plans)]
    body = ["<h1>Plans side by side</h1>",
            "<h2>Time per step</h2>",
            _figure("plans", charts.plans_time_chart(ests, named,
                                                     f"Time per step, each against {labels[0]}")),
            "<h2>Memory on the most loaded GPU</h2>",
            _figure("plans-memory", charts.plans_memory_chart(ests, named)),
            "<h2>Decisions and predictions</h2>"]
    for part in group.renderables:
        if isinstance(part, Table):
            body.append(table_html(part))
        else:
            body.append(f"<p>{_cell(part)}</p>")
    return _page("autopar compare: " + ", ".join(labels), body)
