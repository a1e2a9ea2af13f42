"""The cost model against published mixture-of-experts runs (``tests/data/moe_runs.json``; the
table: ``bench/validate_moe.py``, ``bench/results/moe.md``).

Every bf16 run is priced as it ran (``autopar/measure/moe_validation.py``), nothing fitted per
run. The checks fail when the model drifts: the mean error over the runs used for validation
stays at or below what was measured when it was last changed, each run stays within its band,
the published pairs keep their order, and the runs predicted to fit keep fitting. A run the
model misses is an expected failure that states the measured error and the cause, found or not.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.measure.moe_validation import (ENGINE_KERNELS, MoERunCheck, check_moe_run,
                                            engine_of, load_runs, run_config,
                                            used_for_validation)

RUNS = Path(__file__).resolve().parents[2] / "data" / "moe_runs.json"
ALL = load_runs(RUNS)
BY_ID = {r["id"]: r for r in ALL}
USED = [r for r in ALL if used_for_validation(r)]

MEAN_ERROR = 0.135
"""Mean |error| over ``USED`` measured on 2026-11-28 (x86_64, torch 2.13: 0.1342 over all 21
with DeepSeek-V3's stages cut as its stated layout cuts them, ``train.pipeline_layout``: that
run +10.9 %, was +34.2 % with 8 blocks and the 3 dense layers on the first rank; 0.1452 with
the runs' gradient dtype priced, ``moe_validation.grad_dtype_of``, and the engine's fp32
gradient reduction priced at 4 bytes, was 2; 0.1454 before, 0.145 over all 21
with the engines' fused norms and activations priced, ``moe_validation.ENGINE_KERNELS``; 0.148,
from 0.179 before FSDP's gathers were priced as the engine runs them and the runs' pipeline
stages cut as Megatron cuts them, evenly; the GB200 NVL72 run at -11.0 % and the pp32 x 3
chunks one at -26.7 % among them); the issue's target is 0.10."""
BAND = 0.16
"""A run the model prices well stays within this of its published step time."""

MISSES = {
    "q235b-h100-deepep-ep8-fsdp": "+22 % (+71 % before 2026-11-28, when a recomputed block "
    "was priced a third all-gather and the recomputation hid none): FSDP2's two gathers and "
    "one reduce-scatter per unit and micro-batch, 28 G expert parameters per rank over 32 "
    "expert ranks one per node, 3.7 s of them exposed; how Megatron-FSDP schedules them "
    "under gradient accumulation is not found in a source",
    "q235b-h100-deepep-ep8-tp4-pp8": "-39 %: the run is 47 % slower than the tp2 x ep32 one; "
    "the cost model has tp4 x ep8 faster (its all-to-alls inside a node); the cause is not "
    "found (the source's recompute column is blank)",
    "q30b-h100-card-natural-routing": "-29 %: natural routing in the first 100 steps; the "
    "busiest rank's load is far above the default imbalance 1.1 (the forced-balance run of "
    "the same recipe takes 24.7 s, this one 30.3 s)",
    "gptoss120b-h100-64-bf16-2604.01": "-35 % (-43 % with the stages balanced by cost; "
    "Megatron split the 36 layers 9 a stage, the head and its 201k-word loss on the last): the "
    "run is at 16 % MFU; its attention with sinks runs in Megatron's unfused path (not found "
    "in a source), priced fused here",
    "gptoss120b-h100-64-bf16-2511": "-28 %: as the other GPT-OSS run (and its micro-batch of "
    "4 is unsure: the source's config says 1)",
    "q235b-h100-a2a-ep8-pp32": "-27 %: 94 layers in 32 x 3 chunks, the embedding and the loss "
    "a chunk each; priced at 17.7 s (compute 14.2, ep 1.5, pp 1.4), published 24.2 s; the "
    "cause is not found",
}
"""Runs outside ``BAND``, with the measured error and what is known of the cause; a run that
comes within it fails its test until it is taken off (q30b-h100-hybridep-noovl, -15.5 %, was
listed at -16 % until 2026-11-28)."""

REFUSED: dict[str, str] = {}
"""Runs autopar cannot express, with the reason (none since the embedding and the loss may
each be a chunk of their own: ``core.stages.chunk_sizes``)."""

NOT_FITTING = {
    "q235b-h100-longctx-128k": "72.9 of 72.2 GiB (83.9 before 2026-11-28, when the moe policy "
    "kept the column-parallel inputs whole under SP; the 16k, 32k and 64k runs now fit): the "
    "whole sequence's K/V that autopar's context parallelism all-gathers and keeps "
    "(passes/context_parallel.py), where Megatron's ring attention keeps its own chunk's, and "
    "the norms' recomputation (the run's --recompute-modules layernorm) autopar does not run",
    "q30b-h100-a2a-noovl": "74.5 of 72.2 GiB: without the fused permutation the zoo's "
    "dropless layer keeps more than Megatron's unfused one",
    "q30b-h100-a2a-ovl": "as the run without overlap",
    "dsv3-h100-1024-bf16": "117.7 GiB on the first rank (149.9 before its bf16 main "
    "gradients were priced, TrainSpec.grad_dtype, and its layout, 140.4 after the gradients): "
    "the run recomputes mla_up_proj and mlp and keeps bf16 Adam moments (the precision-aware "
    "optimizer), priced without either; autopar's first stage runs all 3 dense layers, where "
    "the layout puts 2 of them on the second rank",
    "gptoss120b-h100-64-bf16-2511": "micro-batch 4 as printed (the config says 1)",
}
"""Runs predicted not to fit, with the predicted peak and what is known of the cause (the
Moonlight card run fits since its bf16 main gradients are priced: 66.4 GiB, was 72.7)."""


