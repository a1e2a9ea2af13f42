"""``check_plans`` and ``autopar plan --check``: the chosen plan and its runner-ups dry-run, those
whose dry run does not fit dropped.

A plan whose prediction fits but whose dry run does not is made honestly: the dry run of a
tiny-gpt plan is measured first, then the plan is made again for a cluster whose usable memory
lies between that plan's predicted and dry-run peaks (``hbm_reserved_bytes`` takes the rest of
the GPU), so only the dry run can tell that it does not fit.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

import autopar
from autopar.cli.main import main
from autopar.report.dryrun import check_report
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import ClusterSpec, process_cluster
from autopar.dryrun.plan_check import PlanCheckError, check_plans

SPEC = ModelSpec.zoo("tiny-gpt")
TRAIN = TrainSpec(global_batch=8, seq_len=32)
# the chosen plan: states sharded by dp only, full checkpointing, which the memory model
# under-predicts at this tiny size (1.408 MB predicted, 1.563 MB dry run, measured 2026-11-24;
# the grid's full-size plans are within 3 %): room between prediction and dry run
BIG = dict(dp=2, zero=1, micro_batch=4, checkpoint="full")
SMALL = dict(dp=2, zero=3, micro_batch=1, checkpoint="full")   # the runner-up: fewer activations
UNRUNNABLE = dict(dp=2, zero=3, micro_batch=4, checkpoint="full",  # priced by the planner,
                  fusions=("bias_dropout_add",))  # refused by the passes (a fusion, no kernel)


def _plan(cluster: ClusterSpec, **config) -> autopar.Plan:
    return autopar.plan_for(SPEC.build("meta"), cluster, TRAIN, ParallelConfig(**config),
                            model_spec=SPEC)


def _usable(usable_bytes: int) -> ClusterSpec:
    """Two H100s of which ``usable_bytes`` per GPU may be filled (no headroom)."""
    base = process_cluster(2)
    cluster = dataclasses.replace(base, hbm_reserved_bytes=base.gpu.hbm_bytes - usable_bytes,
                                  memory_headroom=0.0)
    assert cluster.usable_hbm_bytes == usable_bytes
    return cluster


def _runner_ups(chosen: autopar.Plan, *alternatives: autopar.Plan) -> autopar.Plan:
    """``chosen`` with ``alternatives`` as its runner-ups, as ``plan_search`` makes them (they
    record no model spec)."""
    return dataclasses.replace(chosen, alternatives=tuple(
        dataclasses.replace(a, model_spec=None) for a in alternatives))


def test_a_plan_whose_dry_run_fits_is_returned_with_its_runner_ups() -> None:
    plan = autopar.optimize(SPEC.build("meta"), process_cluster(2), TRAIN, keep=2,
                            model_spec=SPEC)
    assert len(plan.alternatives) == 1
    seen: list[tuple[int, int, str]] = []
    check = check_plans(plan, progress=lambda *a: seen.append(a), workers=1)
    assert check.plan == plan and check.plan.alternatives == plan.alternatives
    assert check.dropped == () and [c.label for c in check.kept] == ["chosen plan",
                                                                     "runner-up #1"]
    for c in check.checked:
        assert c.run is not None and c.run.fits
        (role,) = c.run.roles
        assert 0 < role.peak_bytes <= plan.estimate.usable_memory_bytes
    assert seen[-1] == (2, 2, "done")
    assert any(what.startswith("runner-up #1: ") for _, _, what in seen)


def test_a_plan_whose_dry_run_does_not_fit_is_dropped_for_the_runner_up() -> None:
    roomy = process_cluster(2)
    (big,) = autopar.dry_run(_plan(roomy, **BIG), workers=1).roles
    (small,) = autopar.dry_run(_plan(roomy, **SMALL), workers=1).roles
    # the memory model under-predicts the chosen plan: room between prediction and dry run
    assert big.predicted_bytes < big.peak_bytes
    usable = int((big.predicted_bytes + big.peak_bytes) / 2)
    assert small.peak_bytes < usable  # the runner-up's dry run fits there

    cluster = _usable(usable)
    chosen, refused, runner_up = (_plan(cluster, **BIG), _plan(cluster, **UNRUNNABLE),
                                  _plan(cluster, **SMALL))
    assert chosen.estimate.fits and refused.estimate.fits and runner_up.estimate.fits
    check = check_plans(_runner_ups(chosen, refused, runner_up), workers=1)

    assert check.plan.config == runner_up.config
    assert check.plan.alternatives == ()
    assert check.plan.model_spec == SPEC  # the chosen plan's, which the runner-up lacked
    assert [(c.index, c.kept) for c in check.checked] == [(0, False), (1, False), (2, True)]
    dropped, unrunnable, kept = check.checked
    assert dropped.run is not None and not dropped.run.fits
    assert dropped.run.peak_bytes > usable >= dropped.plan.estimate.peak_memory_bytes
    assert "its dry run needs" in dropped.problem and "pipeline rank 0" in dropped.problem
    assert unrunnable.run is None and "no kernel" in unrunnable.problem
    assert kept.run is not None and kept.run.peak_bytes <= usable

    text = check_report(check.checked)
    assert "chosen plan: dp2 tp1 pp1 zero1" in text and "NO" in text
    assert "dropped chosen plan" in text and "dropped runner-up #1" in text
    assert "kept runner-up #2 dp2 tp1 pp1 zero3" in text


def test_no_plan_whose_dry_run_fits_is_an_error_saying_what_to_do() -> None:
    cluster = _usable(2**20)  # 1 MiB: under either plan's dry run (about 1.6-2 MiB)
    plan = _runner_ups(_plan(cluster, **BIG), _plan(cluster, **SMALL))
    with pytest.raises(PlanCheckError) as caught:
        check_plans(plan, workers=1)
    err = caught.value
    assert len(err.checked) == 2 and not any(c.kept for c in err.checked)
    assert "no plan of the 2 checked fits" in err.what and "runner-up #1" in err.what
    assert "more GPUs" in err.fix and "--memory-headroom" in err.fix


def test_check_refuses_no_workers_before_any_dry_run() -> None:
    plan = _plan(process_cluster(2), **BIG)
    with pytest.raises(autopar.AutoparError, match="workers"):
        check_plans(plan, workers=0)


def test_plan_check_prints_predicted_against_dry_run_and_saves_the_checked_plan(
        capsys, tmp_path) -> None:
    path = tmp_path / "plan.json"
    code = main(["plan", "--model", "tiny-gpt", "--cluster", "hgx-h100-80g",
                 "--global-batch", "16", "--keep", "1", "--check", "--workers", "1",
                 "--json", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "Dry-run check (autopar.check_plans): 2 plans" in out
    for needle in ("chosen plan: dp", "runner-up #1: dp", "predicted GiB", "dry run GiB",
                   "error", "fits", "kept chosen plan"):
        assert needle in out, needle
    assert "dropped" not in out
    saved = autopar.Plan.from_file(path)
    assert len(saved.alternatives) == 1 and saved.model_spec is not None
    assert json.loads(path.read_text())["config"] == saved.config.to_dict()


@pytest.mark.parametrize("argv, needle", [
    (["--check", "--workers", "0"], "workers=0 is not a positive whole number"),
    (["--workers", "2"], "--workers without --check"),
])
def test_plan_check_refuses_bad_workers_with_one_paragraph(capsys, argv, needle) -> None:
    code = main(["plan", "--model", "tiny-gpt", "--cluster", "hgx-h100-80g",
                 "--global-batch", "16", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("autopar plan: error: ") and needle in err and "Traceback" not in err


def test_importing_the_dry_run_module_leaves_autopar_dry_run_the_function() -> None:
    # in a fresh interpreter: this one has bound autopar.dry_run already, whichever way; the
    # module is imported by its own path and by its old one (autopar/_moved.py)
    code = ("import warnings; warnings.simplefilter('ignore')\n"
            "from autopar.dryrun.plan_check import check_plans\n"   # imports autopar.dryrun.run
            "import autopar, autopar.dry_run\n"
            "assert callable(autopar.dry_run) and autopar.dry_run.__name__ == 'dry_run', "
            "autopar.dry_run\n"
            "assert autopar.check_plans is check_plans\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_model_no_family_describes_is_checked_as_the_one_stage_it_runs() -> None:
    # a skip connection across blocks: no family describes it, its plans run the model whole
    from pathlib import Path

    spec = ModelSpec.parse(f"{Path(__file__).parents[2] / 'data' / 'nanogpt.py'}:make_skip")
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2), TrainSpec(global_batch=4,
                            seq_len=32), ParallelConfig(dp=2, zero=3), model_spec=spec)
    check = check_plans(plan, workers=1)
    (checked,) = check.checked
    assert checked.kept and checked.run is not None
    assert [r.blocks for r in checked.run.roles] == [4]  # the model's 4 blocks, held whole
