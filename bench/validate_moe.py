"""Print the cost model against published mixture-of-experts runs (``tests/data/moe_runs.json``).

    python bench/validate_moe.py [--markdown FILE] [--only ID,ID]

Each bf16 run is priced as it ran (``autopar/measure/moe_validation.py``: its model, layout,
dispatcher and overlap), nothing fitted per run; the table gives the published and predicted
step times, the error, the predicted peak memory against the usable HBM, and the runs autopar
refused with the reason. ``tests/unit/measure/test_moe_runs.py`` asserts the same checks;
``bench/results/moe.md`` records a run of this script.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from autopar.measure.moe_validation import check_moe_run, load_runs

RUNS = Path(__file__).resolve().parents[1] / "tests" / "data" / "moe_runs.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    ap.add_argument("--only", default="", help="comma-separated run ids")
    args = ap.parse_args()
    only = {x for x in args.only.split(",") if x}
    runs = [r for r in load_runs(RUNS) if not only or r["id"] in only]
    start = time.time()
    graphs: dict = {}
    checks = [check_moe_run(r, graphs=graphs) for r in runs]
    header = ["run", "GPUs", "layout", "published s", "predicted s", "error", "peak GiB",
              "fits"]
    body = []
    for c in checks:
        t = c.run["train"]
        layout = (f"tp{t['tp']} pp{t['pp']}" + (f"v{t['vpp']}" if t.get("vpp") else "")
                  + f" cp{t.get('cp') or 1} ep{t['ep']} etp{t.get('etp') or 1} mb{t['micro_batch']}"
                  + f" {t.get('dispatcher') or ''}".split(" (")[0]
                  + (" ovl" if t.get("a2a_overlap") else ""))
        if c.refused:
            body.append([c.run["id"], str(c.run["cluster"]["num_gpus"]), layout,
                         f"{c.measured_s:.2f}", "refused", c.refused[:60], "", ""])
            continue
        body.append([c.run["id"], str(c.run["cluster"]["num_gpus"]), layout,
                     f"{c.measured_s:.2f}", f"{c.predicted_s:.2f}", f"{c.error:+.1%}",
                     f"{c.peak_gib:.1f}/{c.usable_gib:.1f}", "yes" if c.fits else "NO"])
    priced = [c for c in checks if c.error is not None]
    mean = sum(abs(c.error) for c in priced) / max(1, len(priced))
    misses = len(checks) - len(priced)
    note = (f"{len(checks)} runs: mean |error| {mean:.1%} over the {len(priced)} priced, "
            f"{misses} refused, {sum(not c.fits for c in priced)} predicted not to fit; "
            f"{time.time() - start:.0f} s")
    table = Table(*header, title="Published MoE runs (bf16)", caption=note)
    for row in body:
        table.add_row(*row)
    Console(width=200).print(table)
    if args.markdown:
        lines = [f"# Published MoE runs against the cost model", "",
                 f"{time.strftime('%Y-%m-%d')}, {platform.machine()} {platform.node()}, "
                 f"torch {torch.__version__}; `python bench/validate_moe.py --markdown FILE`", "",
                 "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        lines += ["", note, ""]
        Path(args.markdown).write_text("\n".join(lines))


if __name__ == "__main__":
    main()
