"""A real training step on one GPU against autopar's predictions (issue 35, part 4 of the GPU check).

    python bench/gpu_step.py --out step.json --markdown step.md [--profile profile.json]
    python bench/gpu_step.py --out step.json --markdown step.md --dry     # predictions only

``bench/gpu_check.py`` runs it as its part 4; it runs alone as well. The model is ``MODEL``, a
1B-class Llama 3 (Llama 3.2 1B's shape, head untied: 1.50 B parameters), trained on ``TRAIN``
(8 sequences of 2048 tokens in two micro-batches of 4) on one GPU: the plan dp = 1 of every
checkpoint policy (``Checkpoint``: none, selective, matmuls, full) in every precision of
``PRECISIONS``. For each, three figures and their sources:

* **predicted**: ``autopar.plan_for`` on the one-GPU cluster of the preset matching the card
  (``PRESETS``; ``plan.estimate``'s step time and peak memory), again with the profile part 3
  measured on this GPU (``ClusterSpec.with_profile``: the terms it covers are measured times),
  and ``autopar.dryrun.run`` of the plan (the emitted program's tensors on fake tensors, its peak);
* **measured**: the same plan's program (``verify_worker.sharded_program`` on CUDA under a
  one-rank NCCL group, as an exported ``train.py`` builds it) trained ``WARMUP`` steps and then
  ``STEPS`` timed ones (CUDA events around each step, forward, backward and AdamW; the median),
  with ``torch.cuda.max_memory_allocated`` and ``max_memory_reserved`` over the timed steps
  (any step after the first, as the dry run accounts one), less what was allocated before the
  plan's program was built (a previous row's model is collected first: FSDP's hooks hold it in
  reference cycles, and on the H200 of 2026-11-27 its 6.1 GB were counted in the next row);
* **derived**: the allocator's fragmentation, ``max_memory_reserved - max_memory_allocated``,
  and what lives outside PyTorch's allocator -- the CUDA context, NCCL, the driver's share --,
  the card's used memory less ``memory_reserved`` after the steps. Their sum is what
  ``ClusterSpec.hbm_reserved_bytes`` (``costmodel/cluster.py:DEFAULT_HBM_RESERVED_BYTES``,
  4 GiB, never measured before) stands for.

``--model moe`` runs ``CASES["moe"]`` instead: a 4-layer slice of Qwen3-30B-A3B (128 experts,
top-8, expert FFN 768: 3.11 B parameters), bf16, with the capacity router (factor 1.25: every
expert one batched GEMM, ``torch.bmm``) and dropless (grouped GEMMs, ``models/grouped_gemm.py``;
on 2026-11-28 a loop of one GEMM per expert); autopar's engine's MoE step on a GPU, against a
cost model that prices the grouped GEMMs the frameworks run (issue 30).

``--as-card h100`` asks whether "fits" fits: the plans are predicted for an 80 GB H100
(``hgx-h100-80g``) and run with the caching allocator capped (``set_per_process_memory_fraction``)
at what an H100 leaves it -- its total as ``nvidia-smi`` reports it (``CARDS``) less what lives
outside the allocator on this card, measured after the CUDA context and NCCL start. A plan
predicted to fit that runs out of memory under the cap is a miss of the memory model; the
allocator's reserve under the cap is the fragmentation the 4 GiB of
``ClusterSpec.hbm_reserved_bytes`` stands for, where it matters.

``--expandable-segments`` runs every step with the caching allocator's expandable segments
(``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, set through
``torch.cuda.memory._set_allocator_settings`` before the first allocation): the fragmentation
with and without, under the cap.

``--trace`` adds one more step per plan under ``torch.profiler``: the kernels with the most GPU
time (``TRACE_TOP``), where a step runs slower than priced.

The dry run needs no GPU, so ``--dry`` computes every prediction on a CPU machine; the measured
columns then say why they are missing. Every policy is measured in this one process, one after
the other, the allocator emptied between them (``torch.cuda.empty_cache``) so that each starts
from a clean cache; a policy that fails (out of memory, say) is a result and the next runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import torch

from autopar.core.model_spec import ModelSpec
from autopar.costmodel.cluster import DEFAULT_HBM_RESERVED_BYTES
from autopar.core.specs import Checkpoint, ParallelConfig, Precision, TrainSpec

MODEL = ModelSpec("llama", {"num_layers": 16, "hidden_size": 2048, "num_heads": 32,
                            "num_kv_heads": 8, "ffn_hidden_size": 8192, "vocab_size": 128256,
                            "seq_len": 2048, "rope_theta": 500000.0})
"""Llama 3.2 1B's shape (meta-llama/Llama-3.2-1B config.json: 16 layers, hidden 2048, 32 query
and 8 key-value heads, FFN 8192, vocabulary 128256, RoPE theta 500000) with the zoo's untied
head: 1.50 B parameters, 1.24 B of them in the blocks and the embedding."""
MICRO_BATCH = 4
GLOBAL_BATCH = 8
SEQ_LEN = 2048
PRECISIONS = ("bf16", "fp8")
"""The precisions the step is run in, each under every checkpoint policy (fp8: torchao's
float8 linears, tensorwise; ``bench/gpu_wheels.txt`` carries torchao to the GPU machine). One
that autopar's ``Precision`` does not name is skipped with the reason in ``NOT_YET``."""
NOT_YET: dict[str, str] = {}
POLICIES = tuple(c.value for c in Checkpoint if c is not Checkpoint.MOE)
"""Every checkpoint policy but ``moe``, which recomputes MoE layers: this dense model has none
(the admissibility check refuses it)."""

