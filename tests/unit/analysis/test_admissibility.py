"""The one admissibility check: its rules, every entry point calling it, and a search that
never returns a plan it refuses (plans around a sequence or a vocabulary tp does not divide)."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar import AutoparError, ClusterSpec, ParallelConfig, TrainSpec
from autopar.analysis.admissibility import (
    ModelFacts,
    check,
    check_plan,
    facts_of,
    layer_problems,
    plan_problems,
    problems,
)
from autopar.core.specs import Checkpoint
from autopar.costmodel.cluster import process_cluster

TRAIN = TrainSpec(global_batch=8, seq_len=32, precision="fp32")


@pytest.fixture(scope="module")
def llama():
    return autopar.models.build("tiny-llama")  # 2 blocks, 4 heads, 2 kv heads, seq 32


@pytest.fixture(scope="module")
def facts(llama) -> ModelFacts:
    return facts_of(llama)


def _what(facts: ModelFacts, train: TrainSpec = TRAIN, **fields) -> list[str]:
    return [p.what for p in problems(facts, ParallelConfig(**fields), train)]


def test_facts_come_from_the_config_and_the_module_tree(facts):
    assert (facts.num_blocks, facts.num_heads, facts.num_kv_heads, facts.vocab_size,
            facts.max_positions, facts.num_experts) == (2, 4, 2, 256, 32, None)
    assert facts.layers["layers.1.attn.q_proj"] == ("linear", (64, 64))
    assert facts.layers["tok_emb"] == ("embedding", (256, 64))


@pytest.mark.parametrize("fields, train, message", [
    (dict(tp=4), TRAIN, "tp=4 does not divide the 2 key/value heads"),
    (dict(tp=8), TRAIN, "tp=8 does not divide the 4 attention heads"),
    (dict(pp=4), TRAIN, "pp=4 for a model of 2 blocks"),
    (dict(pp=2, schedule="interleaved", virtual_stages=3), TRAIN, "6 model chunks"),
    (dict(tp=2, sequence_parallel=True), TrainSpec(global_batch=8, seq_len=31),
     "2 does not divide 31"),
    (dict(cp=2), TrainSpec(global_batch=8, seq_len=30), "4 does not divide 30"),
    # 8 divides the 24 tokens, not a cp rank's 12 of them
    (dict(cp=2, tp=8, sequence_parallel=True), TrainSpec(global_batch=8, seq_len=24),
     "this cp rank's 12 of 24"),
    (dict(dp=2, ep=2), TRAIN, "ep=2 for a model without experts"),
    (dict(pp=2, micro_batch=8), TRAIN, "needs at least one micro-batch per stage"),
    (dict(pp=2, schedule="interleaved", num_microbatches=5, micro_batch=1, dp=1),
     TrainSpec(global_batch=5, seq_len=32), "multiple of its 2 rounds"),
    (dict(dp=3), TRAIN, "not a multiple of dp=3"),
    (dict(), TrainSpec(global_batch=8, seq_len=64), "64 tokens is longer than the model's 32"),
])
def test_each_rule_names_what_cannot_run(facts, fields, train, message):
    found = _what(facts, train, **fields)
    assert any(message in f for f in found), found


def test_context_parallelism_is_refused_where_the_program_would_differ(facts):
    # experts: routing capacity and the load-balancing loss are per call, and cp splits it
    moe = dataclasses.replace(facts, num_experts=8)
    assert any("mixture of experts" in f for f in _what(moe, TRAIN, cp=2))
    # ... unless its routers route each token alone (transformers' dropless MoE, no aux loss)
    assert _what(dataclasses.replace(moe, token_routing=True), TRAIN, cp=2) == []
    # ... or its layers take the ranks holding a call's tokens (the zoo's MoELayer)
    assert _what(dataclasses.replace(moe, split_calls=True), TRAIN, cp=2) == []
    # a hooked attention the family finds cannot run context-parallel: its reason
    refused = dataclasses.replace(facts, context_refused="its block h.0 calls softmax")
    assert any("its block h.0 calls softmax" in f for f in _what(refused, TRAIN, cp=2))
    # an attention no family gives the hook (transformers', GPT's eager one)
    unhooked = dataclasses.replace(facts, context_attention=False)
    assert any("hook" in f for f in _what(unhooked, TRAIN, cp=2))
    assert _what(facts, cp=2) == [] and _what(unhooked, TRAIN) == []


def test_an_admissible_configuration_has_no_problem(facts):
    assert _what(facts, dp=2, tp=2, sequence_parallel=True, micro_batch=2) == []
    assert _what(facts, pp=2, schedule="interleaved", micro_batch=1) == []


def test_every_entry_point_refuses_before_tracing(llama):
    config = ParallelConfig(tp=8)
    for call in (lambda: autopar.estimate(llama, process_cluster(8), TRAIN, config),
                 lambda: autopar.plan_for(llama, process_cluster(8), TRAIN, config)):
        with pytest.raises(AutoparError, match="tp=8 does not divide the 4 attention heads"):
            call()
    with pytest.raises(AutoparError, match="tp=8 does not divide the 4 attention heads"):
        autopar.optimize(llama, process_cluster(8), TRAIN, {"tp": 8})


def test_a_sequence_tp_does_not_divide_is_planned_without_sequence_parallelism():
    """The issue's case at full scale: gpt-1.7b, 2047 tokens, tp 2 -- the plan it returns
    runs (no sequence parallelism); with 2048 tokens the same search uses it."""
    model = autopar.models.build("gpt-1.7b", seq_len=2048)
    cluster = ClusterSpec.preset("dgx-a100-80g", nodes=4)
    odd = autopar.optimize(model, cluster, TrainSpec(global_batch=512, seq_len=2047),
                           {"tp": 2}, keep=2)
    assert odd.config.tp == 2 and not odd.config.sequence_parallel
    assert all(not a.config.sequence_parallel for a in odd.alternatives)
    check_plan(facts_of(model), odd)
    even = autopar.optimize(model, cluster, TrainSpec(global_batch=512, seq_len=2048),
                            {"tp": 2}, keep=1)
    assert even.config.sequence_parallel


def test_a_vocabulary_tp_does_not_divide_keeps_the_head_whole():
    model = autopar.models.build("tiny-gpt", vocab_size=251)  # tied embedding and head
    plan = autopar.plan_for(model, process_cluster(2), TRAIN, ParallelConfig(tp=2))
    styles = dict(plan.module_strategies)
    assert styles["head"] == "replicated" and styles["tok_emb"] == "replicated"
    assert styles["layers.*.mlp.fc1"] == "column" and styles["layers.*.mlp.fc2"] == "row"
    assert plan_problems(facts_of(model), plan) == []


def test_a_width_tp_does_not_divide_keeps_that_module_whole():
    """ffn 30 splits over tp 2, not over tp 4: at tp 4 the MLP stays whole (a lone split could
    not run), attention is still split."""
    model = autopar.models.build("tiny-llama", ffn_hidden_size=30, num_kv_heads=4)
    two = dict(autopar.plan_for(model, process_cluster(2), TRAIN,
                                ParallelConfig(tp=2)).module_strategies)
    assert two["layers.*.mlp.gate_proj"] == "column" and two["layers.*.mlp.down_proj"] == "row"
    plan = autopar.plan_for(model, process_cluster(4), TRAIN, ParallelConfig(tp=4))
    four = dict(plan.module_strategies)
    assert four["layers.*.attn.q_proj"] == "column" and four["layers.*.attn.o_proj"] == "row"
    assert four["layers.*.mlp.gate_proj"] == "replicated"
    assert four["layers.*.mlp.down_proj"] == "replicated"
    assert plan_problems(facts_of(model), plan) == []


def test_layouts_the_engine_cannot_run_are_refused(llama, facts):
    plan = autopar.plan_for(llama, process_cluster(2), TRAIN, ParallelConfig(tp=2))
    styles = dict(plan.module_strategies)

    def refused(changes: dict[str, str], message: str) -> None:
        changed = tuple({**styles, **changes}.items())
        found = [p.what for p in layer_problems(facts, changed, 2)]
        assert any(message in f for f in found), found

    refused({"head": "row"}, "without a column split before it in the model root")
    refused({"layers.*.attn.o_proj": "replicated"}, "without a row split after it")
    refused({"layers.*.mlp.gate_proj": "row"}, "without a column split before it")
    refused({"layers.*.attn_norm": "mixed"}, "cannot express")
    refused({"layers.*.attn.nowhere": "column"}, "which this model does not have")
    assert any("no module strategies" in p.what for p in layer_problems(facts, (), 2))
    other = autopar.models.build("tiny-llama", num_layers=3)
    with pytest.raises(AutoparError, match="places 2 blocks in its pipeline stages, the "
                                           "model has 3"):
        check_plan(facts_of(other), plan)
    with pytest.raises(AutoparError, match="tp=2 does not divide the 1 key/value heads"):
        check(facts_of(autopar.models.build("tiny-llama", num_kv_heads=1)),
              dataclasses.replace(plan.config), TRAIN)


def test_a_model_no_family_can_cut_into_stages_gets_pp_1_plans_only_and_the_reason(facts):
    """A decoder whose forward adds the embedding to every block's output (tests/data/
    nanogpt.py's ``make_skip``) is no chain of blocks, so no family describes it: its blocks
    are found (num_blocks 4) but the passes cannot cut it, so every plan is pp = 1, each says
    why in its notes, and a pp = 2 plan is refused with the reason."""
    from pathlib import Path

    from autopar.core.model_spec import ModelSpec

    assert facts.unsplittable is None  # the zoo's llama has its family
    nanogpt = Path(__file__).resolve().parents[2] / "data" / "nanogpt.py"
    skip = ModelSpec.parse(f"{nanogpt}:make_skip").build("meta")
    skip_facts = facts_of(skip)
    assert skip_facts.num_blocks == 4 and "SkipGPT" in skip_facts.unsplittable
    plan = autopar.optimize(skip, process_cluster(4), TRAIN, keep=3)
    assert [p.config.pp for p in (plan, *plan.alternatives)] == [1] * (1 + len(plan.alternatives))
    assert any(n.startswith("pp = 1 only: the passes cannot cut this model") and
               "does not read the output of the block before it" in n
               for n in plan.estimate.notes), plan.estimate.notes
    assert any(w.startswith("pp=2: the passes cannot cut this model")
               for w in _what(skip_facts, dp=2, pp=2, micro_batch=1))
    with pytest.raises(AutoparError, match="pp=2: the passes cannot cut this model"):
        autopar.plan_for(skip, process_cluster(4), TRAIN,
                         ParallelConfig(dp=2, pp=2, micro_batch=1))


def test_the_experts_fold_is_refused_for_moe_layers_the_passes_cannot_run_on_token_shards(
        facts):
    """tp > 1 with sequence parallelism runs every MoE layer on the rank's own tokens: a model
    whose family gives no MoE module (a generic decoder's) is refused with the reason, and so
    is one without sequence parallelism never (its tp ranks run the experts whole)."""
    moe = dataclasses.replace(facts, num_experts=8, split_calls=True,
                              fold_refused="its family gives no MoE module")
    found = _what(moe, TRAIN, dp=2, tp=2, sequence_parallel=True, ep=4, micro_batch=1)
    assert any("its family gives no MoE module" in f for f in found), found
    assert _what(moe, TRAIN, dp=2, tp=2, ep=2, micro_batch=1) == []
    folded = dataclasses.replace(moe, fold_refused=None)
    assert _what(folded, TRAIN, dp=2, tp=2, sequence_parallel=True, ep=4, micro_batch=1) == []


@pytest.mark.parametrize("model, refused", [
    ("tiny-moe", None), ("tiny-deepseek", None),
])
def test_the_zoo_moe_families_run_the_fold_and_split_calls(model, refused):
    from autopar.analysis.admissibility import facts_of
    from autopar.models.training import ModelSpec

    facts = facts_of(ModelSpec(model).build("meta"))
    assert facts.split_calls and facts.fold_refused is refused


def test_the_moe_policy_is_refused_without_moe_layers_the_passes_can_checkpoint(facts):
    """``moe`` checkpoints each MoE layer's module: a dense model has none, a generic decoder's
    experts have no module (``ExpertLayer.module``); the zoo's and transformers' run it."""
    from pathlib import Path

    from autopar.models.training import ModelSpec

    dense = problems(facts, ParallelConfig(dp=2, checkpoint="moe"), TRAIN)
    assert [(p.where, "has none" in p.what) for p in dense] == [("checkpoint", True)]
    assert "selective" in dense[0].fix
    per_block = ParallelConfig(pp=2, micro_batch=1, checkpoint=("full", "moe"))
    assert any("checkpoint='moe'" in w for w in _what(facts, **per_block.to_dict()))
    nanomoe = Path(__file__).resolve().parents[2] / "data" / "nanomoe.py"
    generic = facts_of(ModelSpec.parse(f"{nanomoe}:make").build("meta"))
    found = _what(generic, dp=2, checkpoint="moe")
    assert any("no MoE module" in w for w in found), found
    for name in ("tiny-moe", "tiny-deepseek"):
        moe_facts = facts_of(ModelSpec(name).build("meta"))
        assert moe_facts.moe_modules_refused is None
        assert _what(moe_facts, dp=2, ep=2, checkpoint="moe") == []


def test_matmuls_is_refused_for_folded_experts_under_gpipe_and_interleaved(facts):
    """The ``matmuls`` policy of MoE blocks under the experts' fold, pipelined by GPipe or the
    interleaved schedule, stops torch's selective checkpoint (``matmuls_problem``: measured on
    tiny-moe and tiny-deepseek, tp 2 pp 2 SP, 2026-11-29); 1F1B, no fold, and a dense model
    run it, and the search leaves matmuls out of such a candidate's policies."""
    from autopar.models.training import ModelSpec
    from autopar.search.optimize import partial_policies

    moe = facts_of(ModelSpec("tiny-moe").build("meta"))
    fold = dict(tp=2, pp=2, micro_batch=1, sequence_parallel=True, checkpoint="matmuls")
    for schedule in ("gpipe", "interleaved"):
        found = problems(moe, ParallelConfig(schedule=schedule, **fold), TRAIN)
        assert [p.where for p in found] == ["checkpoint"] and "1f1b" in found[0].fix
    assert _what(moe, schedule="1f1b", **fold) == []
    assert _what(moe, schedule="gpipe", **{**fold, "sequence_parallel": False}) == []
    assert _what(facts, schedule="gpipe", **fold) == []
    gpipe = ParallelConfig(schedule="gpipe", **{**fold, "checkpoint": "none"})
    assert Checkpoint.MATMULS not in partial_policies(moe, gpipe)
    assert Checkpoint.MATMULS in partial_policies(moe, gpipe.with_(schedule="1f1b"))


