"""``ModelSpec``: every way to name a model, what a plan records, and rebuilding it."""

from __future__ import annotations

import json

import pytest
import torch

import autopar
from autopar import AutoparError, ParallelConfig, Plan, TrainSpec
from autopar.core.model_spec import ModelSpec
from autopar.models.hf_llama import HF_LLAMA, HF_LLAMA_TINY
from autopar.costmodel.cluster import process_cluster

FACTORY = """
import torch

import autopar


def make():
    config = autopar.models.make_config("tiny-llama", num_layers=3)
    return autopar.models.from_config(config, device=torch.get_default_device())
"""
QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 128,
         "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def test_a_zoo_name_with_overrides():
    spec = ModelSpec.parse("tiny-llama", {"num_layers": 3})
    assert spec == ModelSpec("tiny-llama", {"num_layers": 3}) and spec.label == "tiny-llama"
    assert len(spec.build("meta").layers) == 3


def test_a_factory_file_is_recorded_absolute_and_called_on_the_device(tmp_path, monkeypatch):
    (tmp_path / "mine.py").write_text(FACTORY)
    monkeypatch.chdir(tmp_path)
    spec = ModelSpec.parse("mine.py:make")
    assert spec.factory == f"{tmp_path / 'mine.py'}:make" and spec.label == "mine.py:make"
    assert spec.build("meta").tok_emb.weight.device.type == "meta"
    a, b = spec.build("cpu", seed=1), spec.build("cpu", seed=1)
    assert torch.equal(a.tok_emb.weight, b.tok_emb.weight)  # the seed draws the weights
    with pytest.raises(AutoparError, match="--model-arg num_layers given with the factory"):
        ModelSpec.parse("mine.py:make", {"num_layers": 2})
    with pytest.raises(AutoparError, match="model file gone.py does not exist"):
        ModelSpec.parse("gone.py:make")
    with pytest.raises(AutoparError, match="has no callable 'nope'"):
        ModelSpec.parse("mine.py:nope").build("meta")


def test_a_relative_factory_path_in_a_plan_file_is_relative_to_that_file(tmp_path):
    (tmp_path / "mine.py").write_text(FACTORY)
    spec = ModelSpec(factory="mine.py:make")
    assert spec.resolved(tmp_path).factory == f"{tmp_path / 'mine.py'}:make"
    assert ModelSpec("tiny-llama").resolved(tmp_path) == ModelSpec("tiny-llama")


def test_a_transformers_config_folder_or_file(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "config.json").write_text(json.dumps(QWEN2))
    spec = ModelSpec.parse(str(tmp_path), {"num_hidden_layers": 3})
    assert spec.transformers["architecture"] == "Qwen2ForCausalLM"
    assert spec.transformers["config"]["num_hidden_layers"] == 3
    assert ModelSpec.parse(str(tmp_path / "config.json")).label == "Qwen2ForCausalLM"
    model = spec.build("meta")
    assert type(model).__name__ == "Qwen2ForCausalLM" and len(model.model.layers) == 3
    (tmp_path / "empty").mkdir()
    with pytest.raises(AutoparError, match="folder without a config.json"):
        ModelSpec.parse(str(tmp_path / "empty"))


def test_hf_llama_is_a_tiny_transformers_llama():
    spec = ModelSpec.parse(HF_LLAMA, {"num_hidden_layers": 1})
    assert spec.transformers["architecture"] == "LlamaForCausalLM"
    assert spec.transformers["config"] == {**HF_LLAMA_TINY, "num_hidden_layers": 1}


def test_of_describes_zoo_and_transformers_models_and_nothing_else():
    assert ModelSpec.of(autopar.models.build("tiny-gpt")) == ModelSpec("tiny-gpt")
    changed = ModelSpec.of(autopar.models.build("tiny-gpt", num_layers=3))
    assert changed.name == "gpt" and changed.overrides["num_layers"] == 3
    assert changed.same_model(ModelSpec("tiny-gpt", {"num_layers": 3}))
    assert not changed.same_model(ModelSpec("tiny-gpt"))
    assert ModelSpec.of(torch.nn.Linear(2, 2)) is None
    hf = ModelSpec.transformers_config("LlamaForCausalLM", HF_LLAMA_TINY)
    built = ModelSpec.of(hf.build("meta"))
    assert built.same_model(hf) and hf.same_model(built)  # defaults listed or not


def test_json_round_trip_and_the_version_1_form():
    for spec in (ModelSpec("tiny-llama", {"seq_len": 64}), ModelSpec(factory="/x/m.py:make"),
                 ModelSpec.transformers_config("LlamaForCausalLM", HF_LLAMA_TINY)):
        assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    old = {"name": "", "overrides": {}, "transformers_llama": HF_LLAMA_TINY}
    assert ModelSpec.from_dict(old).transformers["architecture"] == "LlamaForCausalLM"
    with pytest.raises(AutoparError, match="exactly one of"):
        ModelSpec()
    with pytest.raises(AutoparError, match="unknown model spec key"):
        ModelSpec.from_dict({"name": "tiny-gpt", "shape": 3})


def test_a_plan_records_its_model_and_its_file_reads_it_back(tmp_path):
    spec = ModelSpec("tiny-llama", {"seq_len": 64})
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2),
                            TrainSpec(global_batch=4, seq_len=64, precision="fp32"),
                            ParallelConfig(dp=2), model_spec=spec)
    assert plan.model_spec == spec
    (tmp_path / "p.json").write_text(plan.to_json())
    again = Plan.from_file(tmp_path / "p.json")
    assert again == plan and again.spec_for() == spec
    with pytest.raises(AutoparError, match="the plan was made for tiny-llama"):
        plan.spec_for(ModelSpec("tiny-llama"))
