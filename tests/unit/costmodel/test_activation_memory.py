"""Activation memory derived from the traced graph agrees with Korthikanti et al.'s closed forms.

"Reducing Activation Recomputation in Large Transformer Models" (2022), section 4: bytes per GPT
layer, fp16 activations, dropout everywhere, attention without flash:
  no parallelism                  s*b*h*(34 + 5*a*s/h)
  tensor parallel t               s*b*h*(10 + 24/t + 5*a*s/(h*t))
  tensor + sequence parallel      s*b*h/t*(34 + 5*a*s/h)
  full recompute                  2*s*b*h (/t with SP)
Tolerance: the closed forms leave out LayerNorm's fp32 mean and rstd (8 bytes per token per
norm, 0.25*s*b*h per layer at this shape), so the graph's count may exceed them by that. With t > 1
the block is the one the strategy solve prices, every linear layer split (``split_weights``:
Megatron's column->row pairs; the solve places the rest).

Under sequence parallelism and no checkpointing the engine keeps one thing the paper does not:
DTensor's column-parallel linear saves the input it multiplies, the all-gathered norm output,
whole (Megatron keeps the sequence-split one and gathers it again in the backward): two per GPT
layer, ``gathered(t)`` = 2 * 2 * (1 - 1/t) bytes per s*b*h more than the closed form, which
the memory model prices (``LayerCost.held``) and ``bench/memory_grid.py`` holds to the dry run.

The selective policy is the paper's: everything but the attention core, 34*s*b*h/t with SP (it
keeps the gathered inputs as shards and gathers them again, ``passes/regather.py``), 10 + 24/t
with tp alone. The matmuls policy (``passes/checkpointing.py``, held against the
executed program by ``test_saved_activations.py``) keeps the block input (2*s*b*h, /t with SP),
the column-parallel QKV and MLP-up outputs (6 + 8 bytes per s*b*h, /t), and the row-parallel
projection and MLP-down outputs cached before their reduction, full-size partial sums on every
rank (2 + 2, never /t).
"""

from __future__ import annotations

import pytest

import autopar
from autopar.costmodel.compute import Split
from autopar.costmodel.memory import saved_bytes
from autopar.core.specs import Checkpoint
from autopar.analysis.workload import build_workload

S, H, A, B = 256, 64, 4, 2  # the shape of conftest's solved_gpt_block (GPT_BLOCK)


@pytest.fixture(scope="module")
def block(solved_gpt_block):
    """The block of (tp, sequence parallel): the base workload's with tp = 1, else the solved."""
    return solved_gpt_block


def _per_sbh(block, t: int, sp: bool, policy: Checkpoint) -> float:
    split = Split(micro_batch=B, tp=t, cp=1, sequence_parallel=sp, act_bytes=2.0,
                  compute_dtype="fp16")
    return saved_bytes(block(t, sp), split, policy) / (S * B * H)


NORM_STATS = 2 * 2 * 4 / H  # two norms, mean and rstd in fp32, per element of s*b*h


def gathered(t: int) -> float:
    """Bytes per s*b*h of the two all-gathered norm outputs DTensor's column-parallel linears
    keep beyond their sequence-split share under SP (QKV's and MLP-up's inputs)."""
    return 2 * 2 * (1 - 1 / t)


@pytest.mark.parametrize("t", [1, 2, 4])
def test_no_recompute_matches_korthikanti(block, t: int) -> None:
    expected = 10 + 24 / t + 5 * A * S / (H * t)
    assert _per_sbh(block, t, False, Checkpoint.NONE) == pytest.approx(expected + NORM_STATS)


@pytest.mark.parametrize("t", [2, 4])
def test_sequence_parallel_divides_everything_by_t(block, t: int) -> None:
    expected = (34 + 5 * A * S / H) / t + gathered(t)
    assert _per_sbh(block, t, True, Checkpoint.NONE) == pytest.approx(expected + NORM_STATS / t)


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (4, False), (2, True), (4, True)])
def test_selective_matches_korthikanti_without_the_attention_core(block, t: int,
                                                                 sp: bool) -> None:
    expected = 34 / t + NORM_STATS / t if sp else 10 + 24 / t + NORM_STATS
    assert _per_sbh(block, t, sp, Checkpoint.SELECTIVE) == pytest.approx(expected)


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, False), (4, False), (2, True), (4, True)])
def test_matmuls_keeps_the_input_and_the_linear_outputs(block, t: int, sp: bool) -> None:
    expected = (2 / t if sp else 2) + 14 / t + 4
    assert _per_sbh(block, t, sp, Checkpoint.MATMULS) == pytest.approx(expected)


