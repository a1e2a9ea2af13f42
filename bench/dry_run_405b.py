"""Time the dry run of llama3-405b on 16384 ranks: every rank role, one step on fake tensors.

    python bench/dry_run_405b.py                    # every role, one process per CPU core
    python bench/dry_run_405b.py --workers 1        # every role in this process, one by one
    python bench/dry_run_405b.py --save F.json      # also write each role's figures
    python bench/dry_run_405b.py --compare F.json   # and check them against a saved run
    python bench/dry_run_405b.py --markdown         # the table for bench/results/dry_run_405b.md
    python bench/dry_run_405b.py --plan F.json      # another plan (autopar plan --json F.json)
    python bench/dry_run_405b.py --all-microbatches # every micro-batch of each role's step
    python bench/dry_run_405b.py --every-role       # every role run, none read off its alikes

The plan is issue 12's: llama3-405b, hgx-h100-80g with 2048 nodes, tp8 pp16 dp128, ZeRO-1,
sequence parallel, the interleaved schedule with 2 chunks per rank, micro-batch 1, global
batch 2048 of 8192 tokens (16 micro-batches per rank). Target: every role within 60 s on a
2-core CPU machine. Issue 32's plan is the one ``autopar plan --model llama3-405b --cluster
hgx-h100-80g --nodes 2048 --global-batch 2048 --seq-len 8192 --tp 8 --pp 16 --schedule
interleaved --json F.json`` chooses (``--plan F.json``). Prints, per pipeline rank, the
micro-batches its dry run ran of the step's (``autopar/dryrun/steady.py``) or the alike ranks
its peak was read off (``autopar/dryrun/alike.py``; ``--every-role`` runs each), the seconds the
role took where it ran, its peak (GiB = 2^30 bytes) and the collectives it issued; then the dry run's wall time, the user
CPU seconds of this process and of the worker processes, and the load average over the run
(other jobs on the machine share its cores: wall times are only comparable at equal load).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time

import torch

import autopar
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.dryrun.run import dry_run
from autopar.report.dryrun import microbatches_text, read_off_lines

from machine import machine_lines

GIB = 2**30
TARGET_S = 60.0


def plan_405b():
    spec = ModelSpec.zoo("llama3-405b")
    cluster = autopar.ClusterSpec.preset("hgx-h100-80g", nodes=2048)
    config = ParallelConfig(dp=128, tp=8, pp=16, zero=1, micro_batch=1, sequence_parallel=True,
                            schedule="interleaved", virtual_stages=2)
    return autopar.plan_for(spec.build("meta"), cluster,
                            TrainSpec(global_batch=2048, seq_len=8192), config, model_spec=spec)


class LoadSampler:
    """The 1-minute load average every few seconds while the dry run runs."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every_s,), daemon=True)

    def _run(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> str:
        s = self.samples
        return (f"{s[0]:.2f} at start, {sum(s) / len(s):.2f} mean, {max(s):.2f} highest (1-minute "
                "average, counting this run's own processes)")


def figures(run) -> dict[str, dict]:
    """What the dry run measures, per pipeline rank: the peak and its kinds (``--compare``
    checks these), the micro-batches run and the collectives issued in them."""
    return {str(r.pp_rank): {"peak_bytes": r.peak_bytes, "peak_breakdown": r.peak_breakdown,
                             "microbatches": r.microbatches, "collectives": r.collectives}
            for r in run.roles}


def same_peaks(a: dict[str, dict], b: dict[str, dict]) -> bool:
    keys = ("peak_bytes", "peak_breakdown")
    return a.keys() == b.keys() and all({k: a[r][k] for k in keys} == {k: b[r][k] for k in keys}
                                        for r in a)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=None,
                   help="processes running roles side by side (default: one per CPU core)")
    p.add_argument("--pp-rank", type=int, action="append", default=None,
                   help="only this pipeline rank's role (repeatable)")
    p.add_argument("--save", metavar="F", help="write each role's figures as JSON")
    p.add_argument("--compare", metavar="F", help="check the figures against a --save file")
    p.add_argument("--plan", metavar="F", help="dry-run this plan file instead of issue 12's")
    p.add_argument("--all-microbatches", action="store_true",
                   help="run every micro-batch of each role's step")
    p.add_argument("--every-role", action="store_true",
                   help="run every role, none read off its alike neighbours")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)

    plan = autopar.Plan.from_file(args.plan) if args.plan else plan_405b()

    def progress(done: int, total: int, what: str) -> None:
        print(f"  [{time.perf_counter() - began:6.1f} s] {done}/{total} roles; {what}",
              file=sys.stderr, flush=True)

    command = " ".join(["python bench/dry_run_405b.py", *argv])
    header = machine_lines(command, f"torch {torch.__version__}")  # the load before the run
    with LoadSampler() as load:
        cpu0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        began = time.perf_counter()
        run = dry_run(plan, workers=args.workers, pp_ranks=args.pp_rank, progress=progress,
                      all_microbatches=args.all_microbatches, every_role=args.every_role)
        wall = time.perf_counter() - began
        cpu_self = resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu0
    cpu_workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime
    got = figures(run)
    same = None
    if args.compare:
        with open(args.compare, encoding="utf-8") as f:
            same = same_peaks(json.load(f), json.loads(json.dumps(got)))
    if args.save:
        with open(args.save, "w", encoding="utf-8") as f:
            json.dump(got, f, indent=1)

    workers = args.workers or min(len(os.sched_getaffinity(0)), len(run.roles))
    if args.markdown:
        print("# Dry run of llama3-405b on 16384 ranks\n")
        print("\n".join(header))
        print(f"- Plan: {plan.summary()}, {plan.config.world_size} ranks, "
              f"{plan.config.microbatches(plan.train)} micro-batches per rank\n")
    print("| pp rank | stages | blocks | micro-batches run | s | peak GiB | predicted error "
          "| collectives in those |")
    print("|---|---|---|---|---|---|---|---|")
    for r in run.roles:
        comm = ", ".join(f"{k} {v}" for k, v in r.collectives.items() if k != "wait_tensor")
        err = "-" if r.error is None else f"{r.error:+.2%}"
        print(f"| {r.pp_rank} | {','.join(map(str, r.stages))} | {r.blocks} | "
              f"{microbatches_text(r)} | {'-' if r.inferred_from else f'{r.seconds:.1f}'} | "
              f"{r.peak_bytes / GIB:.2f} | {err} | {comm} |")
    print(f"\n{len(run.roles)} roles in {wall:.1f} s wall with {workers} process"
          f"{'es' if workers > 1 else ''} (target {TARGET_S:.0f} s: "
          f"{'met' if wall <= TARGET_S else 'NOT met'}); user CPU {cpu_self:.1f} s here, "
          f"{cpu_workers:.1f} s in worker processes; load average {load.summary()}.")
    for line in read_off_lines(run):
        print(f"\n{line}.")
    if same is not None:
        print(f"Peaks and their kinds against {args.compare}: "
              f"{'identical' if same else 'DIFFERENT'}.")
    return 0 if same is not False else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
