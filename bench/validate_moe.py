"""Print the cost model against published runs (``tests/data/moe_runs.json`` by default).

    python bench/validate_moe.py [--markdown FILE] [--only ID,ID]
    python bench/validate_moe.py --runs tests/data/fp8_runs.json --precision all [--markdown F]

Each bf16 run is priced as it ran (``autopar/measure/moe_validation.py``: its model, layout,
dispatcher and overlap), nothing fitted per run; the table gives the published and predicted
step times, the error, the predicted peak memory against the usable HBM, and the runs autopar
refused with the reason. ``tests/unit/measure/test_moe_runs.py`` asserts the same checks;
``bench/results/moe.md`` records a run of this script. With ``--runs`` another file of runs in
the same schema (the FP8 and bf16 runs of ``tests/data/fp8_runs.json``:
``tests/unit/measure/test_fp8_runs.py``, ``bench/results/fp8.md``).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from autopar.measure.moe_validation import (check_moe_run, fp8_recipe_of, load_runs,
                                            used_for_validation)

RUNS = Path(__file__).resolve().parents[1] / "tests" / "data" / "moe_runs.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    ap.add_argument("--only", default="", help="comma-separated run ids")
    ap.add_argument("--runs", default=str(RUNS), help="the runs' JSON file")
    ap.add_argument("--precision", default="bf16", help="the runs' precision, or 'all'")
    args = ap.parse_args()
    only = {x for x in args.only.split(",") if x}
    precision = None if args.precision == "all" else args.precision
    runs = [r for r in load_runs(args.runs, precision) if not only or r["id"] in only]
    start = time.time()
    graphs: dict = {}
    checks = [check_moe_run(r, graphs=graphs) for r in runs]
    header = ["run", "GPUs", "precision", "layout", "published s", "predicted s", "error",
              "peak GiB", "fits"]
    body = []
    for c in checks:
        t = c.run["train"]
        layout = (f"tp{t['tp']} pp{t['pp']}" + (f"v{t['vpp']}" if t.get("vpp") else "")
                  + f" cp{t.get('cp') or 1} ep{t['ep']} etp{t.get('etp') or 1} mb{t['micro_batch']}"
                  + f" {t.get('dispatcher') or ''}".split(" (")[0]
                  + (" ovl" if t.get("a2a_overlap") else ""))
        first = [c.run["id"], f"{c.run['cluster']['num_gpus']} {c.run['cluster']['gpu']}",
                 t["precision"] + (f" {fp8_recipe_of(str(t.get('fp8_recipe')))}"
                                   if t["precision"] == "fp8" else ""), layout]
        if c.refused:
            body.append([*first, f"{c.measured_s:.2f}", "refused", c.refused[:60], "", ""])
            continue
        body.append([*first,
                     f"{c.measured_s:.2f}", f"{c.predicted_s:.2f}", f"{c.error:+.1%}",
                     f"{c.peak_gib:.1f}/{c.usable_gib:.1f}", "yes" if c.fits else "NO"])
    priced = [c for c in checks if c.error is not None]
    mean = sum(abs(c.error) for c in priced) / max(1, len(priced))
    misses = len(checks) - len(priced)
    # the runs the tests hold to the mean: those without a "validation" note saying why not
    used = [c for c in priced if used_for_validation(c.run)]
    used_mean = sum(abs(c.error) for c in used) / max(1, len(used))
    note = (f"{len(checks)} runs: mean |error| {mean:.1%} over the {len(priced)} priced "
            f"({used_mean:.1%} over the {len(used)} used for validation), "
            f"{misses} refused, {sum(not c.fits for c in priced)} predicted not to fit; "
            f"{time.time() - start:.0f} s")
    table = Table(*header, title=f"Published runs ({Path(args.runs).name}, {args.precision})",
                  caption=note)
    for row in body:
        table.add_row(*row)
    Console(width=200).print(table)
    if args.markdown:
        command = "python bench/validate_moe.py" + (
            f" --runs {args.runs} --precision {args.precision}" if args.runs != str(RUNS)
            else "") + " --markdown FILE"
        lines = [f"# Published runs ({Path(args.runs).name}) against the cost model", "",
                 f"{time.strftime('%Y-%m-%d')}, {platform.machine()} {platform.node()}, "
                 f"torch {torch.__version__}; `{command}`", "",
                 "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        lines += ["", note, ""]
        Path(args.markdown).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
