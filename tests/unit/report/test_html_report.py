"""The HTML report (``autopar/report/html.py``, ``autopar/report/charts.py``): one self-contained
page, well formed, with its four charts as inline SVG; headless Chromium renders it without a
console error (skipped where no ``chromium`` is installed: ``.ci/run`` installs Debian's)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

import autopar
from autopar import ClusterSpec, ParallelConfig, TrainSpec
from autopar.cli.main import main
from autopar.core.specs import Schedule
from autopar.report.charts import microbatch_times
from autopar.report.html import compare_page, plan_page

TRAIN = TrainSpec(global_batch=16, seq_len=32)
CLUSTER = ClusterSpec.preset("dgx-a100-80g", nodes=1)
CHARTS = ("memory", "gantt", "time", "plans")
VOID = {"meta", "br", "img", "hr", "input", "link", "col", "area", "base", "source", "wbr"}


@pytest.fixture(scope="module")
def plan() -> autopar.Plan:
    """A tiny GPT on one DGX A100 node, interleaved over 2 stages, with two runner-ups."""
    model = autopar.models.build("tiny-gpt", num_layers=4)

    def one(**kw: object) -> autopar.Plan:
        return autopar.plan_for(model, CLUSTER, TRAIN, ParallelConfig(**kw), name="tiny-gpt")

    best = one(dp=2, tp=2, pp=2, micro_batch=2, schedule="interleaved", virtual_stages=2)
    alts = (one(dp=4, tp=1, pp=2, micro_batch=2), one(dp=8, zero=3, micro_batch=2))
    return replace(best, alternatives=alts)


class _Checker(HTMLParser):
    """Tags opened and closed in order (void elements and SVG's self-closed ones aside), and
    every ``src``/``href``."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.links += [v or "" for k, v in attrs if k in ("src", "href", "xlink:href")]
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.links += [v or "" for k, v in attrs if k in ("src", "href", "xlink:href")]

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()


def _check(page: str) -> _Checker:
    checker = _Checker()
    checker.feed(page)
    checker.close()
    return checker


def test_the_plan_page_is_well_formed_and_self_contained(plan: autopar.Plan) -> None:
    page = plan_page(plan, CLUSTER)
    checker = _check(page)
    assert checker.errors == [] and checker.stack == []
    assert all(link.startswith("#") for link in checker.links), checker.links
    assert not re.search(r"<script|<link|@import|url\((?!#)", page)
    assert page.count("<svg") == len(CHARTS)
    for name in CHARTS:
        svg = re.search(rf'<figure class="chart" id="chart-{name}">\s*(<svg.*?</svg>)', page,
                        re.S)
        assert svg, name
        ET.fromstring(svg.group(1))  # each chart is well-formed XML
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "two elements of the page share an id"


def test_the_plan_page_holds_the_plans_figures_and_its_runner_ups(plan: autopar.Plan) -> None:
    page = plan_page(plan, CLUSTER)
    est = plan.estimate
    for text in (plan.summary(), f"{est.step_time_s * 1e3:,.1f} ms",
                 *(a.summary() for a in plan.alternatives), "Per-module sharding",
                 "usable HBM", "HBM less reserved"):
        assert text in page, text
    for module, style in plan.module_strategies:
        assert f"<td>{html.escape(module)}</td><td>{style}</td>" in page
    # the Gantt chart names the schedule and its bubble (its bars: test_schedule_slots.py)
    m, v = est.num_microbatches, plan.config.virtual_stages
    gantt = re.search(r'id="chart-gantt">(.*?)</figure>', page, re.S).group(1)
    assert f"{m} micro-batches, {v} chunks per stage" in gantt
    assert f"bubble {est.time_breakdown['bubble'] * 1e3:,.1f} ms" in gantt


def test_the_gantt_micro_batch_times_add_up_to_the_pipelined_time(plan: autopar.Plan) -> None:
    est = plan.estimate
    t = est.time_breakdown
    forward, backward = microbatch_times(est)
    pipelined = sum(t[k] for k in ("compute", "recompute", "comm_tp", "comm_cp", "comm_ep",
                                   "comm_pp"))
    assert est.num_microbatches * (forward + backward) == pytest.approx(pipelined)
    assert backward > forward


def test_a_plan_without_pipeline_or_runner_ups_still_has_its_four_charts(plan: autopar.Plan
                                                                          ) -> None:
    model = autopar.models.build("tiny-gpt", num_layers=4)
    flat = autopar.plan_for(model, CLUSTER, TRAIN, ParallelConfig(dp=8, micro_batch=2),
                            name="tiny-gpt")
    assert flat.config.schedule is not Schedule.INTERLEAVED and not flat.alternatives
    page = plan_page(flat)
    assert page.count("<svg") == len(CHARTS)
    assert "No runner-up" in page


def test_compare_page_sets_the_plans_side_by_side(plan: autopar.Plan) -> None:
    plans = [plan, *plan.alternatives]
    page = compare_page(plans, ["a.json", "b.json", "c.json"])
    checker = _check(page)
    assert checker.errors == [] and checker.stack == []
    assert page.count("<svg") == 2
    for p in plans:
        assert p.summary() in page
    assert "b.json against a.json" in page


def test_cli_writes_the_html_page_and_refuses_a_folder_it_cannot_write(
        plan: autopar.Plan, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(plan.to_json())
    b.write_text(plan.alternatives[0].to_json())
    out = tmp_path / "c.html"
    assert main(["compare", str(a), str(b), "--html", str(out)]) == 0
    assert out.read_text().count("<svg") == 2
    assert main(["compare", str(a), str(b), "--html", str(tmp_path / "no" / "c.html")]) == 2
    assert "--html" in capsys.readouterr().err


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _render(page: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
         "--v=0", "--virtual-time-budget=2000", *extra, page.as_uri()],
        capture_output=True, text=True, timeout=120)


def _console_lines(stderr: str) -> list[str]:
    """Chromium's console messages of the page (``--enable-logging=stderr`` writes each as a
    ``CONSOLE(line)`` log line)."""
    return [line for line in stderr.splitlines() if "CONSOLE" in line]


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (.ci/run installs "
                                             "Debian's: apt-get install chromium)")
def test_headless_chromium_renders_the_four_charts_without_a_console_error(
        plan: autopar.Plan, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(plan_page(plan, CLUSTER))
    done = _render(page, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    assert _console_lines(done.stderr) == []
    dom = done.stdout
    for name in CHARTS:
        assert re.search(rf'<figure class="chart" id="chart-{name}">\s*<svg', dom), name
    shot = tmp_path / "report.png"
    done = _render(page, "--window-size=1400,3000", "--hide-scrollbars", f"--screenshot={shot}")
    assert done.returncode == 0 and shot.stat().st_size > 50_000
    # the check sees an error where there is one
    broken = tmp_path / "broken.html"
    broken.write_text(page.read_text().replace("</body>", "<script>nosuchname()</script></body>"))
    assert any("nosuchname" in line for line in _console_lines(_render(broken, "--dump-dom")
                                                               .stderr))


def _sweep_rows():
    from autopar.costmodel.goodput import goodput_of

    model = autopar.models.build("gpt-1.7b")
    params = float(sum(p.numel() for p in model.parameters()))
    rows = []
    for nodes in (1, 2, 4):
        cluster = ClusterSpec.preset("hgx-h100-80g", nodes=nodes)
        plan = autopar.optimize(model, cluster, TrainSpec(global_batch=64, seq_len=2048), keep=1)
        run = goodput_of(tokens=1e11, tokens_per_step=plan.train.tokens_per_step,
                         step_s=plan.estimate.step_time_s, gpus=cluster.num_gpus,
                         params=params, train=plan.train)
        rows.append((cluster.num_gpus, plan, run, ""))
    rows.append((64, None, None, "no plan: an example refusal"))
    return rows


def test_sweep_page_is_well_formed_with_its_chart(tmp_path: Path) -> None:
    from autopar.report.goodput import sweep_table
    from autopar.report.html import sweep_page

    rows = _sweep_rows()
    page = sweep_page("gpt-1.7b against GPUs", rows, sweep_table(rows))
    assert page.count("<svg") == 1 and 'id="chart-sweep"' in page
    assert "no plan: an example refusal" in page
    if CHROMIUM is not None:  # headless Chromium renders it without a console message
        path = tmp_path / "sweep.html"
        path.write_text(page)
        done = _render(path, "--dump-dom")
        assert done.returncode == 0, done.stderr[-2000:]
        assert _console_lines(done.stderr) == []
        assert re.search(r'<figure class="chart" id="chart-sweep">\s*<svg', done.stdout)
