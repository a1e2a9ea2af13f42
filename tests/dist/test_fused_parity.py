"""``autopar verify`` with the fused kernels on (``ParallelConfig.fusions``).

The sharded program runs the Triton kernels (in the CPU interpreter here) and the reference the
plain, unfused model, so these compare the kernels and the fusion pass as well as the sharding,
within the same fp32 tolerances as tests/dist/test_parity.py (``autopar.verify.run.TOLERANCES``).
The cases cover the ways a kernel gets its inputs: plain tensors under data parallelism (ZeRO-3,
where the fused head's weight is read after the stage's forward), local shards in attention and
the MLP under tensor parallelism, and DTensor sequence shards in the norms under sequence
parallelism (the sharding rules of ``passes/fuse.py``); and the fused loss at the end of a
pipeline.
"""

from __future__ import annotations

import pytest

from autopar import kernels
from autopar.models.training import ModelSpec
from autopar.verify.run import verify
from plans import process_plan

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason="the kernels need CUDA or TRITON_INTERPRET=1")

LLAMA = ModelSpec("tiny-llama")
GPT = ModelSpec("tiny-gpt")
LLAMA_ALL = ("rms_norm", "swiglu", "rope", "linear_cross_entropy")
LLAMA_TP = ("rms_norm", "swiglu", "rope")  # linear_cross_entropy is refused for tp > 1

CASES = {
    "llama-dp2-zero3": (LLAMA, dict(dp=2, zero=3, micro_batch=1, fusions=LLAMA_ALL), 4),
    "llama-tp2-sp": (LLAMA, dict(tp=2, sequence_parallel=True, micro_batch=2,
                                 fusions=LLAMA_TP), 2),
    "gpt-tp2-sp": (GPT, dict(tp=2, sequence_parallel=True, micro_batch=2,
                             fusions=("layer_norm", "gelu")), 2),
    "gpt-pp2-tied": (GPT, dict(pp=2, micro_batch=1, fusions=("layer_norm", "gelu",
                                                              "linear_cross_entropy")), 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_program_matches_the_unfused_model(case):
    spec, fields, batch = CASES[case]
    plan = process_plan(spec, fields, batch)
    assert plan.config.fusions == fields["fusions"]  # the plan lists the fusions applied
    result = verify(spec, plan, steps=2)
    assert result.passed, result.table()
