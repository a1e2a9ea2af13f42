"""``autopar.models.feed``: one way to call a model, for the tracer, verify's reference, the engine and
the dry run -- the cache off (GraniteMoE takes ``use_cache`` through ``**kwargs``), an
encoder-decoder's decoder fed the tokens shifted right (T5), an image model fed images of its
config's size (ViT: a token is a patch)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import autopar
from autopar import AutoparError, TrainSpec
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig
from autopar.costmodel.cluster import process_cluster
from autopar.models.feed import FeedKind, feed_of, logits_of, shift_right
from autopar.analysis.tracing import resolve_seq_len
from autopar.verify.models import transformers_spec

transformers = pytest.importorskip("transformers")

VIT = Path(__file__).resolve().parents[2] / "data" / "vit"
"""Issue 28's tiny ViT as the ``config.json`` folder a newcomer passes as ``--model``; the
transformers architectures come from ``autopar.verify.models`` at its default tiny shape."""


def _spec(name: str) -> ModelSpec:
    return ModelSpec.parse(str(VIT)) if name == "vit" else transformers_spec(name)


def _dry_run_of(spec: ModelSpec, seq_len: int) -> autopar.DryRun:
    """A dp-2 plan (bf16, the default: torch's fake kernel of ``_grouped_mm``, GraniteMoE's
    experts, takes bf16 only) dry-run in this process, as ``plan --check`` runs it."""
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2),
                            TrainSpec(global_batch=4, seq_len=seq_len),
                            ParallelConfig(dp=2), model_spec=spec)
    return autopar.dry_run(plan, workers=1)


def test_granitemoe_takes_the_cache_switch_through_kwargs_and_traces_without_a_cache() -> None:
    spec = _spec("granite-moe")
    model = spec.build("cpu", 0)
    feed = feed_of(model)
    assert "use_cache" not in transformers.GraniteMoeForCausalLM.forward.__code__.co_varnames[
        :transformers.GraniteMoeForCausalLM.forward.__code__.co_argcount]
    assert feed.fixed["use_cache"] is False and feed.kind is FeedKind.TOKENS
    graph = autopar.trace(spec.build("meta"), TrainSpec(global_batch=2, seq_len=16))
    assert graph.method == "export" and any(n.op == "grouped_mm" for n in graph.nodes)
    tokens = torch.randint(256, (2, 16))
    assert logits_of(model, tokens).shape == (2, 16, 256)
    assert _dry_run_of(spec, 16).roles[0].peak_bytes > 0


def test_t5_decoder_reads_the_tokens_shifted_right_and_gives_decoder_shaped_logits() -> None:
    spec = _spec("t5")
    model = spec.build("cpu", 0).eval()
    feed = feed_of(model)
    tokens = torch.randint(1, 256, (2, 8))
    fed = feed.kwargs(tokens, tokens)
    assert feed.decoder == "decoder_input_ids" and feed.fixed["use_cache"] is False
    assert torch.equal(fed["decoder_input_ids"], shift_right(tokens, 0))
    assert fed["decoder_input_ids"][:, 0].tolist() == [0, 0]
    logits = logits_of(model, tokens)
    assert logits.shape == (2, 8, 256)
    # the call with targets (the trace's) computes the same logits as the one without
    assert torch.equal(model(**fed).logits, logits)
    graph = autopar.trace(spec.build("meta"), TrainSpec(global_batch=2, seq_len=8))
    assert any(n.op == "cross_entropy" for n in graph.nodes)  # T5's loss on its labels
    assert _dry_run_of(spec, 8).roles[0].peak_bytes > 0


def test_encoder_decoder_without_a_decoder_start_token_is_refused() -> None:
    spec = _spec("t5")
    model = spec.build("meta")
    model.config.decoder_start_token_id = None
    with pytest.raises(AutoparError, match="decoder_start_token_id"):
        feed_of(model)


def test_vit_is_fed_images_and_a_token_is_a_patch() -> None:
    spec = _spec("vit")
    model = spec.build("cpu", 0)
    feed = feed_of(model)
    # 32 x 32 images in 8 x 8 patches: 16 patches and the class token
    assert feed.kind is FeedKind.IMAGES and feed.image == (3, 32, 32) and feed.seq_len == 17
    assert resolve_seq_len(model) == 17
    with pytest.raises(AutoparError, match="fixed by its config at 17 tokens.*--seq-len 17"):
        resolve_seq_len(model, seq_len=2048)
    images, labels = feed.example(2, 17, "cpu")
    assert images.shape == (2, 3, 32, 32) and labels.shape == (2,)
    assert logits_of(model, images).shape == (2, model.config.num_labels)
    graph = autopar.trace(spec.build("meta"), TrainSpec(global_batch=2, seq_len=17), batch=2)
    assert graph.seq_len == 17
    patches = next(n for n in graph.nodes if n.op == "convolution")
    # the patch embedding: 2 images x 16 patches x (3 x 8 x 8 pixels) x 64 features x 2
    assert patches.fwd_flop == 2 * 16 * 3 * 8 * 8 * 64 * 2
    assert any(n.op == "cross_entropy" for n in graph.nodes)  # the model's classification loss


def test_vit_plans_and_its_chosen_plan_dry_runs() -> None:
    spec = _spec("vit")
    plan = autopar.optimize(spec.build("meta"), "hgx-h100-80g",
                            TrainSpec(global_batch=8, seq_len=17), keep=1)
    assert plan.estimate.step_time_s > 0
    run = _dry_run_of(spec, 17)
    assert run.roles[0].peak_bytes > 0 and run.roles[0].blocks == 2
