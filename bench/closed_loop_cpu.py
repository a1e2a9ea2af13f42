"""The closed loop on this machine: profile, predict, run, compare (issue 13 item 4).

    python bench/closed_loop_cpu.py --profile prof.json            # rich table
    python bench/closed_loop_cpu.py --profile prof.json --markdown > bench/results/closed_loop_cpu.md

The CPU "cluster" is this machine's 4 gloo processes (``profile_cluster`` of a profile written
by ``autopar profile --nproc 4``). Each plan of ``PLANS`` is priced with the profile
(``autopar.estimate``) and run: one launch of 4 processes (``verify.start_ranks``, this file
as the rank through ``verify_worker.main``) builds each plan's program as ``train.py`` does
(``verify_worker.sharded_program``), then takes ``WARMUP`` + ``STEPS`` rounds of one step of
every plan in turn (so that the machine's other load, which changes, falls on all plans
alike), each step after a barrier and timed as the slowest rank's; the measured step time is
the median of a plan's ``STEPS`` timed steps. CPU timings are noisy (other work on the
machine, the processes sharing 2 cores), hence the median. The ranking check: the plan the model ranks first against the fastest measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

import autopar
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import profile_cluster
from autopar.costmodel.profile import Profile

NPROC = 4
MODEL = ModelSpec("gpt", {"num_layers": 4, "hidden_size": 512, "num_heads": 8,
                          "vocab_size": 256, "seq_len": 128})
"""12.7 M parameters: hidden 512, 4 layers, 128 tokens a sequence."""
TRAIN = TrainSpec(global_batch=16, seq_len=128, precision="fp32")
WARMUP, STEPS = 2, 7
PLANS = {
    "dp4": dict(dp=4, micro_batch=4),
    "dp4 zero3": dict(dp=4, zero=3, micro_batch=4),
    "dp4 full ckpt": dict(dp=4, micro_batch=4, checkpoint="full"),
    "dp4 selective ckpt": dict(dp=4, micro_batch=4, checkpoint="selective"),
    "dp2 tp2 sp": dict(dp=2, tp=2, sequence_parallel=True, micro_batch=8),
    "tp4 sp": dict(tp=4, sequence_parallel=True, micro_batch=16),
    "dp2 pp2 1f1b": dict(dp=2, pp=2, schedule="1f1b", micro_batch=2),
    "dp2 pp2 gpipe": dict(dp=2, pp=2, schedule="gpipe", micro_batch=2),
    "dp2 pp2 interleaved v2": dict(dp=2, pp=2, schedule="interleaved", virtual_stages=2,
                                   micro_batch=2),
    "pp4 1f1b": dict(pp=4, schedule="1f1b", micro_batch=4),
}


def _plan(name: str, cluster) -> Plan:
    config = ParallelConfig(**PLANS[name])
    return autopar.plan_for(MODEL.build("meta"), cluster, TRAIN, config, model_spec=MODEL,
                            name=name)


def _run_plans(job: dict) -> dict:
    """Rank side: every plan's program built, then the steps taken in rounds -- one step of
    each plan per round, in turn -- so that a change in the machine's other load (it is
    shared) falls on every plan alike; per plan, the slowest rank's time of each step."""
    from autopar.models.training import optimizer, synthetic_batch, vocab_size
    from autopar.verify.worker import sharded_program

    spec = ModelSpec.from_dict(job["model"])
    programs = {}
    for name, plan_dict in job["plans"].items():
        plan = Plan.from_dict(plan_dict)
        model = spec.build("meta")
        program = sharded_program(model, plan, spec, 0)
        rows = plan.train.global_batch // plan.config.dp
        programs[name] = (program, optimizer(program.parameters()), plan.train,
                          slice(program.dp_rank * rows, (program.dp_rank + 1) * rows),
                          vocab_size(model))
    times: dict[str, list[float]] = {name: [] for name in programs}
    for step in range(job["warmup"] + job["steps"]):
        for name, (program, opt, train, mine, vocab) in programs.items():
            tokens, targets = synthetic_batch(step, train.global_batch, train.seq_len, vocab, 0)
            dist.barrier()
            t = time.perf_counter()
            program.step(tokens[mine], targets[mine])
            program.optimizer_step([opt])
            times[name].append(time.perf_counter() - t)
    out = {}
    for name, ts in times.items():
        slowest = torch.tensor(ts[job["warmup"]:], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out[name] = slowest.tolist()
    return out


def measure(plans: dict[str, Plan], timeout_s: float = 1200.0) -> dict[str, list[float]]:
    from autopar.verify.launcher import start_ranks, wait_ranks

    folder = Path(tempfile.mkdtemp(prefix="autopar-closed-loop-"))
    job = {"plans": {n: p.to_dict() for n, p in plans.items()}, "model": MODEL.to_dict(),
           "warmup": WARMUP, "steps": STEPS}
    procs = start_ranks(job, NPROC, folder, worker=(__file__,))
    return wait_ranks(procs, folder, timeout_s)[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", required=True, help="written by autopar profile --nproc 4")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    prof = Profile.load(args.profile)
    cluster = profile_cluster(prof)
    plans = {name: _plan(name, cluster) for name in PLANS}
    start, load_before = time.perf_counter(), _load()
    measured = measure(plans)
    wall, load_after = time.perf_counter() - start, _load()
    rows = []
    for name, plan in plans.items():
        est = plan.estimate
        got = statistics.median(measured[name])
        rows.append((name, plan.summary(), est.step_time_s, got,
                     est.step_time_s / got - 1.0, min(measured[name]), max(measured[name]),
                     est.measured))
    _print(rows, prof, args.profile, wall, f"{load_before} before, {load_after} after",
           args.markdown)


def _load() -> str:
    """The machine's load averages (1, 5, 15 min): other people's work shares its 2 cores."""
    try:
        return " / ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def _print(rows, prof: Profile, path: str, wall: float, load: str, markdown: bool) -> None:
    from autopar.report.text import measured_text

    errs = sorted(abs(r[4]) for r in rows)
    median_err = (errs[len(errs) // 2] + errs[(len(errs) - 1) // 2]) / 2
    first = min(rows, key=lambda r: r[2])
    fastest = min(rows, key=lambda r: r[3])
    lines = [
        "# Closed loop on this CPU machine: predicted vs measured step time",
        "",
        f"Model: gpt, {MODEL.overrides}; global batch {TRAIN.global_batch} x "
        f"{TRAIN.seq_len} tokens, fp32, AdamW; {NPROC} gloo processes, one per \"GPU\".",
        f"Profile: `{path}` ({prof.device}, measured {prof.date}, torch {prof.torch_version}).",
        f"Measured: median of {STEPS} steps after {WARMUP} warm-up steps, each step the "
        f"slowest rank's; the plans' steps in rounds, one launch ({wall:.0f} s); load "
        f"average (1 / 5 / 15 min) {load}.",
        "",
        "| plan | configuration | predicted s | measured s (median) | error | measured "
        "min-max s | priced by |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, summary, pred, got, err, lo, hi, by in rows:
        lines.append(f"| {name} | `{summary}` | {pred:.3f} | {got:.3f} | {err:+.1%} | "
                     f"{lo:.3f}-{hi:.3f} | {measured_text(by)} |")
    lines += ["",
              f"Median |error|: **{median_err:.1%}** over {len(rows)} plans (target <= 25 %).",
              f"Ranked first by the model: **{first[0]}** (measured {first[3]:.3f} s); fastest "
              f"measured: **{fastest[0]}** ({fastest[3]:.3f} s); the model's first is "
              f"{first[3] / fastest[3] - 1:+.1%} from it (target within 10 %)."]
    text = "\n".join(lines) + "\n"
    if markdown:
        sys.stdout.write(text)
    else:
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(text))


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].endswith("job.json"):
        from autopar.verify.worker import main as rank_main

        rank_main(sys.argv[1:], work=_run_plans)
    else:
        main()
