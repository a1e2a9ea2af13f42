"""What newcomers to autopar ran outside the zoo and saw fail (issue 28), run again: each plan,
made with ``autopar.plan_for`` as ``autopar verify`` makes it from flags, runs on gloo CPU
processes and matches one process (``autopar.verify.run``; fp32 tolerances
``autopar.verify.run.TOLERANCES``: loss 1e-5 relative, gradients 1e-3 of each tensor's largest
entry, parameters 1e-2 of the optimizer's largest move, 2 steps). Measured on this machine for
these cases (2026-11-27): loss <= 4.3e-8 relative, gradients <= 6.7e-6 of the tensor max,
parameters <= 5.8e-4 of the move -- orders of magnitude inside the tolerances, which each
failure below exceeded or never reached:

* ``qwen3-tp2``: Qwen3's per-head ``q_norm``/``k_norm`` between q_proj's column split and
  o_proj's row split ran nowhere ("report this plan": the module folded as ``mixed``); they
  run on the rank's heads (``WidthParallel``), their weights' gradients summed over tp.
* ``mixtral-jitter-dp2``: a router with jitter noise, random per rank, failed the comparison;
  verify turns it off on both sides as it does dropout.
* ``qwen2-moe-no-shared-expert``: ``shared_expert_intermediate_size: 0`` crashed materialize
  and FSDP2's reduce-scatter on the zero-size weights.
* ``llama-style-tp2-pp2-sp`` / ``-cp2``: a hand-written decoder's RoPE read
  ``inv_freq.device``, baked in as the trace's meta device (every plan crashed in the ranks);
  under cp its ``inv_freq`` was refused as a position table. Its final norm, written inline in
  the forward with a parameter of the model root, ran on each rank's sequence shard under
  sequence parallelism, its gradient that shard's part only (gradients 0.78 of the tensor max
  off), and every pipeline stage held that parameter, the first stage's copy never trained
  (parameters 1.1 of the move off under pp 2): the finish now runs on the whole sequence
  (``GatherBlockOutput``) and the root's parameters are held by the stages that read them.
* ``positions-style-pp2``: blocks named ``self.blocks`` and a position table named
  ``self.positions`` collided with the pipeline stage's own names.
"""

from __future__ import annotations

import pytest

from autopar.verify import decoders as verify_decoders
from autopar.models.training import ModelSpec
from autopar.verify.run import verify

from plans import process_plan

DECODERS = verify_decoders.__file__
_SHAPE = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "max_position_embeddings": 64}

CASES = {
    "qwen3-tp2": (ModelSpec.transformers_config("Qwen3ForCausalLM", {
        **_SHAPE, "head_dim": 16}), dict(dp=2, tp=2, micro_batch=1), 4),
    "mixtral-jitter-dp2": (ModelSpec.transformers_config("MixtralForCausalLM", {
        **_SHAPE, "num_local_experts": 4, "num_experts_per_tok": 2,
        "router_jitter_noise": 0.1}), dict(dp=2, micro_batch=1), 4),
    "qwen2-moe-no-shared-expert": (ModelSpec.transformers_config("Qwen2MoeForCausalLM", {
        **_SHAPE, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 0}), dict(dp=2, tp=2, zero=3, micro_batch=1), 4),
    "llama-style-tp2-pp2-sp": (ModelSpec.parse(f"{DECODERS}:make_llama"),
                               dict(tp=2, pp=2, sequence_parallel=True, micro_batch=1), 4),
    "llama-style-cp2": (ModelSpec.parse(f"{DECODERS}:make_llama"), dict(cp=2, micro_batch=1),
                        2),
    "positions-style-pp2": (ModelSpec.parse(f"{DECODERS}:make_positions"),
                            dict(pp=2, micro_batch=1), 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_what_newcomers_saw_fail_runs_and_matches_one_process(case):
    spec, fields, batch = CASES[case]
    result = verify(spec, process_plan(spec, fields, batch), steps=2)
    assert result.passed, result.table()
