"""The walk of a block's backward (``autopar.search.backward_walk``) holds what autograd holds.

Checked on a GPT block split over tp 2 with sequence parallelism, whose strategies the solve
chooses (Megatron's column->row pairs). What the engine holds at these moments is measured by the
dry run of the emitted program (``bench/results/memory_grid.md``: the 405B block's backward at tp 8
with sequence parallelism holds two whole-sequence gradients of the gathered MLP input and the
gathered input itself while the gate and up projections run their backward).
"""

from __future__ import annotations

import pytest

from autopar.core.layout import Shard
from autopar.core.specs import Checkpoint
from autopar.costmodel.compute import Split
from autopar.costmodel.memory import backward_peak, recompute_working_bytes

S, H, A, B = 256, 64, 4, 2  # the shape of conftest's solved_gpt_block (GPT_BLOCK)


@pytest.fixture(scope="module")
def block(solved_gpt_block):
    return solved_gpt_block(2, True)


def _moment(block, op: str):
    return next(m for m in block.backward if m.op == op)


def test_the_walk_runs_the_ops_backwards_and_ends_with_every_weight_gradient(block) -> None:
    ops = [m.op for m in block.backward]
    assert ops[0] == "layers_0_mlp_drop" and ops[-1] == "layers_0_ln1"
    fractions = [m.weight_grad_fraction for m in block.backward]
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)


def test_a_column_split_under_sequence_parallelism_makes_its_input_gradient_whole(block) -> None:
    fc1 = _moment(block, "layers_0_mlp_fc1")
    grad_in = next(g for g in fc1.grads if g.name.endswith("->layers_0_ln2"))
    assert grad_in.shard is Shard.REPLICATED and grad_in.elements == S * H
    # and a row split's output gradient is gathered whole before its backward
    fc2 = _moment(block, "layers_0_mlp_fc2")
    assert next(g for g in fc2.grads if g.name == "grad:layers_0_mlp_fc2").shard \
        is Shard.REPLICATED


def test_a_column_split_under_sequence_parallelism_saves_its_gathered_input(block) -> None:
    held = {t.name: t for t in _moment(block, "layers_0_mlp_fc2").saved}
    assert held["layers_0_ln2@R*"].shard is Shard.REPLICATED
    # the norm keeps its own input in the sequence-split layout it reads it in
    assert held["add_1@Q"].shard is Shard.TP


def test_saved_tensors_are_released_once_their_earliest_saver_ran(block) -> None:
    held = [{t.name for t in m.saved} for m in block.backward]
    assert all(later <= earlier for earlier, later in zip(held, held[1:]))
    assert "layers_0_ln2@R*" not in held[[m.op for m in block.backward].index("layers_0_ln2")]
    # the first norm's backward is the last: it holds its statistics (an entry of their own,
    # sized as the producer keeps them); its input, the block's,
    # is kept under every policy and priced as kept
    assert held[-1] == {"layers_0_ln1.stats"}


def test_full_recompute_peaks_above_the_recomputed_activations_alone(block) -> None:
    split = Split(micro_batch=B, tp=2, cp=1, sequence_parallel=True, act_bytes=2.0,
                  compute_dtype="fp16")
    weight_grads = 1.0
    acts, grads = backward_peak(block, split, Checkpoint.FULL, weight_grads)
    rebuilt = recompute_working_bytes(block, split, Checkpoint.FULL)
    # at least the whole gradient of one gathered input (s*b*h fp16) beyond them
    assert acts >= rebuilt + S * B * H * 2.0 * 0.5
    assert 0.0 < grads <= weight_grads
    # without recomputation nothing rebuilt is held: only gradients of activations
    none_acts, _ = backward_peak(block, split, Checkpoint.NONE, weight_grads)
    assert none_acts < acts


def test_without_tensor_parallelism_the_block_backward_is_walked_too(solved_gpt_block) -> None:
    # 8b-fused (tp 1) peaks inside its SwiGLU's backward with 0.27 of the block's weight
    # gradient made, not the whole of it the memory model charged without a walk
    whole = solved_gpt_block(1)
    assert whole.backward and whole.backward[-1].weight_grad_fraction == pytest.approx(1.0)
    assert min(m.weight_grad_fraction for m in whole.backward) < 0.5
    split = Split(1, 1, 1, False, 2.0, "fp16")
    assert all(t.shard is Shard.REPLICATED for t in whole.held)
    acts, grads = backward_peak(whole, split, Checkpoint.NONE, 1.0)
    assert acts > 0 and grads < 1.0


def test_the_loss_input_is_marked_as_the_last_stages_output() -> None:
    import autopar
    from autopar.analysis.workload import build_workload
    model = autopar.models.build("gpt", num_layers=2, hidden_size=64, num_heads=4, vocab_size=128,
                                 seq_len=32, device="meta")
    graph = autopar.trace(model, autopar.TrainSpec(global_batch=2, seq_len=32))
    post = build_workload(graph).post
    out = [t for t in post.saved if t.stage_output]
    assert len(out) == 1 and out[0].elements == 32 * 128  # the logits of one sequence
    assert not out[0].without_checkpoint and not out[0].matmuls and not out[0].transient
