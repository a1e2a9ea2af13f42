"""The measured profile (costmodel/profile.py): interpolation, its file, and the estimate using it."""

from __future__ import annotations

import json
import math

import pytest

from autopar import models
from autopar.api import estimate, workload_of
from autopar.core.errors import AutoparError
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import ClusterSpec, profile_cluster
from autopar.costmodel.profile import FORMAT_VERSION, Curve, GemmGrid, Profile, collective_key


def _profile(**tables) -> Profile:
    return Profile("cpu: test", "tf32", "2.13.0", None, "2026-11-23T00:00:00+00:00", "gloo", 4,
                   host_memory_bytes=16 * 2**30, **tables)


def test_curve_is_exact_at_measured_points_and_none_outside():
    c = Curve.of([1e3, 1e4, 1e6], [1e-4, 3e-4, 2e-2])
    assert [c.at(x) for x in c.x] == list(c.seconds)
    assert c.at(999.0) is None and c.at(1.01e6) is None and c.at(0.0) is None


def test_curve_is_monotone_between_points_and_linear_in_log_log():
    c = Curve.of([1e3, 1e5], [1e-4, 1e-2])
    xs = [10 ** (3 + i / 10) for i in range(21)]
    ys = [c.at(x) for x in xs]
    assert all(b >= a for a, b in zip(ys, ys[1:]))
    assert c.at(1e4) == pytest.approx(1e-3)  # the log-log midpoint


def test_gemm_grid_is_exact_at_grid_points_monotone_between_and_none_outside():
    sizes = [64.0, 512.0, 4096.0]
    seconds = [m * n * k * 1e-10 + 1e-6 for m in sizes for n in sizes for k in sizes]
    g = GemmGrid.of(sizes, sizes, sizes, seconds)
    for i, m in enumerate(sizes):
        for j, n in enumerate(sizes):
            for k, d in enumerate(sizes):
                assert g.at(m, n, d) == pytest.approx(seconds[(i * 3 + j) * 3 + k], rel=1e-12)
    ys = [g.at(m, 512.0, 512.0) for m in (64, 100, 200, 300, 512, 1000, 4096)]
    assert all(b > a for a, b in zip(ys, ys[1:]))
    assert g.at(32, 512, 512) is None and g.at(512, 8192, 512) is None


def test_profile_round_trips_through_json(tmp_path):
    p = _profile(gemm=GemmGrid.of([1, 2], [1, 2], [1, 2], [1e-6] * 8),
                 memory=Curve.of([1, 10], [1e-6, 2e-6]),
                 collectives={collective_key("all-reduce", 4, 4): Curve.of([4, 8], [1e-4, 2e-4])})
    path = tmp_path / "prof.json"
    p.save(path)
    back = Profile.load(path)
    assert back.to_dict() == p.to_dict()
    assert back.collective_s("all-reduce", 8, 4, 4) == pytest.approx(2e-4)
    assert back.collective_s("all-reduce", 8, 4, 2) is None  # a layout not measured


@pytest.mark.parametrize("version", [0, FORMAT_VERSION + 1, None, "1"])
def test_profile_of_another_format_version_is_refused(tmp_path, version):
    data = _profile().to_dict()
    data["format_version"] = version
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AutoparError, match="format_version") as err:
        Profile.load(path)
    assert "autopar profile" in err.value.fix


def test_profile_with_unsorted_sizes_is_refused():
    with pytest.raises(AutoparError, match="ascending"):
        Curve.of([10, 1], [1e-3, 1e-4])


def _tiny():
    model = models.build("gpt", num_layers=2, hidden_size=64, num_heads=4, vocab_size=256,
                         seq_len=32, device="meta")
    return model, TrainSpec(global_batch=8, seq_len=32, precision="fp32")


def _uniform_gemm(seconds: float) -> GemmGrid:
    return GemmGrid.of([1, 1e7], [1, 1e7], [1, 1e7], [seconds] * 8)


def test_estimate_takes_each_linear_gemm_time_from_the_profile():
    """A linear layer is three GEMMs per micro-batch (forward, input and weight gradient):
    doubling every measured GEMM time adds 3 x T per linear op and micro-batch to compute."""
    model, train = _tiny()
    config = ParallelConfig(dp=4, micro_batch=1)
    base = profile_cluster(_profile(gemm=_uniform_gemm(1e-3),
                                    memory=Curve.of([1, 1e12], [1e-6, 1e-6])))
    t = 1e-3
    one = estimate(model, base, train, config)
    two = estimate(model, base.with_profile(_profile(gemm=_uniform_gemm(2 * t),
                                                     memory=Curve.of([1, 1e12], [1e-6, 1e-6]))),
                   train, config)
    work = workload_of(model, train)
    linears = (sum(o.op == "linear" for o in work.pre.ops + work.post.ops)
               + work.num_blocks * sum(o.op == "linear" for o in work.block.ops))
    m = one.num_microbatches
    delta = two.time_breakdown["compute"] - one.time_breakdown["compute"]
    assert linears > 0 and delta == pytest.approx(3 * t * linears * m, rel=1e-9)
    assert one.measured["gemm"] == 1.0 and one.measured["memory-bound"] == 1.0
    assert one.measured["attention"] == 0.0  # not in the profile: analytical


