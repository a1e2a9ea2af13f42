"""``autopar verify`` end to end on the command line: a plan as flags, and a plan file."""

from __future__ import annotations

from autopar.cli import main


def test_verify_flags_plan_passes(capsys):
    assert main(["verify", "--model", "tiny-llama", "--dp", "2", "--tp", "2", "--nproc", "4",
                 "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "dp2 tp2" in out


def test_plan_file_from_autopar_plan_verifies(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "hgx-h100-80g", "--nodes", "1",
                 "--global-batch", "16", "--precision", "fp32", "--tp", "2", "--pp", "2",
                 "--json", str(plan), "--no-explain"]) == 0
    capsys.readouterr()
    assert main(["verify", "--model", "tiny-gpt", "--plan", str(plan), "--steps", "2"]) == 0
    assert "PASSED" in capsys.readouterr().out


def test_a_rank_that_fails_is_reported_and_the_others_stopped():
    """The plan places 2 blocks, the ranks build a 4-block model: every rank raises in the
    pipeline split; verify names the failure instead of hanging."""
    import pytest

    import autopar
    from autopar import AutoparError, ParallelConfig, TrainSpec
    from autopar.training import ModelSpec
    from autopar.verify import process_cluster, verify

    plan = autopar.plan_for(ModelSpec("tiny-llama").build("meta"), process_cluster(2),
                            TrainSpec(global_batch=4, seq_len=32, precision="fp32"),
                            ParallelConfig(pp=2, micro_batch=1))
    message = r"rank\d failed: the plan places 2 blocks, the model has 4"
    with pytest.raises(AutoparError, match=message):
        verify(ModelSpec("tiny-llama", {"num_layers": 4}), plan, steps=1)
