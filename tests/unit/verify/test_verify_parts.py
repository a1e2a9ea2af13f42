"""The parts of ``autopar verify`` and the execution plan that need no process group."""

from __future__ import annotations

import json

import pytest
import torch

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.cli.main import main
from autopar.analysis.module_strategies import LOSS
from autopar.costmodel.cluster import process_cluster
from autopar.verify.run import TOLERANCES, Diff, VerifyResult, compare


def _plan(name: str, **fields):
    config = ParallelConfig(**fields)
    train = TrainSpec(global_batch=4, seq_len=32, precision="fp32")
    return autopar.plan_for(autopar.models.build(name, device="meta"),
                            process_cluster(config.world_size), train, config, name=name)


def test_compare_is_relative_to_each_tensors_largest_entry():
    ref = {"a": torch.tensor([1.0, -4.0]), "b": torch.tensor([1e-3, 0.0])}
    got = {"a": torch.tensor([1.0, -3.6]), "b": torch.tensor([1e-3, 1e-4])}
    d = compare(got, ref)
    assert d.where == "a" and d.measure == pytest.approx(0.1) and d.max_abs == pytest.approx(0.4)
    moves = compare(got, ref, unit=0.01)
    assert moves.measure == pytest.approx(40.0)


def test_an_overflowing_low_precision_reference_bounds_nothing_and_an_overflowing_program_fails():
    # found by the property run: a GraniteMoE fp16 case whose resampled one-process reference
    # overflowed in the last step (its scaler skips it) measured NaN on the embedding's
    # gradient, the first tensor, which no later tensor could beat: a false failure
    from autopar.verify.measures import compare_to_precision

    exact = {"emb": torch.tensor([1.0, 2.0]), "w": torch.tensor([3.0, 4.0])}
    low = {"emb": torch.tensor([1.001, 2.0]), "w": torch.tensor([3.0, 4.004])}
    overflowed = {"emb": torch.tensor([float("nan"), float("inf")]), "w": low["w"]}
    got = {"emb": torch.tensor([1.002, 2.0]), "w": torch.tensor([3.0, 4.002])}
    floor = dict.fromkeys(exact, 1e-6)
    d = compare_to_precision(got, [low, overflowed], exact, floor)
    assert d.measure == pytest.approx(0.5, rel=1e-3) and d.where == "w"   # was NaN at emb
    broken = {**got, "w": torch.tensor([3.0, float("nan")])}
    d = compare_to_precision(broken, [low, low], exact, floor)
    assert d.measure == float("inf") and d.where == "w"


def test_a_result_beyond_one_tolerance_fails():
    plan = _plan("tiny-llama", tp=2, micro_batch=2)
    tol = TOLERANCES[plan.train.precision]
    ok = Diff(0.0, 0.0, "-")
    result = VerifyResult(plan, "tiny-llama", 2, 1, [1.0], [1.0], ok, ok, ok, tol, 0.1)
    assert result.passed
    result.grads = Diff(1.0, 2 * tol.grads, "layers.0.attn.q_proj.weight")
    assert not result.passed and "NO" in result.table()
    result.grads, result.missing = ok, ["head.weight"]
    assert not result.passed


def test_split_weights_give_megatron_styles_with_sequence_parallel_norms():
    styles = dict(_plan("tiny-llama", tp=2, sequence_parallel=True).module_strategies)
    assert [styles[f"layers.*.attn.{p}_proj"] for p in "qkvo"] == ["column"] * 3 + ["row"]
    assert [styles[f"layers.*.mlp.{p}_proj"] for p in ("gate", "up", "down")] == \
        ["column", "column", "row"]
    assert styles["layers.*.attn_norm"] == styles["norm_f"] == "sequence"
    assert styles["head"] == "column" and LOSS in styles


def test_a_tied_embedding_follows_the_heads_vocabulary_split():
    styles = dict(_plan("tiny-gpt", tp=2).module_strategies)
    assert styles["head"] == "column" and styles["tok_emb"] == "vocab"


def test_report_says_what_runs():
    text = _plan("tiny-llama", dp=2, tp=2, zero=3).report()
    assert "What runs" in text and "ZeRO-3" in text and "fully_shard" in text
    assert "ColwiseParallel" in text


@pytest.mark.parametrize("argv, message", [
    (["--plan", "missing.json"], "cannot read"),
    (["--plan", "PLAN", "--tp", "2"], "both --plan and plan flags"),
    (["--tp", "2", "--nproc", "3"], "not a multiple"),
    (["--dp", "2", "--tp", "2", "--nproc", "2"], "--nproc 2 but"),
    (["--cp", "3"], "2*cp = 6"),  # tiny-llama's 32 tokens do not cut into 6 chunks
])
def test_verify_errors_exit_2(tmp_path, capsys, argv, message):
    plan = tmp_path / "plan.json"
    plan.write_text(_plan("tiny-llama", tp=2).to_json())
    argv = [str(plan) if a == "PLAN" else a for a in argv]
    assert main(["verify", "--model", "tiny-llama", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_verify_on_cuda_without_a_gpu_is_refused_before_any_process_starts(tmp_path):
    from autopar.core.errors import AutoparError
    from autopar.verify.run import verify

    with pytest.raises(AutoparError, match="one rank on CUDA needs a GPU; this machine has no"):
        verify(None, _plan("tiny-llama", dp=1), device="cuda", folder=tmp_path)
    assert not any(tmp_path.iterdir())  # no job written, no rank started
    with pytest.raises(AutoparError, match="unknown device 'tpu'"):
        verify(None, _plan("tiny-llama", dp=1), device="tpu")


def test_plan_json_keeps_module_strategies():
    plan = _plan("tiny-llama", tp=2)
    again = autopar.Plan.from_json(plan.to_json())
    assert again.module_strategies == plan.module_strategies
    assert json.loads(plan.to_json())["module_strategies"]
