"""The moments of a stage's peak (costmodel/peak.py), term by term, as the dry run of the
emitted program shows FSDP2 holding them (bench/results/memory_grid.md)."""

from __future__ import annotations

import pytest

from autopar.core.specs import Optimizer, Precision
from autopar.costmodel.peak import StageActivations, StageParams, stage_peak

P = StageParams(whole=8e9, sharded=1e9, block=0.5e9, root=1e9, embedding_extra=3e9)
A = StageActivations(in_flight=2, kept=1e9, working=3e9)


def _peak(params=P, acts=A, *, zero=3, pipelined=False, m=4, embedding=True, loss=True,
          precision=Precision.BF16):
    return stage_peak(params, acts, precision, Optimizer.ADAMW, zero=zero,
                      pipelined=pipelined, microbatches=m, holds_embedding=embedding,
                      holds_loss=loss)


SMALL_ROOT = StageParams(whole=8e9, sharded=1e9, block=0.5e9, root=0.2e9, head=0.1e9)


def test_zero3_without_pipelining_peaks_at_the_loss_with_nothing_gathered() -> None:
    name, b = _peak(SMALL_ROOT, zero=3, m=4, embedding=False)
    assert name == "backward start"
    assert b["params"] == pytest.approx(P.sharded * 4)  # fp32 master shard only
    assert b["grads"] == pytest.approx(P.sharded * 4)  # earlier micro-batches, reduced
    assert b["optimizer"] == pytest.approx(P.sharded * 8)
    assert b["activations"] == pytest.approx(2 * 1e9 + 3e9)


def test_one_microbatch_has_no_gradients_at_the_loss() -> None:
    assert _peak(SMALL_ROOT, zero=3, m=1, embedding=False)[1]["grads"] == 0


def test_a_fused_loss_peaks_in_the_blocks_backward_with_the_root_gathered() -> None:
    # the fused loss's working set is small; the root unit, gathered for the head's backward,
    # and the head's whole gradient stay until the end of the backward
    params = StageParams(whole=8e9, sharded=1e9, block=0.5e9, root=1e9, head=0.5e9)
    acts = StageActivations(in_flight=1, kept=3e9, working=0.2e9, block_working=0.4e9)
    name, b = _peak(params, acts, zero=3, m=2, embedding=False)
    assert name == "blocks' backward"
    assert b["params"] == pytest.approx(1e9 * 4 + (1e9 + 0.5e9) * 2)
    assert b["grads"] == pytest.approx(1e9 * 4 + (0.5e9 + 0.5e9) * 2)
    assert b["activations"] == pytest.approx(3e9 + 0.4e9)


def test_zero3_under_pipelining_gathers_in_the_backward_not_before_it() -> None:
    # each unit is freed after the forward that ran just before the backward, and the
    # backward keeps what it gathers: nothing gathered at its start, everything by its end
    acts = StageActivations(in_flight=3, kept=0.1e9, working=0.2e9, block_working=0.2e9)
    _, start = _peak(acts=acts, zero=3, pipelined=True, embedding=False, loss=False)
    assert start["params"] == pytest.approx(P.sharded * 4 + P.whole * 2)
    b = stage_peak(P, acts, Precision.BF16, Optimizer.ADAMW, zero=3, pipelined=True,
                   microbatches=4, holds_embedding=False, holds_loss=True)
    assert b[0] == "blocks' backward"


def test_zero1_accumulates_whole_fp32_gradients_with_the_embedding_whole() -> None:
    _, b = _peak(zero=1, m=4, embedding=False)
    assert b["params"] == pytest.approx(P.sharded * 4 + P.whole * 2)  # gathered through
    assert b["grads"] == pytest.approx(P.whole * 4)
    # a first stage's accumulators hold the embedding's gradient whole over tp
    _, b = _peak(zero=1, m=4, loss=False)
    assert b["grads"] == pytest.approx((P.whole + P.embedding_extra) * 4 + P.block * 2)


def test_pipelining_keeps_every_zero_stage_gathered_and_accumulating() -> None:
    _, b = _peak(zero=3, pipelined=True, embedding=False, loss=False)
    assert b["params"] == pytest.approx(P.sharded * 4 + P.whole * 2)
    assert b["grads"] == pytest.approx(P.whole * 4 + P.block * 2)


