"""``autopar export`` / ``Plan.export`` without processes: what the folder holds and what export
refuses. The folder actually training, checkpointing and resharding is tests/dist/test_export.py."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

import autopar
from autopar import AutoparError, ClusterSpec, ParallelConfig, Plan, TrainSpec
from autopar.cli.main import main
from autopar.exports import train_template
from autopar.exports.folder import FILES, TEMPLATE, export_plan
from autopar.models.training import ModelSpec
from autopar.costmodel.cluster import process_cluster

TRAIN = TrainSpec(global_batch=8, seq_len=32, precision="fp32")


@pytest.fixture(scope="module")
def tiny_llama():
    return ModelSpec("tiny-llama").build("meta")


@pytest.fixture(scope="module")
def plan(tiny_llama) -> Plan:
    return autopar.plan_for(tiny_llama, process_cluster(4), TRAIN,
                            ParallelConfig(dp=2, tp=2, micro_batch=2), name="tiny-llama")


def test_folder_holds_plan_model_script_launcher_and_readme(plan, tmp_path):
    out = plan.export(tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert (out / "plan.json").read_text() == plan.to_json()
    assert Plan.from_json((out / "plan.json").read_text()) == plan
    assert ModelSpec.from_dict(json.loads((out / "model.json").read_text())) \
        == ModelSpec("tiny-llama")
    assert (out / "train.py").read_bytes() == TEMPLATE.read_bytes()
    readme = (out / "README.md").read_text()
    assert plan.summary() in readme and "--resume" in readme and "NODE_RANK" in readme


def test_launch_script_runs_torchrun_with_the_plans_processes_per_node(plan, tmp_path):
    launch = (plan.export(tmp_path / "one") / "launch.sh").read_text()
    assert "NPROC_PER_NODE=4\n" in launch and 'NNODES="${NNODES:-1}"' in launch
    assert '--nproc-per-node "$NPROC_PER_NODE"' in launch and "--rdzv-backend c10d" in launch
    two_nodes = autopar.plan_for(ModelSpec("tiny-llama").build("meta"),
                                 ClusterSpec.preset("hgx-h100-80g", nodes=2),
                                 TrainSpec(global_batch=16, seq_len=32, precision="fp32"),
                                 ParallelConfig(dp=8, tp=2, micro_batch=1), name="tiny-llama")
    script = two_nodes.export(tmp_path / "two") / "launch.sh"
    text = script.read_text()
    assert "NPROC_PER_NODE=8\n" in text and 'NNODES="${NNODES:-2}"' in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_refuses_a_folder_that_is_not_empty_unless_overwrite(plan, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(AutoparError, match="not empty"):
        plan.export(tmp_path)
    plan.export(tmp_path, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "train.py").exists()


def test_the_plan_records_its_model_and_export_rebuilds_it(tiny_llama, tmp_path):
    unnamed = autopar.plan_for(tiny_llama, process_cluster(4), TRAIN,
                               ParallelConfig(dp=2, tp=2, micro_batch=2))  # model "Llama"
    assert unnamed.model_spec == ModelSpec("tiny-llama")  # the preset's own shape
    out = unnamed.export(tmp_path / "a")
    assert ModelSpec.from_dict(json.loads((out / "model.json").read_text())) \
        == ModelSpec("tiny-llama")


def test_a_plan_recording_no_model_asks_for_it(plan, tmp_path):
    unnamed = dataclasses.replace(plan, model="Llama", model_spec=None)  # a version 1 file
    with pytest.raises(AutoparError, match="not a zoo preset") as err:
        unnamed.export(tmp_path / "a")
    assert "--model" in str(err.value)
    assert unnamed.export(tmp_path / "b", ModelSpec("tiny-llama")).is_dir()


def test_another_model_than_the_plans_is_refused(plan, tmp_path):
    with pytest.raises(AutoparError, match="the plan was made for tiny-llama"):
        export_plan(plan, tmp_path, ModelSpec("tiny-llama", {"num_layers": 3}))
    spec_less = dataclasses.replace(plan, model_spec=None)
    with pytest.raises(AutoparError, match="places 2 blocks in its pipeline stages, the "
                                           "model has 3"):
        export_plan(spec_less, tmp_path, ModelSpec("tiny-llama", {"num_layers": 3}))
    assert not any(tmp_path.iterdir())


def test_a_plan_the_passes_cannot_run_is_refused(tiny_llama, tmp_path):
    # priced by the cost model, but no kernel runs it
    unrunnable = autopar.plan_for(tiny_llama, process_cluster(4), TRAIN,
                                  ParallelConfig(dp=4, micro_batch=2,
                                                 fusions=("scale_mask_softmax",)),
                                  name="tiny-llama")
    with pytest.raises(AutoparError, match="no kernel"):
        unrunnable.export(tmp_path)
    assert not any(tmp_path.iterdir())


def test_cli_exports_a_plan_file(plan, tmp_path, capsys):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan.to_json())
    assert main(["export", str(plan_file), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "launch.sh").exists()
    assert main(["export", str(plan_file), str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err
    # a plan file recording no model (version 1) takes it from --model
    plan_file.write_text(dataclasses.replace(plan, model_spec=None).to_json())
    assert main(["export", str(plan_file), str(tmp_path / "out"), "--overwrite",
                 "--model", "tiny-llama", "--model-arg", "norm_eps=1e-6"]) == 0
    assert '"norm_eps": 1e-06' in (tmp_path / "out" / "model.json").read_text()


def test_cli_exits_2_on_a_missing_or_bad_plan_file(tmp_path, capsys):
    assert main(["export", str(tmp_path / "missing.json"), str(tmp_path / "out")]) == 2
    assert "cannot read the plan file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text('{"model": "x"}')
    assert main(["export", str(tmp_path / "bad.json"), str(tmp_path / "out")]) == 2
    assert "is not a plan file" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_token_file_rows_are_consecutive_windows_npy_and_raw(tmp_path):
    ids = np.arange(100, dtype=np.uint16)
    np.save(tmp_path / "t.npy", ids.astype(np.int32))
    ids.tofile(tmp_path / "t.bin")
    for data in (train_template.TokenFile(str(tmp_path / "t.npy"), "uint16", 256),
                 train_template.TokenFile(str(tmp_path / "t.bin"), "uint16", 256)):
        tokens, targets = data.batch(1, rows=2, seq_len=4)  # the second batch: rows 2 and 3
        assert tokens.tolist() == [[8, 9, 10, 11], [12, 13, 14, 15]]
        assert targets.tolist() == [[9, 10, 11, 12], [13, 14, 15, 16]]
    with pytest.raises(AutoparError, match="outside the model's vocabulary"):
        train_template.TokenFile(str(tmp_path / "t.bin"), "uint16", 5).batch(0, 2, 4)


def test_latest_checkpoint_is_the_highest_complete_step(tmp_path):
    for step, complete in ((2, True), (10, True), (12, False)):
        (tmp_path / f"step-{step}").mkdir()
        if complete:
            (tmp_path / f"step-{step}" / ".metadata").write_text("")
    assert train_template.latest_checkpoint(tmp_path) == tmp_path / "step-10"
    assert train_template.latest_checkpoint(tmp_path / "step-12") is None


def test_train_script_help_runs_standalone(plan, tmp_path):
    out = plan.export(tmp_path / "run")
    done = subprocess.run([sys.executable, str(out / "train.py"), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and "--checkpoint-dir" in done.stdout
