"""Fusion-aware costing: what the fused kernels cost in time and memory, and what the search does
with the memory they save.

The bytes each fused kernel keeps are held against the executed program in
``test_saved_activations.py``; here, the consequences: Llama 3 8B on one H100 node keeps less
with the fusions (the loss above all: eager PyTorch keeps the fp32 log-probabilities of every
logit and holds their gradient and the logits' while the loss runs its backward, 12 bytes per
logit at the peak; the fused loss keeps a gradient of the hidden state and one of the head's
weight), the time model keeps the head's GEMM FLOPs, and a search that was memory-bound spends
the saving on less recomputation.
"""

from __future__ import annotations

import pytest

import autopar
from autopar import AutoparError, ClusterSpec, ParallelConfig, TrainSpec
from autopar.core.specs import Checkpoint
from autopar.analysis.admissibility import ModelFacts
from autopar.search.space import outer_candidates

LLAMA_FUSIONS = ("rms_norm", "swiglu", "rope", "linear_cross_entropy")
SEQ, VOCAB = 8192, 128256


@pytest.fixture(scope="module")
def llama3_8b() -> tuple[autopar.GraphIR, TrainSpec]:
    train = TrainSpec(global_batch=64, seq_len=SEQ, precision="bf16")
    return autopar.trace(autopar.models.build("llama3-8b", device="meta"), train), train


@pytest.mark.parametrize("policy", [Checkpoint.NONE, Checkpoint.MATMULS, Checkpoint.FULL])
def test_fusions_cut_llama3_8b_activation_memory_on_8_h100(llama3_8b, policy: Checkpoint) -> None:
    # dp 8, ZeRO-3, micro-batch 1 (GiB of activations / peak, step seconds):
    #   none       eager 52.90 / 69.86, 7.467 s   fused 35.20 / 52.16, 7.107 s
    #   selective  eager 36.90 / 53.86, 7.758 s   fused 26.62 / 43.58, 7.272 s
    #   full       eager 13.87 / 30.83, 9.739 s   fused  4.10 / 21.07, 9.253 s
    # The loss is most of it: 4 bytes per logit kept and 8 more held during its backward
    # (12.6 GB at 8192 x 128256 logits) against 1.2 GB for the fused loss (its grad_weight,
    # vocab x hidden, and grad_hidden); then silu(gate) and the norms' rstd in every block.
    graph, train = llama3_8b
    cluster = ClusterSpec.preset("hgx-h100-80g")
    eager, fused = (autopar.estimate(graph, cluster, train, ParallelConfig(
        dp=8, zero=3, micro_batch=1, checkpoint=policy, fusions=f)) for f in ((), LLAMA_FUSIONS))
    saving = eager.memory_breakdown["activations"] - fused.memory_breakdown["activations"]
    assert saving >= 4 * SEQ * VOCAB  # at least the fp32 log-probabilities the fused loss drops
    assert fused.peak_memory_bytes < eager.peak_memory_bytes
    assert fused.step_time_s < eager.step_time_s


def test_fused_loss_keeps_the_head_gemm_flops_and_reads_the_logits_three_times(llama3_8b) -> None:
    graph, train = llama3_8b
    eager = autopar.workload_of(graph, train)
    fused = autopar.workload_of(graph, train, ("linear_cross_entropy",))
    assert fused.post.matmul_flop == eager.post.matmul_flop > 0
    (loss,) = [o for o in fused.post.ops if o.op == "linear_cross_entropy"]
    assert loss.bytes == 3 * SEQ * VOCAB * 2  # read twice, gradient written once, bf16
    hidden = 4096
    assert loss.backward_bytes == 2 * 2 * (SEQ * hidden + VOCAB * hidden)  # scale both grads


def test_fused_rope_reads_its_input_once(llama3_8b) -> None:
    # the chain's ops read q's halves and q itself; the kernel reads q once and writes it once,
    # plus the cos and sin tables
    graph, train = llama3_8b
    fused = autopar.workload_of(graph, train, ("rope",))
    rope = [o for o in fused.block.ops if o.op == "rope"]
    q_bytes = SEQ * 4096 * 2
    assert len(rope) == 2  # q and k
    assert 2 * q_bytes <= rope[0].bytes < 2.1 * q_bytes


def test_fused_loss_is_refused_with_tensor_parallelism() -> None:
    with pytest.raises(AutoparError, match="linear_cross_entropy") as err:
        ParallelConfig(dp=1, tp=8, fusions=LLAMA_FUSIONS)
    assert err.value.where == "fusions"
    ParallelConfig(dp=1, tp=8, fusions=LLAMA_FUSIONS[:3])  # the other kernels run on shards


def test_search_with_the_fused_loss_enumerates_tp1_only() -> None:
    shape = ModelFacts(num_blocks=32, num_heads=32, num_kv_heads=8)
    train = TrainSpec(global_batch=64, seq_len=SEQ)
    with_loss = list(outer_candidates(8, shape, train, {"fusions": LLAMA_FUSIONS}))
    without = list(outer_candidates(8, shape, train, {"fusions": LLAMA_FUSIONS[:3]}))
    assert with_loss and {c.tp for c in with_loss} == {1}
    assert {c.tp for c in without} == {1, 2, 4, 8}


def test_search_spends_the_fusion_saving_on_less_recomputation() -> None:
    # Llama 3 8B on 8 A100-40GB at 8192 tokens, no tensor parallelism: without fusions the
    # activations only fit with recomputation (dp4 cp2 zero3 mb1, full on one block and
    # selective on 31, 23.87 s); with them without (dp4 cp2 zero3 mb1 none, 22.28 s). (At 4096
    # tokens, since the memory model holds FSDP2's states as the dry run measures them, both fit
    # without recomputation.)
    model = autopar.models.build("llama3-8b", device="meta")
    cluster = ClusterSpec.preset("dgx-a100-40g")
    train = TrainSpec(global_batch=64, seq_len=8192, precision="bf16")
    eager, fused = (autopar.optimize(model, cluster, train, {"tp": 1, **extra}).estimate
                    for extra in ({}, {"fusions": LLAMA_FUSIONS}))
    assert eager.time_breakdown["recompute"] > 0
    spent = (fused.time_breakdown["recompute"] < eager.time_breakdown["recompute"]
             or fused.config.micro_batch > eager.config.micro_batch)
    assert spent, (eager.summary(), fused.summary())
    assert fused.step_time_s < eager.step_time_s
