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

from pathlib import Path

from launching import resume_a_from_b, train_then_resume

from autopar import ParallelConfig, TrainSpec
from autopar.core.model_spec import ModelSpec

NANOGPT = ModelSpec.parse(f"{Path(__file__).resolve().parents[1] / 'data' / 'nanogpt.py'}:make")
TRAIN = TrainSpec(global_batch=4, seq_len=32, precision="fp32")
PLAN_A = ParallelConfig(tp=2, dp=2, zero=3, micro_batch=1)
PLAN_B = ParallelConfig(dp=4, zero=3, micro_batch=1)
LOSS_REL = 1e-5


def test_generic_tp_plan_trains_and_resumes_under_zero3_with_the_same_losses(tmp_path):
    run = train_then_resume(tmp_path, NANOGPT, TRAIN, PLAN_A, PLAN_B, rel=LOSS_REL, save_b=True)
    # ...and back: B's step-4 checkpoint read into A's sectioned shards, on the reference's
    # losses for steps 5 and 6
    resume_a_from_b(tmp_path, NANOGPT, run, rel=LOSS_REL)


def test_a_tied_head_resumes_under_pipelining_from_a_plan_without(tmp_path):
    """nanogpt.py ties ``lm_head.weight`` to ``transformer.wte.weight``. Without pipelining the
    checkpoint holds the one weight and its optimizer state under the embedding's name; under
    pp 2 the last stage holds the head's copy under its own name, which the checkpoint lacks
    (before: "Missing key in checkpoint state_dict: optim.state.lm_head.weight.step"). train.py
    reads it by the name the checkpoint holds (``Checkpointer._read_tied_from_aliases``)."""
    train_then_resume(tmp_path, NANOGPT, TRAIN, ParallelConfig(dp=4, zero=1, micro_batch=1),
                      ParallelConfig(dp=2, pp=2, zero=1, micro_batch=1, schedule="1f1b"),
                      rel=LOSS_REL)