@pytest.fixture(scope="module")
def checks() -> dict[str, MoERunCheck]:
    graphs: dict = {}
    return {r["id"]: check_moe_run(r, graphs=graphs) for r in ALL}


def test_the_data_has_what_the_issue_asks_for() -> None:
    models = {r["model"]["name"] for r in USED}
    assert len(USED) >= 8 and len(models) >= 3
    assert any(r["model"].get("num_shared_experts") for r in USED)  # DeepSeek-style
    assert any(r["model"]["num_experts"] >= 64 for r in USED)
    assert all(r["source"]["url"] and r["source"]["quote"] for r in ALL)


@pytest.mark.parametrize("run_id", [r["id"] for r in ALL])
def test_every_run_is_expressible(run_id: str, checks) -> None:
    if run_id in REFUSED:
        pytest.xfail(REFUSED[run_id])
    assert not checks[run_id].refused, checks[run_id].refused


@pytest.mark.parametrize("run_id", [r["id"] for r in USED])
def test_run_within_its_band(run_id: str, checks) -> None:
    if run_id in REFUSED:
        pytest.xfail(REFUSED[run_id])
    within = abs(checks[run_id].error) <= BAND
    if run_id in MISSES:
        assert not within, f"{run_id} is within the band now: take it off MISSES"
        pytest.xfail(MISSES[run_id])
    assert within, checks[run_id].error


def test_mean_error_does_not_drift(checks) -> None:
    errors = [abs(checks[r["id"]].error) for r in USED if checks[r["id"]].error is not None]
    assert sum(errors) / len(errors) <= MEAN_ERROR


@pytest.mark.parametrize("run_id", [r["id"] for r in ALL])
def test_run_fits(run_id: str, checks) -> None:
    if run_id in REFUSED:
        pytest.xfail(REFUSED[run_id])
    fits = checks[run_id].fits
    if run_id in NOT_FITTING:
        assert not fits, f"{run_id} fits now: take it off NOT_FITTING"
        pytest.xfail(NOT_FITTING[run_id])
    assert fits, (checks[run_id].peak_gib, checks[run_id].usable_gib)


@pytest.mark.parametrize("slow, fast", [
    ("q30b-h100-a2a-noovl", "q30b-h100-a2a-ovl"),
    ("q30b-h100-hybridep-noovl", "q30b-h100-hybridep-ovl"),
    ("q235b-h100-deepep-ep32-pp8-noovl", "q235b-h100-deepep-ep32-pp8-ovl"),
    # the dispatcher: the same recipe with the all-to-all and with HybridEP
    ("q30b-h100-a2a-noovl", "q30b-h100-hybridep-noovl"),
])
def test_published_pairs_keep_their_order(slow: str, fast: str, checks) -> None:
    assert BY_ID[slow]["measured"]["step_time_s_derived"] > \
        BY_ID[fast]["measured"]["step_time_s_derived"]
    assert checks[slow].predicted_s > checks[fast].predicted_s


def test_ep_sizes_of_one_model_keep_their_order(checks) -> None:
    """Qwen3-235B on 256 H100 at ep 32 (tp 2) and ep 8 (tp 4): the run at ep 8 is slower."""
    pytest.xfail(MISSES["q235b-h100-deepep-ep8-tp4-pp8"])


def test_runs_are_priced_with_the_kernels_their_engine_fused() -> None:
    """Transformer Engine's runs and compiled torchtitan runs get the fused norm and activation
    (``ENGINE_KERNELS``); an eager torchtitan run keeps the eager ops. The kernels save less for
    backward than the eager ops: the same dense run priced eager peaks higher."""
    fp8_runs = {r["id"]: r for r in load_runs(RUNS.parent / "fp8_runs.json", None)}
    megatron = fp8_runs["llama31-8b-h100-8-bf16-dgxc2409"]
    titan = fp8_runs["llama3-8b-h100-8-bf16-torchao"]
    assert engine_of(BY_ID["q235b-h100-longctx-16k"]) == (False, False)  # Megatron-Core
    assert set(ENGINE_KERNELS) <= set(run_config(megatron).fusions)
    assert set(ENGINE_KERNELS) <= set(run_config(titan).fusions)  # under torch.compile
    eager = {**megatron, "source": titan["source"],
             "train": {**megatron["train"], "other": "torchtitan, eager"}}
    assert engine_of(eager) == (True, False)  # torchtitan, not compiled
    assert not set(ENGINE_KERNELS) & set(run_config(eager).fusions)
    fused, plain = check_moe_run(megatron), check_moe_run(eager)
    assert fused.peak_gib is not None and plain.peak_gib is not None
    assert fused.peak_gib < plain.peak_gib - 1.0