def test_estimate_without_a_profile_marks_nothing_measured():
    model, train = _tiny()
    est = estimate(model, ClusterSpec.preset("hgx-h100-80g"), train, ParallelConfig(dp=8))
    assert est.measured == {}


def test_collective_outside_the_measured_sizes_is_priced_analytically():
    model, train = _tiny()
    tiny = Curve.of([1, 2], [1.0, 1.0])  # one second, but only for 1-2 bytes
    cluster = ClusterSpec.preset("hgx-h100-80g").with_nodes(1)
    cluster = cluster.__class__(**{**cluster.__dict__, "gpus_per_node": 4})
    prof = _profile(collectives={collective_key("all-reduce", 4, 4): tiny})
    with_prof = estimate(model, cluster.with_profile(prof), train, ParallelConfig(dp=4))
    without = estimate(model, cluster, train, ParallelConfig(dp=4))
    assert with_prof.measured["all-reduce"] == 0.0
    assert with_prof.step_time_s == pytest.approx(without.step_time_s, rel=1e-12)


def test_profile_cluster_takes_its_figures_from_the_measurements():
    prof = _profile(gemm=GemmGrid.of([1, 1000], [1, 1000], [1, 1000], [1e-1] * 7 + [0.04]),
                    memory=Curve.of([1e6, 1e8], [1e-3, 5e-3]),
                    collectives={collective_key("send-recv", 2, 2):
                                 Curve.of([1e3, 1e7], [1e-4, 1e-2])})
    c = profile_cluster(prof)
    assert c.gpu.peak("tf32") == pytest.approx(2 * 1000**3 / 0.04)
    assert c.gpu.hbm_bytes_per_s == pytest.approx(2e10)
    assert c.intra_node.bytes_per_s == pytest.approx(1e9)
    assert c.intra_node.latency_s == pytest.approx(1e-4)
    assert c.num_gpus == 4 and c.profile is prof
    assert math.isclose(c.gpu.hbm_bytes, 4 * 2**30 - 512 * 2**20)


def test_closed_loop_bench_plans_cover_the_issue_and_are_priced_from_its_profile():
    """bench/closed_loop_cpu.py's plans: at least 8, dp, tp with sp, every pipeline schedule,
    ZeRO-3 and each checkpoint policy, each admissible and priced mostly from the profile."""
    from pathlib import Path

    from bench_scripts import load

    bench = load("closed_loop_cpu", "closed_loop_cpu")
    cluster = profile_cluster(Profile.load(Path(__file__).resolve().parents[3] / "bench" /
                                           "results" / "profile_cpu_4proc.json"))
    plans = {name: bench._plan(name, cluster) for name in bench.PLANS}
    configs = [p.config for p in plans.values()]
    assert len(plans) >= 8
    assert {str(c.schedule) for c in configs if c.pp > 1} == {"1f1b", "gpipe", "interleaved"}
    assert any(c.tp > 1 and c.sequence_parallel for c in configs)
    assert any(c.zero == 3 for c in configs)
    assert {str(c.checkpoint) for c in configs} >= {"none", "full", "selective"}
    for plan in plans.values():
        assert plan.estimate.measured["gemm"] == 1.0


def test_one_process_measures_no_collective_and_a_gpu_takes_the_gpu_grid():
    from autopar.measure.profiling import FULL, GPU
    from autopar.measure.profiling_worker import groups_of, point_count

    job = {k: list(v) if isinstance(v, tuple) else v for k, v in GPU.__dict__.items()}
    grid_points = (len(GPU.gemm_sizes) ** 3 + len(GPU.grouped_rows) * len(GPU.grouped_sizes) ** 2
                   + 2 * len(GPU.attention_seq)
                   + len(GPU.memory_elements) + len(GPU.optimizer_params))
    assert groups_of(1) == [] and point_count(job, 1) == grid_points
    assert groups_of(4) == [4, 2]
    assert point_count(job, 4) == grid_points + len(GPU.collective_bytes) * (4 * 2 + 1)
    # the GPU grid covers a 1B-class model's GEMMs (8192 tokens x hidden 2048 x FFN 8192),
    # which the CPU grid does not
    assert max(GPU.gemm_sizes) >= 8192 > max(FULL.gemm_sizes)
