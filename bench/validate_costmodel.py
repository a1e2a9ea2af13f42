"""Print the cost model against published training runs (Megatron-LM Table 1, ZeRO Figure 1,
Korthikanti et al. Table 5: uncalibrated, and calibrated on its single-node 22B run).

    python bench/validate_costmodel.py [--markdown]

The same checks assert in tests/unit/measure/test_published_runs.py; this prints the table
(published, predicted, error) that bench/results/costmodel.md records.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from autopar.measure.calibration import calibrate, errors, recompute_runs
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY
from autopar.measure.validation import check_megatron_row, load_published, zero_model_states

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO / "tests" / "data" / "published_runs.json"
MORE = REPO / "tests" / "data" / "megatron_table1_more.json"
RECOMPUTE = REPO / "tests" / "data" / "korthikanti_table5.json"


def korthikanti_table() -> tuple[list[str], list[list[str]], str]:
    """Each Table 5 run: published, predicted with the defaults, and predicted with
    ``matmul_mainloop`` calibrated on the single-node (8-GPU) row alone."""
    rows = sorted(json.loads(RECOMPUTE.read_text())["rows"], key=lambda r: r["num_gpus"])
    runs = [run for row in rows for run in recompute_runs(row)]
    fit = calibrate(runs[:2])
    before, after = errors(runs, DEFAULT_EFFICIENCY), errors(runs, fit.efficiency)
    header = ["run", "published s", "default s", "error", "calibrated s", "error"]
    body = [[b.name, f"{b.measured_s:.2f}", f"{b.predicted_s:.2f}", f"{b.error:+.1%}",
             f"{a.predicted_s:.2f}", f"{a.error:+.1%}"] for b, a in zip(before, after)]
    rest = after[2:]
    note = (f"calibrated on the 22B rows only: matmul_mainloop "
            f"{DEFAULT_EFFICIENCY.matmul_mainloop:.3f} -> {fit.efficiency.matmul_mainloop:.3f}; "
            f"the other {len(rest)} runs' mean |error| "
            f"{sum(abs(r.error) for r in rest) / len(rest):.1%} (defaults: "
            f"{sum(abs(r.error) for r in before[2:]) / len(rest):.1%})")
    return header, body, note


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = ap.parse_args()
    shared = load_published(SHARED)
    rows = [(r, "shared") for r in shared["rows"]]
    rows += [(r, "more") for r in json.loads(MORE.read_text())["rows"]]
    rows.sort(key=lambda rs: rs[0]["params_billion"])
    header = ["params", "GPUs", "TP", "PP", "DP", "batch", "micro-batch", "chunks v",
              "published TFLOP/s", "predicted TFLOP/s", "error", "peak GiB", "source"]
    body = []
    t0 = time.perf_counter()
    for row, src in rows:
        c = check_megatron_row(row)
        cfg = c.estimate.config
        body.append([f"{row['params_billion']}B", str(row["num_gpus"]),
                     str(row["tensor_parallel_size"]), str(row["pipeline_parallel_size"]),
                     str(cfg.dp), str(row["global_batch_size"]), str(cfg.micro_batch),
                     str(cfg.virtual_stages), f"{c.published_tflops:.0f}",
                     f"{c.predicted_tflops:.1f}", f"{c.error:+.1%}",
                     f"{c.estimate.peak_memory_bytes / 2**30:.1f}",
                     "published_runs.json" if src == "shared" else "Table 1 (more)"])
    elapsed = time.perf_counter() - t0
    zero = shared["zero_example"]
    pred = zero_model_states(zero)
    zbody = [[k, f"{v:.1f}", f"{pred[k]:.2f}", f"{pred[k] / v - 1:+.1%}"]
             for k, v in zero["model_state_bytes_per_gpu_GB"].items()]
    zheader = ["ZeRO stage", "published GB", "predicted GB", "error"]
    kheader, kbody, knote = korthikanti_table()
    if args.markdown:
        for h, b in ((header, body), (zheader, zbody), (kheader, kbody)):
            print("| " + " | ".join(h) + " |")
            print("|" + "---|" * len(h))
            for r in b:
                print("| " + " | ".join(r) + " |")
            print()
        print(knote + "\n")
        print(f"{len(body)} runs checked in {elapsed:.1f} s on {platform.processor() or 'CPU'} "
              f"({torch.get_num_threads()} threads), torch {torch.__version__}")
        return
    console = Console()
    for title, h, b in (("Megatron-LM (Narayanan et al., SC'21, Table 1)", header, body),
                        ("ZeRO model states (Rajbhandari et al., SC'20, Fig. 1), 7.5B, Nd=64",
                         zheader, zbody),
                        ("Korthikanti et al. (MLSys'23, Table 5) iteration time", kheader,
                         kbody)):
        t = Table(title=title)
        for col in h:
            t.add_column(col, justify="right")
        for r in b:
            t.add_row(*r)
        console.print(t)
    console.print(knote)
    console.print(f"{len(body)} runs checked in {elapsed:.1f} s")


if __name__ == "__main__":
    main()
