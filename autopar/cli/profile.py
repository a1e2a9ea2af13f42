"""``autopar profile`` and ``autopar calibrate``: measure this machine; fit efficiency constants.

Registered by ``autopar/cli/main.py``. ``profile`` writes a profile file (``costmodel/profile.py``)
that ``estimate``/``plan`` take with ``--profile``; ``calibrate`` writes a calibration file
(``costmodel/efficiency.py``) that they take with ``--calibration``.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from autopar.cli.args import progress_bar
from autopar.core.errors import AutoparError


def add_profile_parsers(sub: argparse._SubParsersAction,
                        parents: list[argparse.ArgumentParser]) -> None:
    """Add ``profile`` and ``calibrate`` to ``sub`` (the ``autopar`` sub-parsers)."""
    p = sub.add_parser(
        "profile", parents=parents, help="measure this machine's operators and collectives",
        description="Measure GEMMs, attention, memory-bound kernels, the optimizer step and "
                    "the collectives with NPROC processes (gloo on CPUs, NCCL on GPUs), all "
                    "at once, and write a profile that estimate and plan take (--profile).")
    p.add_argument("--out", required=True, metavar="FILE", help="the profile to write (JSON)")
    p.add_argument("--nproc", type=int, default=4, metavar="N", help="processes (default 4)")
    p.add_argument("--quick", action="store_true",
                   help="fewer sizes (about a minute with 4 CPU processes); without it, the "
                        "full grid of the device (GPU-sized on CUDA: autopar.measure.profiling.GPU)")
    p.add_argument("--precision", default=None, help="fp32 | bf16 | fp16 (default: bf16 on "
                                                     "GPUs, fp32 on CPUs)")
    p.add_argument("--device", default=None, choices=("cpu", "cuda"),
                   help="default: cuda when there is a GPU per process")
    c = sub.add_parser(
        "calibrate", parents=parents, help="fit efficiency constants to measured runs",
        description="Fit a few named efficiency constants to measured step times (a runs "
                    "file, or the published runs); print the error table before and after and "
                    "write a calibration that estimate and plan take (--calibration).")
    c.add_argument("--runs", required=True, metavar="FILE",
                   help="measured runs (see autopar/measure/calibration.py), or "
                        "tests/data/published_runs.json")
    c.add_argument("--out", required=True, metavar="FILE", help="the calibration to write")
    c.add_argument("--fit", default="matmul_mainloop", metavar="A,B",
                   help="one to three constants of Efficiency (default matmul_mainloop)")
    c.add_argument("--profile", default=None, metavar="FILE",
                   help="price the runs with this profile (and 'cluster: profile' runs on it)")


def cmd_profile(args: argparse.Namespace, console: Console) -> int:
    from autopar.costmodel.cluster import profile_cluster
    from autopar.measure.profiling import QUICK, profile

    _check_writable(args.out, "--out")
    with progress_bar(f"profiling with {args.nproc} processes") as update:
        prof = profile(args.nproc, grid=QUICK if args.quick else None, precision=args.precision,
                       device=args.device, progress=update)
    prof.save(args.out)
    table = Table(title=f"Profile written to {args.out}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    table.add_row("device", f"{prof.device}, {prof.compute_dtype}")
    table.add_row("versions", f"torch {prof.torch_version}, CUDA {prof.cuda_version or '-'}")
    table.add_row("measured", prof.date)
    for field, value in profile_cluster(prof).describe():
        if field in ("Peak per GPU", "HBM", "Intra-node"):
            table.add_row(f"{field} (measured)", value)
    for key, curve in prof.collectives.items():
        table.add_row(key, f"{curve.x[-1] / curve.seconds[-1] / 1e9:.3g} GB/s at "
                           f"{curve.x[-1] / 2**20:.3g} MiB, {curve.seconds[0] * 1e6:.0f} us at "
                           f"{curve.x[0]:.0f} B")
    console.print(table)
    return 0


def cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    from autopar.measure.calibration import calibrate, load_runs
    from autopar.costmodel.profile import Profile

    _check_writable(args.out, "--out")
    prof = Profile.load(args.profile) if args.profile else None
    fit = tuple(n.strip() for n in args.fit.split(",") if n.strip())
    with console.status("reading and tracing the runs..."):
        runs = load_runs(args.runs, prof)
    with progress_bar("calibrating") as update:
        cal = calibrate(runs, fit, source=args.runs, progress=update)
    table = Table(title=f"Step time, measured vs predicted ({', '.join(fit)} fitted)")
    for col in ("run", "measured s", "before s", "error", "after s", "error"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for b, a in zip(cal.before, cal.after):
        table.add_row(b.name, f"{b.measured_s:.4g}", f"{b.predicted_s:.4g}", f"{b.error:+.1%}",
                      f"{a.predicted_s:.4g}", f"{a.error:+.1%}")
    table.add_row("median |error|", "", "", f"{_median_abs(cal.before):.1%}", "",
                  f"{_median_abs(cal.after):.1%}", style="bold")
    table.add_row("rms log error (fitted)", "", "", f"{_rms_log(cal.before):.2%}", "",
                  f"{_rms_log(cal.after):.2%}", style="bold")
    console.print(table)
    console.print("fitted: " + ", ".join(f"{k} = {v:.4g}" for k, v in cal.fitted.items()))
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(json.dumps(cal.to_dict(), indent=2))
    console.print(f"calibration written to {args.out} (estimate/plan --calibration "
                  f"{args.out})")
    return 0


def _median_abs(rows) -> float:
    errs = sorted(abs(r.error) for r in rows)
    n = len(errs)
    return (errs[n // 2] + errs[(n - 1) // 2]) / 2


def _rms_log(rows) -> float:
    """What the fit minimises: the root mean square of log(predicted / measured)."""
    import math

    return math.sqrt(sum(math.log(r.predicted_s / r.measured_s) ** 2 for r in rows) / len(rows))


def _check_writable(path: str, flag: str) -> None:
    """Refuse before measuring for minutes when the file cannot be written."""
    import os

    existed = os.path.exists(path)
    try:
        with open(path, "a", encoding="utf-8"):
            pass
        if not existed:
            os.remove(path)
    except OSError as err:
        raise AutoparError(f"cannot write {path}: {err.strerror}", where=flag,
                           fix="pass a path in a folder that exists and that you can write to"
                           ) from None
