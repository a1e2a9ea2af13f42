"""Every bad input a new user was seen to give gets one paragraph -- what, where, what to do --
and exit status 2 on the command line (an ``AutoparError`` in Python), never a traceback or a
silent exit 0. Nothing here starts a process."""

from __future__ import annotations

import pytest
import torch

import autopar
from autopar import AutoparError, Plan, TrainSpec
from autopar.cli.main import main
from cli_refusal import refused as _refused
from autopar.core.model_spec import ModelSpec

PLAN = ["plan", "--model", "tiny-gpt", "--global-batch", "8", "--precision", "fp32"]
ESTIMATE = ["estimate", "--model", "tiny-llama", "--cluster", "hgx-h100-80g",
            "--global-batch", "8", "--precision", "fp32"]




@pytest.fixture
def tiny_llama_plan(tmp_path):
    path = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny-llama", "--cluster", "hgx-h100-80g", "--global-batch",
                 "8", "--precision", "fp32", "--json", str(path), "--no-explain"]) == 0
    return path


def test_a_bandwidth_in_the_wrong_unit_is_refused_with_its_conversion(tmp_path, capsys):
    cluster = tmp_path / "slow.yaml"
    cluster.write_text("base: hgx-h100-80g\nnodes: 2\ninter_node:\n  bytes_per_s: 400\n")
    _refused([*PLAN, "--cluster-file", str(cluster)], capsys,
             "inter_node.bytes_per_s", "did you mean 400 Gbit/s = 5e10 bytes/s")


def test_zero_nodes_is_refused(capsys):
    _refused([*PLAN, "--cluster", "dgx-a100-80g", "--nodes", "0"], capsys, "--nodes 0")


def test_a_preset_and_a_cluster_file_together_are_refused(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("base: hgx-h100-80g\n")
    _refused([*PLAN, "--cluster", "dgx-a100-80g", "--cluster-file", str(cluster)], capsys,
             "both --cluster dgx-a100-80g and --cluster-file")


def test_the_example_cluster_file_works_with_cluster_as_it_says(capsys):
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "clusters" / "h100-roce.yaml"
    assert "--cluster examples/clusters/h100-roce.yaml" in example.read_text()
    assert main([*PLAN, "--cluster", str(example), "--nodes", "1", "--no-explain"]) == 0
    assert "my-h100-roce" in capsys.readouterr().out


def test_estimate_refuses_tp_that_does_not_divide_the_heads(capsys):
    _refused([*ESTIMATE, "--tp", "8"], capsys, "tp=8 does not divide the 4 attention heads")


def test_a_sequence_longer_than_the_models_positions_is_refused(capsys):
    _refused([*ESTIMATE, "--model-arg", "seq_len=32", "--seq-len", "64"], capsys,
             "64 tokens is longer than the model's 32 positions")
    _refused(["estimate", "--model", "hf-llama", "--cluster", "hgx-h100-80g",
              "--global-batch", "8", "--seq-len", "128"], capsys, "64 positions")


def test_export_into_a_folder_it_cannot_make(tiny_llama_plan, tmp_path, capsys):
    _refused(["export", str(tiny_llama_plan), "/proc/autopar-x"], capsys,
             "cannot write the export folder")
    (tmp_path / "afile").write_text("")
    _refused(["export", str(tiny_llama_plan), str(tmp_path / "afile" / "sub")], capsys,
             "cannot write the export folder")


def test_verify_of_a_plan_with_another_model_is_refused_before_any_process(tiny_llama_plan,
                                                                           capsys):
    _refused(["verify", "--model", "tiny-gpt", "--plan", str(tiny_llama_plan)], capsys,
             "the plan was made for tiny-llama")


def test_a_factory_that_raises_is_one_paragraph(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("def make():\n    raise RuntimeError('boom')\n")
    _refused([*PLAN[:2], f"{tmp_path / 'broken.py'}:make", *PLAN[3:], "--cluster",
              "hgx-h100-80g"], capsys, "make() raised RuntimeError: boom", "broken.py:2")


def test_model_arg_of_the_wrong_type_says_so(capsys):
    _refused(["plan", "--model", "gpt", "--model-arg", "num_layers=abc", "--cluster",
              "hgx-h100-80g", "--global-batch", "8"], capsys,
             "num_layers='abc' is not an integer")


class _Speech(torch.nn.Module):
    """A transformers-style model whose main input is audio (``input_values``)."""

    main_input_name = "input_values"

    def forward(self, input_values, labels=None):
        return input_values


def test_a_model_that_reads_neither_token_ids_nor_images_is_told_so():
    with pytest.raises(AutoparError, match="its input is 'input_values': autopar feeds integer "
                                           r"token ids \(input_ids\) or images"):
        autopar.trace(_Speech(), TrainSpec(global_batch=2, seq_len=8))
    conv = torch.nn.Sequential(torch.nn.Conv1d(4, 4, 3))
    with pytest.raises(AutoparError, match="no nn.Embedding to read token ids with"):
        autopar.trace(conv, TrainSpec(global_batch=2, seq_len=8))


def test_python_api_takes_a_preset_name_for_the_cluster_or_says_what_it_needs():
    model = autopar.models.build("tiny-llama")
    train = TrainSpec(global_batch=8, seq_len=32, precision="fp32")
    plan = autopar.optimize(model, "hgx-h100-80g", train, keep=1)
    assert plan.cluster == "hgx-h100-80g" and plan.config.world_size == 8
    with pytest.raises(AutoparError, match="cluster must be a ClusterSpec or a preset name"):
        autopar.optimize(model, 8, train)  # type: ignore[arg-type]
    with pytest.raises(AutoparError, match="no cluster preset called 'dgx'"):
        autopar.estimate(model, "dgx", train, autopar.ParallelConfig(dp=8))


def test_plan_from_json_given_a_path_or_an_empty_object(tiny_llama_plan):
    with pytest.raises(AutoparError, match="a file path, not JSON text.*Plan.from_file"):
        Plan.from_json(str(tiny_llama_plan))
    with pytest.raises(AutoparError, match="the plan has no model, cluster"):
        Plan.from_json("{}")
    plan = Plan.from_file(tiny_llama_plan)
    assert plan.model_spec == ModelSpec("tiny-llama")
    assert Plan.from_json(plan.to_json()) == plan