MOE_SHAPE = {"num_layers": 4, "hidden_size": 2048, "num_heads": 32, "num_kv_heads": 4,
             "head_size": 128, "ffn_hidden_size": 768, "num_experts": 128, "top_k": 8,
             "vocab_size": 151936, "seq_len": 2048, "rope_theta": 1000000.0}
"""Qwen3-30B-A3B's shape (Qwen/Qwen3-30B-A3B config.json: hidden 2048, 32 query and 4
key-value heads of 128, 128 experts, top-8, moe_intermediate_size 768, vocabulary 151936, RoPE
theta 1e6) cut to 4 of its 48 layers so that AdamW's states fit one GPU: 3.11 B parameters."""


@dataclass(frozen=True)
class Case:
    """One model the step is run on, in ``precisions`` under ``policies``."""

    label: str
    spec: ModelSpec
    precisions: tuple[str, ...]
    policies: tuple[str, ...]


CASES = {
    "llama-1b": (Case("llama-1b", MODEL, PRECISIONS, POLICIES),),
    "moe": (Case("moe capacity 1.25", ModelSpec("moe", {**MOE_SHAPE, "capacity_factor": 1.25}),
                 ("bf16",), ("none", "full", "moe")),
            Case("moe dropless", ModelSpec("moe", {**MOE_SHAPE, "capacity_factor": None}),
                 ("bf16",), ("none", "full"))),
}
"""``--model``'s choices: the 1B Llama (the GPU check's part 4) and ``MOE_SHAPE`` with each
router (``moe`` checkpointing recomputes the MoE layers only)."""
CARDS = {"h100": ("hgx-h100-80g", 81559 * 2**20,
                   "nvidia-smi's total on an H100 SXM5 80GB (81559 MiB; costmodel/cluster.py)")}
"""``--as-card``'s cards: (the preset the plans are predicted on, the card's memory in bytes as
its driver reports it, where that figure comes from)."""
TRACE_TOP = 15
WARMUP, STEPS = 2, 5
PRESETS = {"H200": "hgx-h200", "H100": "hgx-h100-80g"}
"""The cluster preset whose GPU is the card (the first name found in the card's name)."""
DEFAULT_PRESET = "hgx-h100-80g"
GiB = 2**30


def preset_of(gpu_name: str | None) -> str:
    """The preset of the card named ``gpu_name`` (``torch.cuda.get_device_name``); the H100's
    for another card or none (``--dry``), which the results then say."""
    for key, preset in PRESETS.items():
        if gpu_name and key in gpu_name:
            return preset
    return DEFAULT_PRESET


def train_of(precision: str) -> TrainSpec:
    return TrainSpec(global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, precision=precision)


