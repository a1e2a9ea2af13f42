"""autopar profile on 2 gloo processes, a couple of sizes: every table is measured, the file
round-trips, and an estimate on the profiled machine is priced from it. No timing is asserted
(only that each measured time is a positive number: CPU timings vary with the machine's load)."""

from __future__ import annotations

from autopar import models
from autopar.api import estimate
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import profile_cluster
from autopar.costmodel.profile import Profile, collective_key
from autopar.measure.profiling import Grid, profile

TINY = Grid(gemm_sizes=(16, 256), attention_seq=(16, 32), memory_elements=(2**10, 2**12),
            optimizer_params=(2**10, 2**18), collective_bytes=(2**10, 2**22),
            attention_heads=2, attention_head_dim=16, memory_width=64,
            grouped_rows=(8, 32), grouped_sizes=(16, 64), grouped_groups=2)


def test_profile_on_two_gloo_processes_measures_every_table(tmp_path):
    seen = []
    prof = profile(2, grid=TINY, min_s=0.0, max_reps=3, timeout_s=240,
                   progress=lambda done, total, what: seen.append((done, total)))
    assert prof.backend == "gloo" and prof.nproc == 2 and prof.compute_dtype == "tf32"
    assert len(prof.gemm.seconds) == 8 and all(s > 0 for s in prof.gemm.seconds)
    assert len(prof.grouped_gemm.seconds) == 8 and all(s > 0 for s in prof.grouped_gemm.seconds)
    assert prof.grouped_groups == 2 and prof.grouped_kernel == "torch._grouped_mm"
    for curve in (prof.attention_forward, prof.attention_backward, prof.memory, prof.optimizer):
        assert len(curve.seconds) == 2 and all(s > 0 for s in curve.seconds)
    kinds = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv")
    assert set(prof.collectives) == {collective_key(k, 2, 2) for k in kinds}
    path = tmp_path / "prof.json"
    prof.save(path)
    back = Profile.load(path)
    assert back.to_dict() == prof.to_dict()

    cluster = profile_cluster(back)
    model = models.build("gpt", num_layers=2, hidden_size=32, num_heads=2, vocab_size=64,
                         seq_len=16, device="meta")
    est = estimate(model, cluster, TrainSpec(global_batch=4, seq_len=16, precision="fp32"),
                   ParallelConfig(dp=2))
    assert est.measured["gemm"] == 1.0 and est.measured["all-reduce"] == 1.0
    # a MoE layer's experts priced by the measured grouped GEMMs
    moe = models.build("moe", num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=2,
                       ffn_hidden_size=16, num_experts=4, top_k=2, vocab_size=64, seq_len=16,
                       capacity_factor=None, device="meta")
    est = estimate(moe, cluster, TrainSpec(global_batch=4, seq_len=16, precision="fp32"),
                   ParallelConfig(dp=2))
    assert est.measured["grouped_gemm"] == 1.0
