"""autopar's DeepSpeed export run by DeepSpeed's own engine (issue 33): each ``ds_config.json``
handed to ``deepspeed.initialize(model=model, config=..., model_parameters=...)`` as the export's
README says, in 2 gloo processes on the CPU (DeepSpeed's CPU accelerator), one optimizer step
taken, and what the engine derived read back against the plan: its ZeRO stage, the batch
triple and data-parallel size, bf16 or fp16, the gradient reduction's dtype, the optimizer
(DeepSpeedCPUAdam where the plan offloads it), and under pp the pipeline's stages and recompute
interval (a ``PipelineModule`` of the decoder's layers, as the README says to build it). ``tests/unit/exports/test_exports.py`` holds the
larger plans to DeepSpeed's config parser; this holds the engine to the plan. The model is the
user's training script's own (the zoo's ``tiny-llama``; a tiny transformers Llama for AutoTP's
tensor parallelism, which splits transformers' models only); the plans are for 2 GPUs, the
processes here.

One stand-in for the GPUs: the worker turns off the CPU accelerator's shared-memory collectives
(a CPU-only path DeepSpeed compiles on first use, about 70 s here; on GPUs it runs NCCL). The
optimizers DeepSpeed compiles (FusedAdam; DeepSpeedCPUAdam under offload) are the ones a GPU run
uses; ``compiled_optimizers`` builds them once in this process first, so two ranks do not race
to compile the same op (one cold run here failed before it did). The five cases without pp run in
one launch of 2 processes, the pp case in another: the six took 105 s cold here (the compiles
about 68 s, then cached in ``~/.cache/torch_extensions``), the six 35 s warm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import process_cluster
from autopar.exports import export_target

from autopar.exports.deepspeed import counted_batch
from launching import free_port

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install "
                    "deepspeed==0.19.8; DS_BUILD_OPS=0)")

WORKER = Path(__file__).with_name("deepspeed_worker.py")
MODEL, SEQ = "tiny-llama", 32
CASES = {
    "tp2-autotp-bf16": (ParallelConfig(dp=1, tp=2, zero=1, micro_batch=1), "bf16"),
    "zero1-bf16": (ParallelConfig(dp=2, zero=1, micro_batch=1), "bf16"),
    "zero2-fp16": (ParallelConfig(dp=2, zero=2, micro_batch=1), "fp16"),
    "zero3-bf16-full": (ParallelConfig(dp=2, zero=3, micro_batch=1, checkpoint="full"), "bf16"),
    "zero1-offload": (ParallelConfig(dp=2, zero=1, micro_batch=1, offload=True), "bf16"),
    "pp2-full-bf16": (ParallelConfig(dp=1, pp=2, zero=1, micro_batch=1, checkpoint="full"),
                      "bf16"),
}


def _model(case: str):
    """The user's model: the zoo's tiny Llama, or a transformers one where AutoTP splits it."""
    if case.startswith("tp"):
        from deepspeed_worker import hf_llama

        return "hf-llama", hf_llama()
    return MODEL, autopar.models.build(MODEL)


def _worker_model(case: str, name: str) -> str:
    """The worker's model argument: a pipeline case's model as a ``PipelineModule``."""
    pp = CASES[case][0].pp
    return f"{name}@pp{pp}" if pp > 1 else name


@pytest.fixture(scope="module")
def plans() -> dict[str, tuple]:
    """Each case's (model name, model, plan), planned once."""
    out = {}
    for case, (config, precision) in CASES.items():
        name, model = _model(case)
        out[case] = name, model, autopar.plan_for(
            model, process_cluster(2),
            TrainSpec(global_batch=4, seq_len=SEQ, precision=precision), config, name=name)
    return out


def refused_here(case: str) -> str | None:
    """Why DeepSpeed's accelerator on this machine refuses ``case``, or None: fp16 on a CPU
    whose oneDNN has no fp16 (DeepSpeed's ``CPU_Accelerator.is_fp16_supported``, which its
    engine's sanity check reads: "Type fp16 is not supported on your device"; an AMD EPYC here
    in 2026-12, where the Intel Xeon of the earlier runs has AVX512-FP16)."""
    from deepspeed.accelerator import get_accelerator

    if CASES[case][1] == "fp16" and not get_accelerator().is_fp16_supported():
        return f"DeepSpeed's {get_accelerator().device_name()} accelerator has no fp16 here"
    return None