def test_gpt_175b_selective_keeps_34_sbh_over_8_under_tp8_sp() -> None:
    # Korthikanti et al.'s case (GPT-3 175B, s = 2048, b = 1, t = 8, SP, fp16): 34*s*b*h/t =
    # 4.25 s*b*h per layer, plus the norms' fp32 statistics (16/h); none keeps the 5as/h core
    # and the two gathered norm outputs DTensor keeps whole (3.5); matmuls keeps the two
    # row-parallel partial sums at full size (2 + 2) and 16/t more: 6.0 (and the fused
    # attention's output, 2/t, with SDPA). Figures in Checkpoint.MATMULS's docstring.
    from autopar.analysis.admissibility import facts_of
    from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY
    from autopar.search.planner import strategies_of
    s, h, a = 2048, 12288, 96
    per = {}
    for attention in ("eager", "sdpa"):
        model = autopar.models.build("gpt", num_layers=2, hidden_size=h, num_heads=a,
                                     vocab_size=51200, seq_len=s, attention=attention,
                                     dropout=0.1, device="meta")
        train = autopar.TrainSpec(global_batch=64, seq_len=s, precision="fp16")
        graph = autopar.trace(model, autopar.TrainSpec(global_batch=1, seq_len=s,
                                                       precision="fp16"))
        cluster = autopar.ClusterSpec.preset("dgx-a100-80g", nodes=8)
        strategies = strategies_of(graph, facts_of(model), "gpt", cluster, train,
                                   efficiency=DEFAULT_EFFICIENCY, split_weights=True)
        config = autopar.ParallelConfig(dp=8, tp=8, micro_batch=1, sequence_parallel=True)
        layer = strategies(config).block
        split = Split(micro_batch=1, tp=8, cp=1, sequence_parallel=True, act_bytes=2.0,
                      compute_dtype="fp16")
        per[attention] = {p: saved_bytes(layer, split, p) / (s * h) for p in Checkpoint}
    stats = 16 / h / 8
    assert per["eager"][Checkpoint.SELECTIVE] == pytest.approx(34 / 8 + stats)
    assert per["eager"][Checkpoint.NONE] == pytest.approx((34 + 5 * a * s / h) / 8 + stats
                                                          + gathered(8))
    assert per["eager"][Checkpoint.MATMULS] == pytest.approx(4 + 16 / 8)
    # fused attention: selective keeps what none keeps but the gathered inputs' other shards
    assert per["sdpa"][Checkpoint.SELECTIVE] == pytest.approx(
        per["sdpa"][Checkpoint.NONE] - gathered(8))
    assert per["sdpa"][Checkpoint.MATMULS] == pytest.approx(4 + 18 / 8 + 4 * a / h / 8)
    assert per["sdpa"][Checkpoint.SELECTIVE] < per["sdpa"][Checkpoint.MATMULS]


@pytest.mark.parametrize(("t", "sp"), [(1, False), (4, False), (4, True)])
def test_full_recompute_keeps_the_block_input(block, t: int, sp: bool) -> None:
    assert _per_sbh(block, t, sp, Checkpoint.FULL) == pytest.approx(2 / t if sp else 2)


