"""``autopar plan``: the report prints, constraints reach the search, the JSON is the plan, and a
request that cannot be met exits with status 2 and one paragraph."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from autopar import AutoparError, Plan
from autopar.cli.main import main

SMALL = ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80g", "--nodes", "1",
         "--global-batch", "64"]


def _error(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("autopar plan: error: ") and err.strip().count("\n") == 0, err
    return err


def test_plan_prints_report_and_explanation(capsys) -> None:
    assert main(SMALL) == 0
    captured = capsys.readouterr()
    for needle in ("gpt-1.7b on dgx-a100-80g (1 x 8 GPUs)", "Memory per GPU", "Time per step",
                   "Runner-up plans", "candidates priced", "Chosen: dp"):
        assert needle in captured.out
    assert captured.err == ""  # no progress bar when stderr is not a terminal


def test_constraint_flags_reach_the_search(capsys, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    argv = SMALL + ["--tp", "2", "--pp", "2", "--zero", "1", "--checkpoint", "full",
                    "--schedule", "interleaved", "--virtual-stages", "2",
                    "--no-sequence-parallel", "--fusions", "scale_mask_softmax",
                    "--json", str(path)]
    assert main(argv) == 0
    plan = Plan.from_json(path.read_text())
    assert plan.model == "gpt-1.7b"
    for p in (plan, *plan.alternatives):
        c = p.config
        assert (c.tp, c.pp, c.zero, c.checkpoint) == (2, 2, 1, "full")
        assert (c.schedule, c.virtual_stages, c.sequence_parallel) == ("interleaved", 2, False)
        assert c.fusions == ("scale_mask_softmax",)
    assert "dp2 tp2 pp2 zero1" in capsys.readouterr().out


def test_json_round_trips_byte_identically_and_runs_repeat(capsys, tmp_path: Path) -> None:
    first, second, html = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "plan.html"
    assert main(SMALL + ["--keep", "1", "--json", str(first), "--html", str(html)]) == 0
    assert main(SMALL + ["--keep", "1", "--json", str(second)]) == 0
    text = first.read_text()
    assert Plan.from_json(text).to_json() == text
    assert second.read_bytes() == first.read_bytes()
    assert len(Plan.from_json(text).alternatives) == 1
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "Runner-up plans" in page and "Chosen:" in page


def test_no_explain_and_keep_zero(capsys, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    assert main(SMALL + ["--keep", "0", "--no-explain", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Memory per GPU" in out and "Chosen:" not in out and "Runner-up" not in out
    assert Plan.from_json(path.read_text()).alternatives == ()


def test_infeasible_request_names_smallest_footprint_and_remedy(capsys) -> None:
    err = _error(capsys, ["plan", "--model", "gpt-175b", "--cluster", "dgx-a100-80g",
                          "--nodes", "1", "--global-batch", "8"])
    assert "the smallest footprint found, dp" in err
    assert re.search(r"needs [\d.]+ GiB per GPU but 72\.2 GiB is usable, [\d.]+ GiB short", err)
    assert re.search(r"use at least \d+ GPUs \(\d+ nodes of 8", err), err


def test_invalid_constraint_and_unknown_model_exit_2(capsys) -> None:
    err = _error(capsys, SMALL + ["--tp", "3"])
    assert "tp=3 does not divide the 8 GPUs" in err
    assert "gpt-17b" in _error(capsys, ["plan", "--model", "gpt-17b", "--cluster",
                                        "dgx-a100-80g", "--global-batch", "8"])
    assert "unknown fusion 'nope'" in _error(capsys, SMALL + ["--fusions", "nope"])
    assert "--json" in _error(capsys, SMALL + ["--keep", "0", "--json", "/no/such/dir/p.json"])


def test_bad_flag_value_is_a_usage_error(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(SMALL + ["--schedule", "zigzag"])
    assert info.value.code == 2
    assert "invalid choice: 'zigzag'" in capsys.readouterr().err


def test_debug_after_the_command_shows_the_exception(capsys) -> None:
    with pytest.raises(AutoparError, match="tp=3"):
        main(SMALL + ["--tp", "3", "--debug"])


def test_module_entry_point_keeps_pipes_clean() -> None:
    proc = subprocess.run([sys.executable, "-m", "autopar", *SMALL, "--keep", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "Memory per GPU" in proc.stdout