def runnable_precisions(precisions: tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """(the ``precisions`` autopar names, {the others: why they are skipped})."""
    known = {p.value for p in Precision}
    run = [p for p in precisions if p in known]
    return run, {p: NOT_YET.get(p, f"autopar's Precision has no {p!r}")
                 for p in precisions if p not in known}


def plan_of(spec: ModelSpec, precision: str, policy: str, cluster):
    import autopar

    config = ParallelConfig(dp=1, micro_batch=MICRO_BATCH, checkpoint=policy)
    return autopar.plan_for(spec.build("meta"), cluster, train_of(precision), config,
                            model_spec=spec, name=f"{precision} {policy}")


def predict(spec: ModelSpec, precision: str, policy: str, preset: str,
            profile_path: str | None) -> dict:
    """The estimate (analytical, and with the profile when given) and the dry run of one
    plan; each failure is recorded as the text of its error, and the others still run."""
    from autopar.costmodel.cluster import process_cluster
    from autopar.dryrun.run import dry_run

    cluster = process_cluster(1, preset)
    out: dict = {"preset": preset}
    plan = None
    try:
        plan = plan_of(spec, precision, policy, cluster)
        e = plan.estimate
        out["estimate"] = {"step_time_s": e.step_time_s, "peak_bytes": e.peak_memory_bytes,
                           "memory_breakdown": dict(e.memory_breakdown),
                           "time_breakdown": dict(e.time_breakdown),
                           "usable_bytes": e.usable_memory_bytes,
                           "model_flops_per_step": e.model_flops_per_step,
                           "peak_flop_per_s": cluster.gpu.peak_flop_per_s.get("bf16")}
    except Exception as err:  # noqa: BLE001 -- a result: the others still run
        out["estimate_error"] = _error(err)
    if profile_path and plan is not None:
        try:
            from autopar.costmodel.profile import Profile

            prof = Profile.load(profile_path)
            e = plan_of(spec, precision, policy, cluster.with_profile(prof)).estimate
            out["estimate_profiled"] = {"step_time_s": e.step_time_s,
                                        "measured": dict(e.measured)}
        except Exception as err:  # noqa: BLE001
            out["estimate_profiled_error"] = _error(err)
    if plan is not None:
        try:
            run = dry_run(plan, workers=1)
            out["dry_run"] = {"peak_bytes": run.peak_bytes,
                              "peak_breakdown": dict(run.roles[0].peak_breakdown),
                              "seconds": run.wall_s, "torch": torch.__version__}
        except Exception as err:  # noqa: BLE001
            out["dry_run_error"] = _error(err)
    return out


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".strip()[:2000]


def _one_rank_group() -> None:
    """A process group of this one process on NCCL (a plan's program runs on a mesh)."""
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", str(port))):
        os.environ.setdefault(key, value)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")


def _train_step(program, opt: torch.optim.Optimizer, tokens: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
    """One training step as ``train.py`` takes it: forward, backward, AdamW; the loss."""
    loss = program.step(tokens, targets)
    program.optimizer_step([opt])
    return loss


def measure(spec: ModelSpec, precision: str, policy: str, trace: bool = False) -> dict:
    """Time ``STEPS`` steps of the plan's program on this GPU after ``WARMUP`` (see the module
    docstring); the memory figures are over the timed steps. ``trace``: one more step under
    ``torch.profiler``, its ``TRACE_TOP`` kernels by GPU time in ``kernels``."""
    from autopar.costmodel.cluster import process_cluster
    from autopar.models.training import optimizer, synthetic_inputs
    from autopar.verify.worker import sharded_program

    plan = plan_of(spec, precision, policy, process_cluster(1, DEFAULT_PRESET))  # the program
    gc.collect()  # a previous row's model, held in reference cycles until a collection
    torch.cuda.empty_cache()
    start_allocated = torch.cuda.memory_allocated()
    model = spec.build("meta")
    began = time.perf_counter()
    program = sharded_program(model, plan, spec, 0, "cuda")
    opt = optimizer(program.parameters())
    built_s = time.perf_counter() - began
    tokens, targets = synthetic_inputs(model, 0, GLOBAL_BATCH, SEQ_LEN)
    losses: list[float] = []
    for _ in range(WARMUP):
        losses.append(float(_train_step(program, opt, tokens, targets)))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(STEPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = _train_step(program, opt, tokens, targets)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
        losses.append(float(loss))  # read after the step's end is recorded
    free, total = torch.cuda.mem_get_info()
    kernels = _trace(lambda: _train_step(program, opt, tokens, targets)) if trace else None
    result = {"step_s": statistics.median(times), "steps_s": times, "losses": losses,
              "max_allocated_bytes": torch.cuda.max_memory_allocated() - start_allocated,
              "start_allocated_bytes": start_allocated,
              "max_reserved_bytes": torch.cuda.max_memory_reserved(),
              "reserved_bytes": torch.cuda.memory_reserved(),
              "outside_allocator_bytes": (total - free) - torch.cuda.memory_reserved(),
              "total_bytes": total, "build_s": built_s}
    if kernels is not None:
        result["kernels"] = kernels
    del program, opt, model
    gc.collect()
    torch.cuda.empty_cache()
    result["left_allocated_bytes"] = torch.cuda.memory_allocated()
    return result


def _trace(step) -> list[dict]:
    """The ``TRACE_TOP`` kernels (and other GPU work) of one ``step()`` by their GPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return [{"name": e.key[:120], "calls": e.count, "gpu_s": e.self_device_time_total / 1e6}
            for e in events[:TRACE_TOP]]


def _cap_memory(card: str) -> dict:
    """The caching allocator capped at what ``card`` leaves it (the module docstring)."""
    _, total_bytes, source = CARDS[card]
    torch.zeros(1, device="cuda")  # the context, and NCCL's group already up
    free, total = torch.cuda.mem_get_info()
    outside = (total - free) - torch.cuda.memory_reserved()
    cap = total_bytes - outside
    torch.cuda.set_per_process_memory_fraction(cap / total)
    return {"card": card, "card_bytes": total_bytes, "card_source": source,
            "outside_allocator_bytes": outside, "cap_bytes": cap, "this_card_bytes": total}


def run(dry: bool, profile_path: str | None, model: str = "llama-1b", as_card: str | None = None,
        trace: bool = False, expandable: bool = False) -> dict:
    """Every case of ``CASES[model]``, precision and policy: predictions, then (on a GPU) the
    measurements; ``as_card`` and ``trace`` as the module docstring says."""
    cases = {c.label: c for c in CASES[model]}
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    preset = preset_of(gpu) if as_card is None else CARDS[as_card][0]
    rows, skipped = [], {}
    for case in cases.values():
        precisions, left = runnable_precisions(case.precisions)
        skipped.update(left)
        rows += [{"case": case.label, "precision": p, "policy": c}
                 for p in precisions for c in case.policies]
    for row in rows:
        row.update(predict(cases[row["case"]].spec, row["precision"], row["policy"], preset,
                           profile_path))
    doc = {"cases": {label: c.spec.to_dict() for label, c in cases.items()},
           "global_batch": GLOBAL_BATCH, "micro_batch": MICRO_BATCH,
           "seq_len": SEQ_LEN, "warmup": WARMUP, "steps": STEPS, "gpu": gpu,
           "preset": preset, "torch": torch.__version__, "skipped_precisions": skipped,
           "rows": rows}
    why = ("--dry: predictions only" if dry else
           None if torch.cuda.is_available() else "no CUDA GPU here")
    if why is None:
        try:
            _one_rank_group()
        except Exception as err:  # noqa: BLE001
            why = f"the one-rank NCCL group did not start: {_error(err)}"
    doc["allocator"] = "expandable_segments:True" if expandable else "default"
    if why is None and expandable:
        torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    if why is None and as_card is not None:
        doc["memory_cap"] = _cap_memory(as_card)
    doc["measured_skipped"] = why
    for row in rows if why is None else ():
        try:
            row["measured"] = measure(cases[row["case"]].spec, row["precision"],
                                      row["policy"], trace)
        except Exception as err:  # noqa: BLE001 -- out of memory is a finding
            row["measured_error"] = _error(err)
            traceback.print_exc()
            gc.collect()
            torch.cuda.empty_cache()
    return doc


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GiB:.2f}"


def _pct(pred: float | None, meas: float | None) -> str:
    if pred is None or not meas:
        return "-"
    return f"{(pred - meas) / meas:+.1%}"


def markdown(doc: dict) -> list[str]:
    """The part's tables: time, memory, and the derived terms (see the module docstring)."""
    lines = [f"- Model `{label}`: `{spec['name']}` "
             f"{json.dumps(spec['overrides'], sort_keys=True)}"
             for label, spec in doc["cases"].items()]
    lines += [f"- Batch {doc['global_batch']} x {doc['seq_len']} tokens in micro-batches of "
              f"{doc['micro_batch']}; dp = 1 on one GPU; predicted on preset `{doc['preset']}`"
              + ("" if doc["gpu"] else " (no GPU here: the H100's)") + f", torch "
              f"{doc['torch']}; measured: median of {doc['steps']} steps after "
              f"{doc['warmup']}.", ""]
    for p, why in doc["skipped_precisions"].items():
        lines.append(f"- {p}: skipped -- {why}")
    if doc["measured_skipped"]:
        lines.append(f"- measured: skipped -- {doc['measured_skipped']}")
    if doc.get("allocator", "default") != "default":
        lines.append(f"- the caching allocator with `{doc['allocator']}`")
    if doc.get("memory_cap"):
        c = doc["memory_cap"]
        lines.append(f"- as an {c['card'].upper()}: the allocator capped at "
                     f"{_gib(c['cap_bytes'])} GiB ({c['card_source']}: {_gib(c['card_bytes'])}"
                     f" GiB, less {_gib(c['outside_allocator_bytes'])} GiB outside the "
                     f"allocator here); predicted on `{doc['preset']}`")
    lines += ["", "| model | precision | policy | step s measured | estimate s | error | "
              "estimate with profile s | error | MFU measured |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        meas = r.get("measured", {}).get("step_s")
        est = r.get("estimate", {}).get("step_time_s")
        prof = r.get("estimate_profiled", {}).get("step_time_s")
        flops = r.get("estimate", {}).get("model_flops_per_step")
        peak = r.get("estimate", {}).get("peak_flop_per_s")
        mfu = f"{flops / meas / peak:.1%}" if meas and flops and peak else "-"
        lines.append(f"| {r['case']} | {r['precision']} | {r['policy']} | "
                     f"{'-' if meas is None else f'{meas:.4f}'} | "
                     f"{'-' if est is None else f'{est:.4f}'} | {_pct(est, meas)} | "
                     f"{'-' if prof is None else f'{prof:.4f}'} | {_pct(prof, meas)} | {mfu} |")
    lines += ["", "Memory, GiB (binary): the tensors' peak measured (`max_memory_allocated`) "
              "against the estimate and the dry run; the allocator's reserve "
              "(`max_memory_reserved`) and what it and the CUDA context add:", "",
              "| model | precision | policy | allocated | estimate | error | dry run | error "
              "| reserved | fragmentation | outside allocator |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        ms = r.get("measured", {})
        alloc, reserved = ms.get("max_allocated_bytes"), ms.get("max_reserved_bytes")
        est = r.get("estimate", {}).get("peak_bytes")
        dry = r.get("dry_run", {}).get("peak_bytes")
        frag = None if alloc is None else reserved - alloc - ms.get("start_allocated_bytes", 0)
        lines.append(f"| {r['case']} | {r['precision']} | {r['policy']} | "
                     f"{_gib(alloc)} | {_gib(est)} | "
                     f"{_pct(est, alloc)} | {_gib(dry)} | {_pct(dry, alloc)} | "
                     f"{_gib(reserved)} | {_gib(frag)} | "
                     f"{_gib(ms.get('outside_allocator_bytes'))} |")
    measured = [r["measured"] for r in doc["rows"] if "measured" in r]
    if measured:
        worst = max(m["max_reserved_bytes"] - m["max_allocated_bytes"]
                    - m.get("start_allocated_bytes", 0)
                    + m["outside_allocator_bytes"] for m in measured)
        lines += ["", f"Derived: fragmentation plus what lives outside the allocator, at most "
                      f"{_gib(worst)} GiB over the policies, against the "
                      f"{_gib(DEFAULT_HBM_RESERVED_BYTES)} GiB the cost model sets aside for "
                      f"them (`ClusterSpec.hbm_reserved_bytes`, with NCCL's buffers and the "
                      f"driver's share; one rank here, so NCCL's are a one-rank group's)."]
    for r in doc["rows"]:
        kernels = r.get("measured", {}).get("kernels")
        if kernels:
            lines += ["", f"Top GPU time in one traced step, {r['case']} "
                          f"{r['precision']} {r['policy']}:", "",
                      "| kernel | calls | GPU ms |", "|---|---|---|"]
            lines += [f"| `{k['name'][:90]}` | {k['calls']} | {k['gpu_s'] * 1e3:.2f} |"
                      for k in kernels]
    errors = [(r["case"], r["precision"], r["policy"], k, v)
              for r in doc["rows"] for k, v in r.items() if k.endswith("_error")]
    if errors:
        lines += ["", "Errors:", ""]
        lines += [f"- {m} {p} {c} {k[:-6]}: `{v.splitlines()[0][:300]}`"
                  for m, p, c, k, v in errors]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the part's results (JSON)")
    parser.add_argument("--markdown", help="the part's tables (markdown)")
    parser.add_argument("--profile", help="a profile of this GPU (autopar profile)")
    parser.add_argument("--dry", action="store_true", help="predictions only (no GPU needed)")
    parser.add_argument("--model", choices=sorted(CASES), default="llama-1b",
                        help="the models stepped (CASES; default: the GPU check's llama-1b)")
    parser.add_argument("--as-card", choices=sorted(CARDS),
                        help="predict for this card and cap the allocator at its memory")
    parser.add_argument("--trace", action="store_true",
                        help="one more step per plan under torch.profiler: its top kernels")
    parser.add_argument("--expandable-segments", action="store_true",
                        help="the caching allocator with expandable_segments:True")
    args = parser.parse_args(argv)
    doc = run(args.dry, args.profile if args.profile and Path(args.profile).exists() else None,
              args.model, args.as_card, args.trace, args.expandable_segments)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    if args.markdown:
        Path(args.markdown).write_text("\n".join(markdown(doc)) + "\n")
    failed = any(k.endswith("_error") for r in doc["rows"] for k in r)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