def test_zero0_one_microbatch_peaks_at_the_embeddings_backward() -> None:
    acts = StageActivations(in_flight=1, kept=0.1e9, working=0.1e9)
    whole = StageParams(whole=8e9, sharded=8e9, block=0.5e9, root=2e9)
    name, b = _peak(whole, acts, zero=0, m=1, precision=Precision.FP32)
    assert name == "end of backward"
    assert b["params"] == pytest.approx(8e9 * 4 + 2e9 * 4)  # the root unit still gathered
    assert b["grads"] == pytest.approx(6e9 * 4 + 2e9 * 4)  # blocks reduced; the root's whole
    assert b["buffers"] == pytest.approx(0.5e9 * 4)  # the last reduce-scatter's input



def test_gpipe_never_holds_every_microbatch_beside_the_accumulators() -> None:
    # the accumulators appear with the first backward, which frees that micro-batch's
    # activations: a later backward holds m - 1 in flight (the dry run, 70b-pp2-gpipe-sel pp1)
    m, kept = 8, 1e9
    acts = StageActivations(in_flight=m, kept=kept, working=0.0)
    _, b = _peak(acts=acts, zero=0, pipelined=True, m=m, embedding=False, loss=True)
    accumulators = P.whole * 4
    assert b["grads"] >= accumulators  # the larger of the two: a later micro-batch's
    assert b["activations"] == pytest.approx((m - 1) * kept)
    # 1F1B refills what a backward frees: its steady count stays beside the accumulators
    steady = StageActivations(in_flight=2, kept=kept, working=0.0)
    _, b = _peak(acts=steady, zero=0, pipelined=True, m=m, embedding=False, loss=True)
    assert b["activations"] == pytest.approx(2 * kept)
    assert b["grads"] >= accumulators


def test_a_pipelined_last_stage_holds_the_logits_not_what_the_loss_kept_in_its_blocks_backward(
) -> None:
    # 70b-pp2-zero3 pp1's dry run, at its peak inside a block's backward (1F1B, one micro-batch
    # in flight): the loss's backward has freed the fp32 log-probabilities it saved; the
    # schedule's stage_backward still holds the stage's output, the logits
    acts = StageActivations(in_flight=1, kept=1.5e9, working=0.1e9, block_working=0.2e9,
                            loss_kept=1e9, loss_in_flight=1, stage_output=0.25e9)
    name, b = _peak(SMALL_ROOT, acts, zero=3, pipelined=True, m=8, embedding=False)
    assert name == "blocks' backward"
    assert b["activations"] == pytest.approx(0.5e9 + 0.25e9 + 0.2e9)


def test_gpipe_keeps_what_the_loss_kept_for_the_microbatches_whose_backward_is_still_to_come(
) -> None:
    acts = StageActivations(in_flight=4, kept=1.5e9, working=0.1e9, block_working=0.2e9,
                            loss_kept=1e9, loss_in_flight=4, stage_output=0.25e9)
    name, b = _peak(SMALL_ROOT, acts, zero=1, pipelined=True, m=4, embedding=False)
    # the second micro-batch's blocks' backward (beside the first's gradients): the two still
    # to come hold all they kept, the running one its blocks' activations and the logits
    assert name == "blocks' backward"
    assert b["activations"] == pytest.approx(2 * 1.5e9 + 0.5e9 + 0.25e9 + 0.2e9)


def test_without_pipelining_nothing_of_the_loss_is_held_in_the_blocks_backward() -> None:
    acts = StageActivations(in_flight=1, kept=1.5e9, working=0.1e9, block_working=0.2e9,
                            loss_kept=1e9, loss_in_flight=1)
    name, b = _peak(SMALL_ROOT, acts, zero=2, m=1, embedding=False)
    assert name == "blocks' backward"
    assert b["activations"] == pytest.approx(0.5e9 + 0.2e9)



def test_pipelined_end_of_backward_holds_the_roots_accumulator_beside_its_gradient() -> None:
    """The first micro-batch's embedding backward under pipelining: the others in flight, and
    the root unit's fp32 accumulator made at its post-backward while its bf16 gradient is
    alive (the dry run of ``70b-pp2-gpipe-sel``'s first rank: the whole table's gradient,
    2004 MiB, beside its 4008 MiB accumulator, ``bench/results/memory_grid.md``)."""
    params = StageParams(whole=8e9, sharded=1e9, block=0.1e9, root=2e9, embedding_extra=1e9)
    acts = StageActivations(in_flight=2, kept=3e9, working=0.0)
    name, b = _peak(params, acts, zero=1, pipelined=True, m=2, loss=False)
    assert name == "end of backward"
    roots = 2e9 + 1e9
    assert b["grads"] == pytest.approx(9e9 * 4 + roots * 2)
    assert b["activations"] == pytest.approx(1 * 3e9)