def test_flash_attention_keeps_no_s_squared_term() -> None:
    model = autopar.models.build("gpt", num_layers=2, hidden_size=H, num_heads=A, vocab_size=128,
                                 seq_len=S, attention="sdpa", dropout=0.0, device="meta")
    graph = autopar.trace(model, autopar.TrainSpec(global_batch=B, seq_len=S))
    flash = build_workload(graph, act_bytes=2.0).block
    per_sbh = _per_sbh(lambda t, sp: flash, 1, False, Checkpoint.NONE)
    # 34 less the two hidden-size dropout masks and the s^2 terms; the softmax statistics (fp32 lse)
    # stay: 4 bytes per head and token.
    assert per_sbh == pytest.approx(32 + NORM_STATS + 4 * A / H)
    # matmuls also keeps the fused attention's output and statistics
    matmuls = _per_sbh(lambda t, sp: flash, 1, False, Checkpoint.MATMULS)
    assert matmuls == pytest.approx(2 + 14 + 4 + 2 + 4 * A / H)
    # selective recomputes nothing of a fused core: it keeps what none keeps
    assert _per_sbh(lambda t, sp: flash, 1, False, Checkpoint.SELECTIVE) == per_sbh


def test_selective_prices_an_eager_core_without_the_hook_as_none() -> None:
    # transformers' eager attention has an unfused core (found in the graph) but no
    # attention_core_runner hook: selective runs it whole, and is priced as none
    from autopar.analysis.admissibility import facts_of
    from autopar.costmodel.cluster import process_cluster
    from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY
    from autopar.models.hf_llama import HF_LLAMA_TINY
    from autopar.search.planner import strategies_of
    from autopar.models.training import ModelSpec

    spec = ModelSpec.transformers_config("LlamaForCausalLM",
                                         {**HF_LLAMA_TINY, "attn_implementation": "eager"})
    model = spec.build("meta")
    train = autopar.TrainSpec(global_batch=2, seq_len=32, precision="fp32")
    graph = autopar.trace(model, train)
    assert any(o.attention_core for o in build_workload(graph, 4.0).block.ops)
    facts = facts_of(model)
    assert not facts.attention_core_hook
    block = strategies_of(graph, facts, spec.label, process_cluster(1), train,
                          efficiency=DEFAULT_EFFICIENCY)(autopar.ParallelConfig(micro_batch=2)).block
    split = Split(micro_batch=2, tp=1, cp=1, sequence_parallel=False, act_bytes=4.0,
                  compute_dtype="tf32")
    assert saved_bytes(block, split, Checkpoint.SELECTIVE) == saved_bytes(block, split,
                                                                          Checkpoint.NONE)


def test_transformer_engine_fp8_saves_its_linears_inputs_in_one_byte():
    """Under Transformer Engine's FP8 (``fp8_fused_casts``) a linear keeps its input's FP8 copy
    for the weight gradient (TE ``_Linear`` saves ``inputmat`` or its transpose in FP8): a
    tensor only FP8 linears save (the norms' outputs, the SwiGLU product) takes one byte an
    element instead of two, one another op saves too (the attention's output, which the
    attention keeps for its own backward) one byte more; torchao's float8 linears, the
    engine's, keep the bf16 input -- the same bytes as bf16."""
    from autopar.analysis.tracing import trace
    from autopar.costmodel.memory import fp8_savers

    train = autopar.TrainSpec(global_batch=2, seq_len=32)
    block = build_workload(trace(autopar.models.build("tiny-llama"), train)).block
    bf16 = Split(1, 1, 1, False, 2.0, "bf16", seq_len=32)
    eager = Split(1, 1, 1, False, 2.0, "bf16", seq_len=32, fp8=True)
    te = Split(1, 1, 1, False, 2.0, "bf16", seq_len=32, fp8=True, fp8_fused_casts=True)
    fp8 = fp8_savers(block, te)
    assert fp8 and not fp8_savers(block, eager)
    only_fp8 = sum(t.elements for t in block.saved if t.without_checkpoint
                   and t.bytes_per_element is None and t.savers
                   and all(s in fp8 for s in t.savers))
    shared = sum(t.elements for t in block.saved if t.without_checkpoint
                 and t.bytes_per_element is None and any(s in fp8 for s in t.savers)
                 and not all(s in fp8 for s in t.savers))
    assert only_fp8 > 0 and shared > 0
    kept = saved_bytes(block, bf16, Checkpoint.NONE)
    assert saved_bytes(block, eager, Checkpoint.NONE) == kept
    assert saved_bytes(block, te, Checkpoint.NONE) == pytest.approx(kept - only_fp8 + shared)