def test_etp_needs_a_family_that_splits_an_expert_and_a_width_it_divides():
    """etp > 1 splits each expert's hidden width: the zoo's experts say how
    (``ExpertLayer.etp_dims``), transformers' fused gate_up experts and a generic decoder's
    expert modules do not and are refused with the reason; a width etp does not divide too."""
    from pathlib import Path

    from autopar.analysis.admissibility import facts_of
    from autopar.models.training import ModelSpec

    fold = dict(dp=2, tp=2, sequence_parallel=True, ep=2, etp=2, micro_batch=1)
    zoo = facts_of(ModelSpec("tiny-moe").build("meta"))
    assert zoo.etp_refused is None and zoo.expert_ffn
    assert _what(zoo, **fold) == []
    odd = dataclasses.replace(zoo, expert_ffn=zoo.expert_ffn + 1)
    found = _what(odd, **fold)
    assert any("does not divide the experts' hidden width" in f for f in found), found
    nanomoe = Path(__file__).resolve().parents[2] / "data" / "nanomoe.py"
    generic = facts_of(ModelSpec.parse(f"{nanomoe}:make").build("meta"))
    assert generic.etp_refused is not None
    found = _what(generic, **fold)
    assert any(f.startswith("etp=2 splits each expert") for f in found), found
    assert not any(f.startswith("etp=") for f in _what(generic, **{**fold, "etp": 1}))


def test_the_embedding_and_the_loss_may_each_be_a_chunk_of_their_own(facts):
    """Up to two more interleaved chunks than blocks: the first holds the embedding alone, the
    last the loss alone (``core.stages.chunk_sizes``, Megatron's account-for-embedding/loss
    split); pipeline stages of 1F1B each need a block."""
    from autopar.core.stages import chunk_sizes, rank_blocks

    assert _what(facts, pp=2, schedule="interleaved", virtual_stages=2, micro_batch=1) == []
    assert any("pp=3 for a model of 2 blocks" in w for w in _what(facts, pp=3, micro_batch=1))
    assert chunk_sizes(2, 4) == [0, 1, 1, 0] and chunk_sizes(2, 3) == [0, 1, 1]
    assert chunk_sizes(94, 96) == [0] + [1] * 94 + [0]  # Qwen3-235B in 32 x 3 chunks
    assert rank_blocks(94, 32, 3)[0] == 2 and rank_blocks(94, 32, 3)[-1] == 2
    assert chunk_sizes(10, 4) == [3, 3, 2, 2]  # no more chunks than blocks: as before
