"""autopar calibrate (autopar/measure/calibration.py): the fit finds a constant it is given the effect
of, calibration files load or are refused, and the commands refuse bad input with status 2."""

from __future__ import annotations

import json
from pathlib import Path
from dataclasses import replace

import pytest

from autopar import models
from autopar.api import estimate
from autopar.measure.calibration import MeasuredRun, calibrate, load_runs
from autopar.cli.main import main
from autopar.core.errors import AutoparError
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY, load_calibration
from autopar.analysis.tracing import trace

TRUE_MAINLOOP = 0.45


def _synthetic_runs() -> list[MeasuredRun]:
    """Three GEMM-heavy configurations whose "measured" step times are the model's own at
    matmul_mainloop = TRUE_MAINLOOP: the fit must find that value."""
    model = models.build("gpt", num_layers=2, hidden_size=1024, num_heads=8, vocab_size=256,
                         seq_len=1024, device="meta")
    cluster = ClusterSpec.preset("hgx-h100-80g")
    truth = replace(DEFAULT_EFFICIENCY, matmul_mainloop=TRUE_MAINLOOP)
    runs = []
    for batch, mb in ((16, 1), (32, 2), (64, 4)):
        train = TrainSpec(global_batch=batch, seq_len=1024)
        graph = trace(model, train)
        config = ParallelConfig(dp=8, micro_batch=mb)

        def predict(eff, graph=graph, train=train, config=config):
            return estimate(graph, cluster, train, config, efficiency=eff)
        runs.append(MeasuredRun(f"b{batch}", predict(truth).step_time_s, None, predict))
    return runs


def test_calibrate_recovers_the_matmul_constant_that_made_the_runs():
    cal = calibrate(_synthetic_runs(), ("matmul_mainloop",))
    assert cal.fitted["matmul_mainloop"] == pytest.approx(TRUE_MAINLOOP, rel=0.02)
    before = max(abs(r.error) for r in cal.before)
    after = max(abs(r.error) for r in cal.after)
    assert before > 0.05 and after < 0.01


def test_calibrate_refuses_unknown_or_too_many_constants():
    with pytest.raises(AutoparError, match="cannot fit"):
        calibrate(_synthetic_runs()[:1], ("kernel_overhead_s",))
    with pytest.raises(AutoparError, match="cannot fit"):
        calibrate(_synthetic_runs()[:1], ("matmul", "memory", "nvlink", "network"))


def test_calibration_file_loads_into_efficiency(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"format_version": 1, "efficiency": {"matmul_mainloop": 0.5}}))
    eff = load_calibration(path)
    assert eff.matmul_mainloop == 0.5 and eff.memory == DEFAULT_EFFICIENCY.memory


@pytest.mark.parametrize("content, match", [
    ({"format_version": 2, "efficiency": {}}, "format_version"),
    ({"format_version": 1, "efficiency": {"warp_speed": 0.5}}, "unknown efficiency constant"),
    ({"format_version": 1, "efficiency": {"memory": 1.5}}, r"\(0, 1\]"),
])
def test_bad_calibration_file_is_refused(tmp_path, content, match):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(content))
    with pytest.raises(AutoparError, match=match):
        load_calibration(path)


def test_runs_file_is_read_and_priced(tmp_path):
    runs = {"runs": [{"name": "tiny", "model": {"name": "gpt", "overrides": {
        "num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 256, "seq_len": 32}},
        "cluster": "hgx-h100-80g", "train": {"global_batch": 8, "seq_len": 32},
        "config": {"dp": 8}, "step_s": 0.01, "peak_bytes": 1e8}]}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    (run,) = load_runs(str(path))
    assert run.name == "tiny" and run.step_s == 0.01
    assert run.predict(DEFAULT_EFFICIENCY).step_time_s > 0


def test_a_korthikanti_row_is_read_as_its_two_runs():
    path = Path(__file__).resolve().parents[3] / "tests" / "data" / "korthikanti_table5.json"
    runs = load_runs(str(path))
    assert len(runs) == 2 * len(json.loads(path.read_text())["rows"])
    full, selective = runs[:2]
    assert (full.step_s, selective.step_s) == (1.42, 1.10)  # Table 5, 22B
    assert "full recompute" in full.name and "selective" in selective.name


@pytest.mark.parametrize("argv, where", [
    (["calibrate", "--runs", "{missing}", "--out", "{out}"], "missing.json"),
    (["calibrate", "--runs", "{bad}", "--out", "{out}"], "runs[0]"),
    (["calibrate", "--runs", "{bad}", "--out", "/no/such/folder/cal.json"], "--out"),
    (["profile", "--out", "{out}", "--nproc", "0"], "--nproc"),
    (["estimate", "--model", "tiny-gpt", "--global-batch", "8", "--profile", "{missing}"],
     "missing.json"),
    (["estimate", "--model", "tiny-gpt", "--global-batch", "8", "--cluster", "hgx-h100-80g",
      "--calibration", "{bad}"], "format_version"),
])
def test_profile_and_calibrate_bad_input_exits_2(tmp_path, capsys, argv, where):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"runs": [{"model": "tiny-gpt"}]}))
    names = {"missing": str(tmp_path / "missing.json"), "bad": str(bad),
             "out": str(tmp_path / "out.json")}
    assert main([a.format(**names) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and where in err and "Traceback" not in err


def test_a_measurement_no_constant_in_range_reaches_is_refused_not_written():
    # step times 100 x faster than the model at its best constant: the fit would end at the
    # range's bound with ~99 % error left (a step time given in the wrong unit, say)
    runs = [replace(r, step_s=r.step_s / 100) for r in _synthetic_runs()]
    with pytest.raises(AutoparError, match=r"no value of matmul_mainloop \(ended at 0.99\d, a bound"
                       ) as err:
        calibrate(runs, ("matmul_mainloop",), source="runs.json")
    assert "still" in err.value.what and err.value.where == "runs.json"
    assert "seconds (not ms)" in err.value.fix