@pytest.fixture(scope="module")
def readbacks(tmp_path_factory, compiled_optimizers, plans) -> dict[str, list[dict]]:
    """Every case's two ranks' readbacks, the cases in two launches of 2 processes (each case
    with its own model and engine); a case that failed gives its ranks' tracebacks instead."""
    out = tmp_path_factory.mktemp("deepspeed")
    # AutoTP and a PipelineModule leave their groups in DeepSpeed's globals, which a later
    # engine would take for its own: the tp case runs last, the pipeline in a launch of its own
    # a case this machine's accelerator refuses is left out: one that fails ends its launch
    runnable = [c for c in CASES if refused_here(c) is None]
    plain = sorted((c for c in runnable if CASES[c][0].pp == 1), key=lambda c: (c[:2] == "tp", c))
    got: dict[str, list] = {}
    for launch in (plain, sorted(c for c in runnable if CASES[c][0].pp > 1)):
        args = []
        for case in launch:
            name, _, plan = plans[case]
            config = out / f"{case}.json"
            config.write_text(export_target(plan, "deepspeed").files["ds_config.json"])
            args.append(f"{case}={config}:{_worker_model(case, name)}")
        torchrun = Path(sys.executable).with_name("torchrun")
        env = dict(os.environ, OMP_NUM_THREADS="1", DS_BUILD_OPS="0")
        done = subprocess.run(
            [str(torchrun) if torchrun.exists() else "torchrun", "--nproc-per-node", "2",
             "--master-port", str(free_port()), str(WORKER), str(out), str(SEQ), *args],
            env=env, capture_output=True, text=True, timeout=900)
        exit_text = f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        for case in launch:
            errors = [p.read_text() for p in sorted((out / case).glob("error-*.txt"))]
            rows = [json.loads(p.read_text()) for p in sorted((out / case).glob("readback-*"))]
            got[case] = errors or rows or [f"no readback: {exit_text}"]
    return got


def plan_q_rows(model) -> int:
    return next(w for n, w in model.named_parameters() if n.endswith("q_proj.weight")).shape[0]


@pytest.fixture(scope="module")
def compiled_optimizers() -> None:
    """DeepSpeed's optimizer ops compiled once, here, before any rank loads them."""
    from deepspeed.accelerator import get_accelerator

    for builder in ("FusedAdamBuilder", "CPUAdamBuilder"):
        get_accelerator().create_op_builder(builder).load()


@pytest.mark.parametrize("case", sorted(CASES))
def test_deepspeed_initialize_runs_the_plan(case, plans, readbacks):
    if (why := refused_here(case)) is not None:
        pytest.skip(why)
    config, precision = CASES[case]
    _, model, plan = plans[case]
    whole_q = plan_q_rows(model)
    rows = readbacks[case]
    assert len(rows) == 2 and all(isinstance(r, dict) for r in rows), "\n".join(map(str, rows))
    for got in rows:
        assert got["zero"] == config.zero
        # DeepSpeed counts a tp group's identical micro-batches apart (the export's README)
        assert (got["train_batch_size"], got["micro_batch"], got["accumulation"], got["dp"]) \
            == (counted_batch(plan), config.micro_batch, plan.estimate.num_microbatches,
                config.dp)
        assert got["q_proj_rows"] == whole_q // config.tp  # AutoTP split the heads by tp
        assert (got["bf16"], got["fp16"]) == (precision == "bf16", precision == "fp16")
        assert got["param_dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[precision]
        assert got["reduce_dtype"] == "float32"  # as autopar's engine reduces
        assert got["offload"] is config.offload
        assert (got["optimizer"] == "DeepSpeedCPUAdam") is config.offload
        assert got["steps"] == 1 and got["losses_finite"]
        assert got["stages"] == config.pp
        if config.pp > 1:  # a full recompute is DeepSpeed's interval of one layer
            assert got["checkpoint_interval"] == (1 if config.checkpoint == "full" else 0)
