"""``autopar verify`` compares a plan with dropout off on both sides (``autopar.verify.dropout``):
transformers' GPT-2 config has resid/embd/attn_pdrop 0.1 by default, and a sharded run draws
other masks than one process (before, verify failed dp 2 on it: loss 2.2e-3 relative off)."""

from __future__ import annotations

import pytest
from torch import nn

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.cli.main import main
from autopar.core.errors import AutoparError
from autopar.costmodel.cluster import process_cluster
from autopar.models.training import ModelSpec
from autopar.verify.run import TOLERANCES, Diff, VerifyResult
from autopar.verify.dropout import dropout_fields, without_dropout

GPT2_DEFAULTS = {"vocab_size": 256, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 64,
                 "bos_token_id": 0, "eos_token_id": 0}
FACTORY = """
from torch import nn

import autopar


def make():
    model = autopar.models.build("tiny-gpt", vocab_size=128, num_layers=2)
    model.extra = nn.Dropout(0.1)
    return model
"""


def _dropout_modules(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p > 0]


def test_transformers_gpt2_default_dropout_is_switched_off_in_its_config():
    pytest.importorskip("transformers")
    spec = ModelSpec.transformers_config("GPT2LMHeadModel", GPT2_DEFAULTS)
    assert _dropout_modules(spec.build("meta"))  # the defaults: 0.1
    quiet, off = without_dropout(spec)
    assert {"attn_pdrop", "embd_pdrop", "resid_pdrop"} <= set(off)
    assert all(v == pytest.approx(0.1) for v in off.values())
    model = quiet.build("meta")
    assert _dropout_modules(model) == [] and dropout_fields(model) == {}
    assert quiet.transformers["config"]["n_embd"] == 64  # the rest of the config kept


def test_zoo_dropout_field_is_switched_off_and_a_model_without_keeps_its_spec():
    spec = ModelSpec("tiny-gpt", {"dropout": 0.1})
    quiet, off = without_dropout(spec)
    assert off == {"dropout": pytest.approx(0.1)}
    assert quiet == ModelSpec("tiny-gpt", {"dropout": 0.0})
    plain = ModelSpec("tiny-llama")
    assert without_dropout(plain) == (plain, {})


def test_dropout_that_is_no_config_field_is_refused_up_front(tmp_path):
    (tmp_path / "dropped.py").write_text(FACTORY)
    spec = ModelSpec(factory=f"{tmp_path / 'dropped.py'}:make")
    with pytest.raises(AutoparError) as err:
        without_dropout(spec)
    assert "dropout" in err.value.what and "extra" in err.value.where
    assert "p=0.0" in err.value.fix
    # the CLI: one paragraph and exit 2, before any process starts
    assert main(["verify", "--model", f"{tmp_path / 'dropped.py'}:make", "--dp", "2",
                 "--seq-len", "16"]) == 2


def test_the_report_says_which_dropout_was_switched_off():
    config = ParallelConfig(dp=2, micro_batch=1)
    train = TrainSpec(global_batch=2, seq_len=16, precision="fp32")
    plan = autopar.plan_for(autopar.models.build("tiny-gpt", device="meta"),
                            process_cluster(2), train, config, name="tiny-gpt")
    ok = Diff(0.0, 0.0, "-")
    result = VerifyResult(plan, "tiny-gpt", 2, 1, [1.0], [1.0], ok, ok, ok,
                          TOLERANCES[plan.train.precision], 0.1,
                          dropout_off={"dropout": 0.1})
    text = " ".join(result.table(width=200).split())
    assert "training noise off on both sides (dropout=0.1 set to 0)" in text
    assert result.passed
