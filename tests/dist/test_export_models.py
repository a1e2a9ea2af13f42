"""``autopar plan --json`` -> ``autopar export`` -> ``bash launch.sh`` for every way to name a
model: a zoo preset with an override, a ``FILE.py:FACTORY`` model (its file copied into the
folder, exported from another folder than the one it was planned in), and a transformers
Qwen2-style model from a config folder. Each plan is made for a two-GPU node and trains two
steps on two gloo CPU processes; success is judged by the log train.py writes."""

from __future__ import annotations

import json
import math

import pytest
from launching import launch, losses_of

import autopar
from autopar.cli.main import main

CLUSTER = "name: two-gpus\nbase: hgx-h100-80g\ngpus_per_node: 2\nnodes: 1\n"
FACTORY = """
import torch

import autopar


def make():
    config = autopar.models.make_config("tiny-gpt", num_layers=3, vocab_size=131)
    return autopar.models.from_config(config, device=torch.get_default_device())
"""
QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 128,
         "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def _plan_export_train(tmp_path, model: list[str], constraints: list[str]) -> dict[int, float]:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    plan = tmp_path / "plan.json"
    assert main(["plan", *model, "--cluster", str(cluster), "--global-batch", "4",
                 "--precision", "fp32", "--json", str(plan), "--no-explain",
                 *constraints]) == 0
    out = tmp_path / "elsewhere" / "run"
    assert main(["export", str(plan), str(out)]) == 0
    _, output = launch(out, "--steps", "2", "--log-file", str(tmp_path / "log.jsonl"))
    losses = losses_of(tmp_path / "log.jsonl")
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values()), output
    return losses


def test_a_zoo_model_with_an_override_keeps_it(tmp_path):
    """The issue's case: ``--seq-len 64`` on tiny-llama (32 positions) is an override the plan
    must carry, or every rank crashes on a 64-token batch."""
    _plan_export_train(tmp_path, ["--model", "tiny-llama", "--seq-len", "64"], ["--tp", "2"])
    spec = json.loads((tmp_path / "elsewhere" / "run" / "model.json").read_text())
    assert spec == {"name": "tiny-llama", "overrides": {"seq_len": 64}}


def test_a_factory_model_is_copied_into_the_folder(tmp_path):
    (tmp_path / "mymodel.py").write_text(FACTORY)
    _plan_export_train(tmp_path, ["--model", f"{tmp_path / 'mymodel.py'}:make"], ["--dp", "2"])
    run = tmp_path / "elsewhere" / "run"
    assert (run / "mymodel.py").read_text() == FACTORY
    assert json.loads((run / "model.json").read_text()) == {"factory": "mymodel.py:make"}


def test_a_transformers_model_from_a_config_folder(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "qwen2").mkdir()
    (tmp_path / "qwen2" / "config.json").write_text(json.dumps(QWEN2))
    _plan_export_train(tmp_path, ["--model", str(tmp_path / "qwen2")], ["--tp", "2"])
    spec = json.loads((tmp_path / "elsewhere" / "run" / "model.json").read_text())
    assert spec["transformers"]["architecture"] == "Qwen2ForCausalLM"


def test_an_image_model_folder_trains_on_the_images_verify_draws(tmp_path):
    """A ViT (issue 28's tiny config): train.py draws the images and labels verify's reference
    does (``training.synthetic_inputs``), so its first losses are the reference's."""
    pytest.importorskip("transformers")
    from pathlib import Path

    from autopar.core.model_spec import ModelSpec
    from autopar.verify.reference import reference

    vit = Path(__file__).resolve().parents[1] / "data" / "vit"
    losses = _plan_export_train(tmp_path, ["--model", str(vit)], ["--dp", "2"])
    plan = autopar.Plan.from_file(tmp_path / "plan.json")
    ref = reference(ModelSpec.parse(str(vit)), plan, steps=2, seed=0)
    assert [losses[1], losses[2]] == pytest.approx(ref.losses, rel=1e-5)


def test_an_fp16_plan_checkpoints_its_loss_scale_and_resumes(tmp_path):
    """fp16 runs with dynamic loss scaling: the scaler's state is saved with the model and
    optimizer (its scale, its count of clean steps) and a resumed run continues from it."""
    from torch.distributed.checkpoint import FileSystemReader

    _plan_export_train(tmp_path, ["--model", "tiny-llama"], ["--dp", "2", "--precision", "fp16"])
    run, ckpt, log = tmp_path / "elsewhere" / "run", tmp_path / "ckpt", tmp_path / "log2.jsonl"
    _, output = launch(run, "--steps", "2", "--save-every", "2", "--checkpoint-dir", str(ckpt),
                       "--log-file", str(log))
    keys = FileSystemReader(str(ckpt / "step-2")).read_metadata().state_dict_metadata
    assert "loss_scaling.scale" in keys and "loss_scaling._growth_tracker" in keys, output
    _, output = launch(run, "--steps", "3", "--resume", "--checkpoint-dir", str(ckpt),
                       "--log-file", str(log))
    losses = losses_of(log)
    assert sorted(losses) == [1, 2, 3] and math.isfinite(losses[3]), output


GEMMA = {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "vocab_size": 128,
         "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
         "max_position_embeddings": 64}


def test_a_transformers_gemma_splits_into_pipeline_stages(tmp_path):
    """Gemma: Llama's layout with a scaled embedding (a buffer the stages compute), (1 + w)
    norms and a head tied to the embedding across the two stages."""
    pytest.importorskip("transformers")
    (tmp_path / "gemma").mkdir()
    (tmp_path / "gemma" / "config.json").write_text(json.dumps(GEMMA))
    _plan_export_train(tmp_path, ["--model", str(tmp_path / "gemma")], ["--pp", "2"])
    spec = json.loads((tmp_path / "elsewhere" / "run" / "model.json").read_text())
    assert spec["transformers"]["architecture"] == "GemmaForCausalLM"
