"""FP8 plans (``precision="fp8"``, torchao's float8 training of the blocks' linears) against the
one-process reference that runs the same linears in FP8 (``autopar/verify/reference.py``).

Tolerance: ``autopar/verify/measures.py``'s low-precision measure -- each quantity's error from
the fp32 answer over the larger error of two one-process fp8 runs -- within 8. Measured
(2026-11-27, gloo on 2 CPUs, 3 steps; loss / gradients / parameters, in times the one-process
fp8 error), beside each case below. A swapped tp shard measures far above (the last test).
"""

from __future__ import annotations

import pytest

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import process_cluster
from autopar.models.training import ModelSpec
from autopar.verify.run import verify
from plans import process_plan
from test_parity import WRONG_SHARD

pytest.importorskip("torchao.float8", reason="fp8 runs on torchao's float8 training")

LLAMA = ModelSpec("tiny-llama")
MOE = ModelSpec("tiny-moe")

CASES = {
    # the command: autopar verify --model tiny-llama --dp 2 --tp 2 --precision fp8
    "dp2xtp2": (LLAMA, dict(dp=2, tp=2, micro_batch=1), 4, "tensorwise"),
    "tp2-sp": (LLAMA, dict(tp=2, sequence_parallel=True, micro_batch=2), 4, "tensorwise"),
    "pp2": (LLAMA, dict(pp=2, micro_batch=1), 4, "tensorwise"),
    # FSDP all-gathers the FP8 linears' weights in FP8 (as bytes on gloo: BytesAllGather)
    "zero3-fp8-all-gather": (LLAMA, dict(dp=2, zero=3, micro_batch=1), 4, "tensorwise"),
    "zero3-rowwise": (LLAMA, dict(dp=2, zero=3, micro_batch=1), 4, "rowwise"),
    "dp2xtp2-moe-ep2": (MOE, dict(dp=2, tp=2, ep=2, micro_batch=1), 4, "tensorwise"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_program_matches_its_one_process_reference(case):
    spec, fields, batch, recipe = CASES[case]
    plan = process_plan(spec, fields, batch, precision="fp8", fp8_recipe=recipe)
    result = verify(spec, plan, steps=3)
    assert result.passed, result.table()




def test_a_wrong_shard_is_caught_in_fp8(tmp_path):
    """The swapped up_proj shard of ``test_parity.py``'s fp32/bf16 case, in fp8: verify fails
    it, in the MLP that holds it. FP8's own error is larger than bf16's, so the margin is
    smaller: measured 15.3 on the gradients (down_proj) and 67.5 on the parameters (up_proj),
    against bf16's 51 on the gradients."""
    (tmp_path / "wrong.py").write_text(WRONG_SHARD)
    spec = ModelSpec.parse(f"{tmp_path / 'wrong.py'}:make")
    train = TrainSpec(global_batch=4, seq_len=32, precision="fp8")
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2), train,
                            ParallelConfig(tp=2, micro_batch=2), model_spec=spec)
    result = verify(None, plan, steps=3)
    assert not result.passed, result.table()
    assert result.grads.measure > result.tolerance.grads, result.table()
    assert result.params.measure > 3 * result.tolerance.params, result.table()
    assert result.grads.where.startswith(("layers.0.mlp", "layers.0.ffn_norm")), result.table()
