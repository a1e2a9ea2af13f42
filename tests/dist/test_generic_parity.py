"""A user's own decoder (``FILE.py:FACTORY``, the generic family) and transformers GPT-2 run
under dp 2 and pp 2 as the one-process reference does (``autopar.verify.run``: gloo on CPU).

Tolerance: ``autopar verify``'s own for fp32 plans (loss relative 1e-5, gradients 1e-3 of each
tensor's largest entry, parameters 1e-2 of lr x steps). Measured on this machine
(``autopar verify``, 3 steps): nanoGPT dp2 loss 6.3e-8, gradients 6.1e-7, parameters 6.3e-5;
pp2 loss 6.3e-8, gradients and parameters 0; GPT-2 dp2 loss 2.1e-8, gradients 7.6e-7,
parameters 3.8e-5; pp2 loss 6.4e-8, gradients 3.6e-7, parameters 4.0e-5 -- two to five orders
below the bounds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.core.model_spec import ModelSpec
from autopar.costmodel.cluster import process_cluster
from autopar.verify.run import verify

NANOGPT = Path(__file__).resolve().parents[1] / "data" / "nanogpt.py"
TRAIN = TrainSpec(global_batch=4, seq_len=32, precision="fp32")


def _verify(spec: ModelSpec, config: ParallelConfig):
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2), TRAIN, config,
                            model_spec=spec)
    result = verify(spec, plan, steps=2)
    assert result.passed, (result.loss, result.grads, result.params)
    return result


@pytest.mark.parametrize("config", [ParallelConfig(dp=2, micro_batch=1, zero=3),
                                    ParallelConfig(pp=2, micro_batch=1, checkpoint="full")],
                         ids=["dp2-zero3", "pp2-full"])
def test_a_file_decoder_matches_the_reference(config: ParallelConfig) -> None:
    _verify(ModelSpec.parse(f"{NANOGPT}:make"), config)


def test_a_file_decoder_without_a_chain_runs_dp2_whole() -> None:
    """Its forward adds the embedding to every block's output: pp = 1 only, which runs it
    whole, its blocks FSDP2 units and checkpointed."""
    _verify(ModelSpec.parse(f"{NANOGPT}:make_skip"),
            ParallelConfig(dp=2, micro_batch=1, checkpoint="full"))


def test_transformers_gpt2_pp2_matches_the_reference(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    transformers.GPT2Config(  # no dropout: the reference and the ranks draw other masks
        n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32, bos_token_id=0,
        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        architectures=["GPT2LMHeadModel"]).save_pretrained(tmp_path)
    _verify(ModelSpec.parse(str(tmp_path)), ParallelConfig(pp=2, micro_batch=1))
