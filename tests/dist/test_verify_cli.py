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
