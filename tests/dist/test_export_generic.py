"""An exported tensor-parallel plan of a user's own decoder (``FILE.py:FACTORY``, the generic
family: tests/data/nanogpt.py) trains under ``bash launch.sh`` (torchrun, 4 gloo processes on
the CPU) on the one-process reference's losses, its checkpoint resumes under a plan without
tensor parallelism, and that plan's checkpoint resumes under the first again.

Plan A is tp 2 x dp 2 with ZeRO-3: the fused ``c_attn`` weight is a DTensor
``_StridedShard(0, split_factor=3)`` over tp (q, k and v each split) and FSDP2 shards it along
dim 1 (``data_parallel.dp_placement``), so the checkpoint holds it in two nested layouts. Plan
B is dp 2 x pp 2 with 1F1B and no tp. If the saved global tensor were permuted (FSDP2's default
dim-0 shard over the strided one was), B's resumed losses would leave A's. Tolerance: fp32, the
plans reduce in different orders (``test_export.py`` explains the bound).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from launching import events, launch, losses_of

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.core.model_spec import ModelSpec
from autopar.costmodel.cluster import process_cluster
from autopar.verify import reference

NANOGPT = ModelSpec.parse(f"{Path(__file__).resolve().parents[1] / 'data' / 'nanogpt.py'}:make")
TRAIN = TrainSpec(global_batch=4, seq_len=32, precision="fp32")
PLAN_A = ParallelConfig(tp=2, dp=2, zero=3, micro_batch=1)
PLAN_B = ParallelConfig(dp=4, zero=3, micro_batch=1)
LOSS_REL = 1e-5


def test_generic_tp_plan_trains_and_resumes_under_zero3_with_the_same_losses(tmp_path):
    model = NANOGPT.build("meta")
    plans = {k: autopar.plan_for(model, process_cluster(4), TRAIN, c, name=NANOGPT.label)
             for k, c in (("a", PLAN_A), ("b", PLAN_B))}
    folders = {k: p.export(tmp_path / k, NANOGPT) for k, p in plans.items()}
    log_a, log_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    wall_a, out_a = launch(folders["a"], "--steps", "4", "--save-every", "2",
                           "--checkpoint-dir", str(tmp_path / "ckpt-a"), "--log-file", str(log_a))
    print(f"plan A (tp2 x dp2 ZeRO-3) run: {wall_a:.1f} s")
    losses_a = losses_of(log_a)
    assert sorted(losses_a) == [1, 2, 3, 4], out_a
    expected = reference(NANOGPT, plans["a"], steps=4, seed=0).losses
    for step, ref in enumerate(expected, 1):
        assert losses_a[step] == pytest.approx(ref, rel=LOSS_REL), (step, losses_a, expected)
    wall_b, out_b = launch(folders["b"], "--steps", "4", "--resume",
                           str(tmp_path / "ckpt-a" / "step-2"), "--save-every", "2",
                           "--checkpoint-dir", str(tmp_path / "ckpt-b"), "--log-file", str(log_b))
    print(f"plan B (dp4 ZeRO-3) resumed run: {wall_b:.1f} s")
    assert [r["step"] for r in events(log_b, "resume")] == [2], out_b
    losses_b = losses_of(log_b)
    assert sorted(losses_b) == [3, 4], out_b
    for step in (3, 4):
        assert math.isfinite(losses_b[step])
        assert losses_b[step] == pytest.approx(losses_a[step], rel=LOSS_REL), (losses_a, losses_b)
    # ...and back: B's step-4 checkpoint read into A's sectioned shards, on the reference's
    # losses for steps 5 and 6
    log_c = tmp_path / "c.jsonl"
    _, out_c = launch(folders["a"], "--steps", "6", "--resume", str(tmp_path / "ckpt-b" / "step-4"),
                      "--checkpoint-dir", str(tmp_path / "ckpt-c"), "--log-file", str(log_c))
    losses_c = losses_of(log_c)
    assert sorted(losses_c) == [5, 6], out_c
    longer = reference(NANOGPT, plans["a"], steps=6, seed=0).losses
    for step in (5, 6):
        assert losses_c[step] == pytest.approx(longer[step - 1], rel=LOSS_REL), (losses_c, longer)
