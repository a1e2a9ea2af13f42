"""``autopar replan``: a run on 4 ranks checkpoints, "loses" two of them, and resumes under the
plan ``replan`` makes for the 2 left, its losses those of the one-process reference.

The plan on 4 ranks is dp2 x tp2 (ZeRO-1); ``autopar replan plan.json --gpus 2`` searches the
same model and global batch on 2 ranks and exports it; the exported ``train.py --resume``
reads the 4-rank run's DCP checkpoint (resharded on load). Tolerance: ``test_export.py``'s
``LOSS_REL`` (fp32; the plans reduce in other orders).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from launching import events, launch, losses_of

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.core.plan import Plan
from autopar.costmodel.cluster import process_cluster
from autopar.models.training import ModelSpec
from autopar.verify.run import reference

TRAIN = TrainSpec(global_batch=8, seq_len=32, precision="fp32")
LOSS_REL = 1e-5


def test_a_run_resumes_under_the_replan_on_fewer_ranks(tmp_path):
    spec = ModelSpec("tiny-llama")
    plan = autopar.plan_for(spec.build("meta"), process_cluster(4), TRAIN,
                            ParallelConfig(dp=2, tp=2, micro_batch=2, zero=1),
                            name=spec.label, model_spec=spec)
    (tmp_path / "plan.json").write_text(plan.to_json())
    first = plan.export(tmp_path / "four", spec)
    ckpt, log = tmp_path / "ckpt", tmp_path / "log.jsonl"
    _, out_1 = launch(first, "--steps", "2", "--save-every", "2", "--checkpoint-dir", str(ckpt),
                      "--log-file", str(log))
    assert (ckpt / "step-2" / ".metadata").exists(), out_1

    done = subprocess.run([sys.executable, "-m", "autopar", "replan", str(tmp_path / "plan.json"),
                           "--gpus", "2", "--out", str(tmp_path / "two"), "--json",
                           str(tmp_path / "two.json"), "--checkpoint-dir", str(ckpt)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    new = Plan.from_file(tmp_path / "two.json")
    assert new.nodes * new.gpus_per_node == 2 and new.train == plan.train
    assert "--resume" in done.stdout

    _, out_2 = launch(tmp_path / "two", "--steps", "4", "--resume", "--checkpoint-dir",
                      str(ckpt), "--log-file", str(log))
    assert [r["step"] for r in events(log, "resume")] == [2], out_2
    losses = losses_of(log)
    assert sorted(losses) == [1, 2, 3, 4], (out_1, out_2)
    expected = reference(spec, new, steps=4, seed=0).losses
    for step, ref in enumerate(expected, 1):
        assert losses[step] == pytest.approx(ref, rel=LOSS_REL), (step, losses, expected)


def test_replan_refusals_are_clear(tmp_path):
    spec = ModelSpec("tiny-llama")
    plan = autopar.plan_for(spec.build("meta"), process_cluster(4), TRAIN,
                            ParallelConfig(dp=4, micro_batch=2), name=spec.label,
                            model_spec=spec)
    (tmp_path / "plan.json").write_text(plan.to_json())
    done = subprocess.run([sys.executable, "-m", "autopar", "replan", str(tmp_path / "plan.json"),
                           "--lost-nodes", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "leaves none" in done.stderr
