"""``autopar compare`` / ``autopar.compare``: plans side by side, what differs marked, each plan
against the first in the words of ``Plan.explain``; bad input exits with status 2."""

from __future__ import annotations

from dataclasses import replace

import pytest

import autopar
from autopar import AutoparError, ClusterSpec, ParallelConfig, TrainSpec
from autopar.cli.main import main
from autopar.report.text import compare

TRAIN = TrainSpec(global_batch=64, seq_len=4096)
CLUSTER = ClusterSpec.preset("hgx-h100-80g", nodes=2)


@pytest.fixture(scope="module")
def plans():
    model = autopar.models.build("llama3-8b")
    fsdp = autopar.plan_for(model, CLUSTER, TRAIN, ParallelConfig(dp=16, zero=3, micro_batch=1),
                            name="llama3-8b")
    tp = autopar.plan_for(model, CLUSTER, TRAIN,
                          ParallelConfig(dp=4, tp=2, pp=2, zero=1, micro_batch=1,
                                         sequence_parallel=True, checkpoint="full"),
                          name="llama3-8b")
    return fsdp, tp


def _rows(text: str) -> dict[str, tuple[str, list[str]]]:
    """Table rows by name: (the differs mark, the cells)."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) >= 3 and cells[1]:
            out[cells[1]] = (cells[0], cells[2:])
    return out


def test_rows_that_differ_are_marked_and_the_rest_are_not(plans):
    a, b = plans
    rows = _rows(compare([a, b], ["a.json", "b.json"], width=140))
    for name in ("dp", "tp", "pp", "zero", "checkpoint", "step time", "peak memory GiB"):
        assert rows[name][0] == "*", name
    for name in ("model", "global_batch", "seq_len", "precision", "cp", "offload"):
        assert rows[name][0] == "", name
    assert rows["tp"][1] == ["1", "2"] and rows["checkpoint"][1] == ["none", "full"]
    # the time split and the memory by kind, each plan's own numbers
    for kind, value in a.estimate.time_breakdown.items():
        if value:
            assert kind in rows
    gib = [f"{p.estimate.memory_breakdown['activations'] / 2**30:,.2f}" for p in plans]
    assert rows["activations"][1] == gib
    assert rows["fits"][1] == ["yes" if p.estimate.fits else "NO" for p in plans]


def test_each_plan_against_the_first_uses_the_explanations_words(plans):
    a, b = plans
    text = compare([a, b], ["a", "b"], width=140)
    explained = replace(a, alternatives=(b,)).explain().splitlines()[1]  # "#1 <summary>: why"
    why = explained.split(": ", 1)[1]
    assert f"b against a: {why}" in " ".join(text.split())


def test_three_plans_and_the_public_name(plans):
    a, b = plans
    text = autopar.compare([a, b, a])
    assert "c against a: +0.000 s per step (+0.0%)." in " ".join(text.split())


def test_plans_of_different_models_are_refused_unless_asked(plans):
    a, _ = plans
    tiny = autopar.plan_for(autopar.models.build("tiny-llama"), CLUSTER,
                            TrainSpec(global_batch=16, seq_len=32),
                            ParallelConfig(dp=16), name="tiny-llama")
    with pytest.raises(AutoparError, match="tiny-llama"):
        compare([a, tiny], ["a", "t"])
    text = compare([a, tiny], ["a", "t"], any_model=True, width=140)
    assert "Warning: these are plans of different models" in text
    assert _rows(text)["model"][0] == "*"


def test_cli_compare_and_its_exit_codes(plans, tmp_path, capsys):
    a, b = plans
    (tmp_path / "a.json").write_text(a.to_json())
    (tmp_path / "b.json").write_text(b.to_json())
    (tmp_path / "junk.json").write_text('{"model": "x"}')
    (tmp_path / "text.json").write_text("not json")
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "a.json" in out and "b.json" in out and "b.json against a.json" in out
    for bad, says in (([str(tmp_path / "a.json")], "two plans or more"),
                      ([str(tmp_path / "a.json"), str(tmp_path / "missing.json")],
                       "cannot read the plan file"),
                      ([str(tmp_path / "a.json"), str(tmp_path / "junk.json")], "has no"),
                      ([str(tmp_path / "a.json"), str(tmp_path / "text.json")], "not JSON")):
        assert main(["compare", *bad]) == 2
        assert says in capsys.readouterr().err
