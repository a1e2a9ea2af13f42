"""The generic decoder family: a user's ``FILE.py`` decoder described from its module tree and
traced forward; a forward that is not a chain plans with pp = 1 and says why; tp divides the
heads its code reads, and is refused with the reason where the passes cannot split the
model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autopar import AutoparError, ParallelConfig, TrainSpec
from autopar.verify import decoders as verify_decoders
from autopar.analysis.admissibility import check, facts_of
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import Checkpoint
from autopar.models import family_of
from autopar.models.generic import describe
from autopar.passes.stage import StageModule

NANOGPT = Path(__file__).resolve().parents[2] / "data" / "nanogpt.py"
TRAIN = TrainSpec(global_batch=4, seq_len=32, precision="fp32")


def _model(factory: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return ModelSpec.parse(f"{NANOGPT}:{factory}").build("cpu", 0)


@pytest.mark.parametrize("factory", ["make", "make_separate"])
def test_two_stages_of_the_description_compute_the_models_logits(factory: str) -> None:
    model = _model(factory)
    family = family_of(model)
    assert family.name == "generic"
    parts = family.parts_of(model)
    assert parts.blocks == "transformer.h" and parts.head == "lm_head"
    assert parts.first == ("transformer.wte", "transformer.wpe", "transformer.drop")
    assert parts.last == ("transformer.ln_f", "lm_head")
    tokens = torch.randint(0, 256, (2, 32))
    policies = dict.fromkeys(range(4), Checkpoint.FULL)
    first = StageModule(model, parts, range(0, 1), first=True, last=False, seq_len=32,
                        policies=policies)
    last = StageModule(model, parts, range(1, 4), first=False, last=True, seq_len=32,
                       policies=policies)
    torch.testing.assert_close(last(first(tokens)), model(tokens), rtol=0, atol=0)


def test_a_skip_connection_across_blocks_is_no_chain_and_plans_pp_1_with_the_reason() -> None:
    model = _model("make_skip")
    why = describe(model)
    assert isinstance(why, str) and "transformer.h.1 does not read the output" in why
    facts = facts_of(model)
    assert facts.unsplittable is not None and "transformer.h.1" in facts.unsplittable
    check(facts, ParallelConfig(dp=2), TRAIN)  # dp runs: a one-stage program needs no split
    with pytest.raises(AutoparError, match="pp=2: the passes cannot cut this model"):
        check(facts, ParallelConfig(pp=2), TRAIN)


def test_the_plan_of_a_skip_model_is_pp_1_and_its_report_says_why() -> None:
    import autopar
    from autopar.costmodel.cluster import process_cluster

    plan = autopar.optimize(_model("make_skip"), process_cluster(2), TRAIN)
    assert plan.config.pp == 1
    notes = " ".join(plan.estimate.notes)
    assert "pp = 1 only" in notes and "does not read the output" in notes


def test_tp_of_a_chain_divides_the_heads_its_code_reads_and_a_skip_model_is_refused() -> None:
    facts = facts_of(_model("make"))
    assert (facts.num_heads, facts.num_kv_heads) == (4, 4)  # read off view(b, t, 4, c // 4)
    check(facts, ParallelConfig(tp=2), TRAIN)
    with pytest.raises(AutoparError, match="tp=8 does not divide the 4 attention heads"):
        check(facts, ParallelConfig(tp=8), TRAIN)
    with pytest.raises(AutoparError, match="tp=2: the passes cannot split this model") as err:
        check(facts_of(_model("make_skip")), ParallelConfig(tp=2), TRAIN)
    assert "attention" in err.value.what


def test_blocks_reading_the_tokens_by_value_are_no_chain() -> None:
    from torch import nn

    class ReadsTokens(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(16, 8)
            self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
            self.head = nn.Linear(8, 16)

        def forward(self, tokens):
            x = self.emb(tokens)
            keep = (tokens > 0).unsqueeze(-1)
            for block in self.blocks:
                x = block(x) * keep
            return self.head(x)

    class Masked(ReadsTokens):
        def forward(self, tokens):
            x = self.emb(tokens)
            for block in self.blocks:
                x = block(x)
            return self.head(x) + self.emb(tokens).sum()

    assert "does not read the output" in describe(ReadsTokens())
    assert "read the tokens by value" in describe(Masked())


def test_transformers_gpt2_and_phi3_have_their_families_and_refuse_tp() -> None:
    transformers = pytest.importorskip("transformers")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16, bos_token_id=0,
        eos_token_id=0))
    phi3 = transformers.Phi3ForCausalLM(transformers.Phi3Config(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=64, max_position_embeddings=16, pad_token_id=0,
        bos_token_id=1, eos_token_id=2))
    for model, name, reason in ((gpt2, "hf-gpt2", "Conv1D"), (phi3, "hf-phi3", "qkv_proj")):
        assert family_of(model).name == name
        facts = facts_of(model)
        assert facts.unsplittable is None
        with pytest.raises(AutoparError, match=reason):
            check(facts, ParallelConfig(tp=2), TrainSpec(global_batch=4, seq_len=16))


DECODERS = verify_decoders.__file__  # a user-style FILE.py


@pytest.mark.parametrize("factory", ["make_positions", "make_conv"])
def test_a_model_whose_blocks_are_self_blocks_or_table_self_positions_runs_in_stages(
        factory: str) -> None:
    # a stage keeps its own state under one reserved name: the model's names stay the model's
    torch.manual_seed(0)
    model = ModelSpec.parse(f"{DECODERS}:{factory}").build("cpu", 0)
    parts = family_of(model).parts_of(model)
    assert parts.blocks == "blocks"
    policies = dict.fromkeys(range(3), Checkpoint.NONE)
    first = StageModule(model, parts, range(0, 1), first=True, last=False, seq_len=32,
                        policies=policies)
    last = StageModule(model, parts, range(1, len(model.blocks)), first=False, last=True,
                       seq_len=32, policies=policies)
    assert {n for n, _ in first.named_parameters()} | {n for n, _ in last.named_parameters()} \
        == {n for n, _ in model.named_parameters()}
    tokens = torch.randint(0, 256, (2, 32))
    torch.testing.assert_close(last(first(tokens)), model(tokens), rtol=0, atol=0)


def test_a_first_layer_of_another_shape_runs_on_the_first_stage_before_the_blocks() -> None:
    """A dense first layer in the blocks' list (DeepSeek-V3's first_k_dense_replace): no
    block of the plan, run by the first stage after the embedding."""
    from torch import nn

    from autopar.models.blocks import block_span

    torch.manual_seed(0)
    model = ModelSpec.parse(f"{DECODERS}:make_llama").build("cpu", 0)
    lead = type(model.blocks[0])()
    lead.mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    model.blocks.insert(0, lead)
    parts = family_of(model).parts_of(model)
    span = block_span(model, parts.blocks)
    assert (parts.blocks, span.lead, span.count) == ("blocks", 1, 2)
    assert facts_of(model).num_blocks == 2
    policies = dict.fromkeys(range(2), Checkpoint.FULL)
    first = StageModule(model, parts, range(0, 1), first=True, last=False, seq_len=32,
                        policies=policies)
    last = StageModule(model, parts, range(1, 2), first=False, last=True, seq_len=32,
                       policies=policies)
    assert sorted(first.blocks) == ["0", "1"] and sorted(last.blocks) == ["2"]
    tokens = torch.randint(0, 256, (2, 32))
    torch.testing.assert_close(last(first(tokens)), model(tokens), rtol=0, atol=0)
