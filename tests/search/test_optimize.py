"""Branch-and-bound search over the outer space (cost model in the loop)."""

from __future__ import annotations

import dataclasses

import pytest

import autopar
from autopar.api import workload_of
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY
from autopar.search.optimize import search
from autopar.search.planner import strategies_of
from autopar.analysis.admissibility import ModelFacts


def _strategies(name: str, cluster: autopar.ClusterSpec, train: autopar.TrainSpec,
                heads: int):
    """(each candidate's workload under the strategies solved for its tp split, the facts)."""
    graph = autopar.trace(autopar.models.build(name, device="meta"), train)
    facts = ModelFacts(num_blocks=graph.num_blocks, num_heads=heads, layers=graph.layers)
    return strategies_of(graph, facts, name, cluster, train,
                         efficiency=DEFAULT_EFFICIENCY), facts


def test_search_beats_every_constrained_plan_and_honours_constraints() -> None:
    train = autopar.TrainSpec(global_batch=512, seq_len=2048)
    cluster = autopar.ClusterSpec.preset("dgx-a100-80g", nodes=4)
    work, shape = _strategies("gpt-1.7b", cluster, train, heads=24)
    free = search(work, shape, cluster, train)
    assert free.best and all(e.fits for e in free.best)
    times = [e.step_time_s for e in free.best]
    assert times == sorted(times)
    fixed = search(work, shape, cluster, train, {"tp": 2, "pp": 2, "checkpoint": "full"})
    assert fixed.best[0].config.tp == 2 and fixed.best[0].config.pp == 2
    assert fixed.best[0].config.checkpoint == "full"
    assert free.best[0].step_time_s <= fixed.best[0].step_time_s
    # the bound pruned most candidates without pricing them
    assert free.stats.pruned["bound"] > free.priced


def test_nothing_fits_reports_the_smallest_footprint() -> None:
    train = autopar.TrainSpec(global_batch=8, seq_len=2048)
    cluster = autopar.ClusterSpec.preset("dgx-a100-80g", nodes=1)
    work, facts = _strategies("gpt-175b", cluster, train, heads=96)
    result = search(work, facts, cluster, train)
    assert not result.best
    assert result.smallest is not None
    assert result.smallest.peak_memory_bytes > cluster.usable_hbm_bytes


def test_balanced_partition_gives_the_heavy_head_stage_fewer_blocks() -> None:
    from autopar.costmodel.pipeline import balanced_partition

    assert balanced_partition(96, 8, 1.0, 0.0, 0.0).blocks == (12,) * 8
    part = balanced_partition(126, 16, 1.0, 0.1, 3.0)
    assert sum(part.blocks) == 126 and part.blocks[-1] < min(part.blocks[:-1])
    times = [b + (0.1 if s == 0 else 0) + (3.0 if s == 15 else 0)
             for s, b in enumerate(part.blocks)]
    assert max(times) == 9.0  # the even split (8 x 14 + 7 x 2) would give 11


def test_memory_pressure_gives_a_per_block_checkpoint_mix() -> None:
    """Between "nothing recomputed does not fit" and "everything recomputed fits", the search
    recomputes only as many blocks of each stage as memory needs: faster than full."""
    from dataclasses import replace

    from autopar.search.optimize import _price

    model = autopar.models.build("gpt-1.7b", device="meta")
    train = autopar.TrainSpec(global_batch=64, seq_len=2048)
    work = workload_of(model, train)
    config = autopar.ParallelConfig(dp=8, tp=1, pp=1, micro_batch=8, zero=1)
    base = autopar.ClusterSpec.preset("dgx-a100-80g", nodes=1)
    none = autopar.estimate(work, base, train, config.with_(checkpoint="none"))
    full = autopar.estimate(work, base, train, config.with_(checkpoint="full"))
    # a GPU whose usable memory lies halfway between the two footprints
    middle = (none.peak_memory_bytes + full.peak_memory_bytes) / 2
    gpu = replace(base.gpu, hbm_bytes=int(middle) + (base.gpu.hbm_bytes - base.usable_hbm_bytes))
    cluster = replace(base, gpu=gpu)
    fit, _ = _price(work, cluster, train, config, DEFAULT_EFFICIENCY, False, None)
    assert fit is not None and fit.fits
    policies = fit.config.checkpoint
    assert isinstance(policies, tuple) and "full" in policies and len(set(policies)) == 2
    assert fit.step_time_s < autopar.estimate(work, cluster, train,
                                              config.with_(checkpoint="full")).step_time_s


def test_a_moe_model_just_short_of_memory_recomputes_its_moe_layers():
    """Mixtral 8x7B, dp 8 x ep 8 ZeRO-3: with memory just above what ``moe`` keeps (the
    experts' rows and activations dropped, attention kept), the search recomputes the MoE
    layers (``partial_policies``) and is faster than without that policy; a dense model is
    never offered it."""
    from dataclasses import replace

    from autopar.analysis.admissibility import facts_of
    from autopar.core.specs import Checkpoint
    from autopar.costmodel.step import estimate_step
    from autopar.search.optimize import _price, partial_policies

    model = autopar.models.build("mixtral-8x7b", device="meta")
    train = autopar.TrainSpec(global_batch=64, seq_len=4096)
    work = workload_of(model, train)
    config = autopar.ParallelConfig(dp=8, ep=8, micro_batch=1, zero=3)
    base = autopar.ClusterSpec.preset("hgx-h100-80g", nodes=1)
    peak = {p: estimate_step(work, base, train, config.with_(checkpoint=p)).peak_memory_bytes
            for p in ("none", "moe")}
    assert peak["moe"] < 0.8 * peak["none"]
    usable = peak["moe"] + 2**30
    gpu = replace(base.gpu, hbm_bytes=int(usable) + (base.gpu.hbm_bytes - base.usable_hbm_bytes))
    cluster = replace(base, gpu=gpu)
    partials = partial_policies(facts_of(model))
    assert Checkpoint.MOE in partials
    fit, _ = _price(work, cluster, train, config, DEFAULT_EFFICIENCY, False, None, partials)
    without, _ = _price(work, cluster, train, config, DEFAULT_EFFICIENCY, False, None)
    assert fit is not None and "moe" in fit.config.checkpoint_of(work.num_blocks)
    assert without is None or fit.step_time_s < without.step_time_s
    assert Checkpoint.MOE not in partial_policies(ModelFacts(num_blocks=2))


def test_floors_skip_only_what_cannot_place(monkeypatch) -> None:
    """Once ``keep`` plans are kept, a candidate that fits is priced only when its floor
    (``_floors_s``: the bound plus what every checkpoint choice pays at least on top) is not
    slower than the last of them, and a candidate that fits only with offload is priced again
    offloaded only when the twin's floor (its CPU optimizer step and host transfers included)
    is not: skipping those changes no kept plan (the same plans, in the same order, as a
    search that prices them all)."""
    import autopar.search.optimize as optimize

    train = autopar.TrainSpec(global_batch=64, seq_len=2048)
    cluster = autopar.ClusterSpec.preset("dgx-a100-40g", nodes=1)
    work, shape = _strategies("gpt-7.5b", cluster, train, heads=32)
    skipping = search(work, shape, cluster, train)
    assert skipping.stats.pruned.get("bound with offload", 0) > 0
    assert skipping.stats.pruned.get(optimize.FLOOR, 0) > 0
    monkeypatch.setattr(optimize, "_floors_s", lambda *a, **k: (0.0, 0.0))
    pricing_all = search(work, shape, cluster, train)
    assert "bound with offload" not in pricing_all.stats.pruned
    assert optimize.FLOOR not in pricing_all.stats.pruned
    assert [e.config for e in skipping.best] == [e.config for e in pricing_all.best]
    assert [e.step_time_s for e in skipping.best] == [e.step_time_s for e in pricing_all.best]


def test_tp_over_the_network_is_searched_only_when_the_domain_leaves_too_few_plans() -> None:
    """On 8-GPU nodes the candidates whose tp group spans nodes go unpriced when the others
    give ``keep`` fitting plans (counted under ``tp over the network``); a tp the constraints
    name is searched though it spans nodes; with one GPU a node and ``keep`` above what fits at
    tp 1 the spanning candidates are searched too."""
    from autopar.search.optimize import FAR_TP

    train = autopar.TrainSpec(global_batch=64, seq_len=1024)
    cluster = autopar.ClusterSpec.preset("dgx-a100-80g", nodes=4)
    # gpt-1.7b's shape with 32 heads, so that tp 16 and 32 divide them
    graph = autopar.trace(autopar.models.build("gpt-1.7b", device="meta", num_heads=32,
                                               num_layers=4), train)
    facts = ModelFacts(num_blocks=graph.num_blocks, num_heads=32, layers=graph.layers)

    def solved(c: autopar.ClusterSpec):
        return strategies_of(graph, facts, "gpt", c, train, efficiency=DEFAULT_EFFICIENCY)

    free = search(solved(cluster), facts, cluster, train)
    assert free.stats.pruned[FAR_TP] > 0 and len(free.best) == 4
    assert all(e.config.tp <= cluster.domain_gpus for e in free.best)
    named = search(solved(cluster), facts, cluster, train, {"tp": 16})
    assert named.best and named.best[0].config.tp == 16
    assert FAR_TP not in named.stats.pruned
    single = dataclasses.replace(cluster, gpus_per_node=1, nodes=32)
    few = search(solved(single), facts, single, train, {"pp": 1, "cp": 1}, keep=64)
    assert FAR_TP not in few.stats.pruned
    assert any(e.config.tp > 1 for e in few.best)


def test_candidates_over_memory_are_dropped_unpriced_once_a_plan_fits(monkeypatch) -> None:
    """Past the first fitting plan, a candidate whose stages cannot fit with full recomputation
    (nor offloaded) is dropped from its memory alone (``SpaceStats.pruned["memory"]``): the
    same plans, in the same order, as a search that prices every such candidate."""
    import autopar.search.optimize as optimize

    train = autopar.TrainSpec(global_batch=64, seq_len=2048)
    cluster = autopar.ClusterSpec.preset("dgx-a100-40g", nodes=1)
    work, shape = _strategies("gpt-7.5b", cluster, train, heads=32)
    skipping = search(work, shape, cluster, train)
    assert skipping.stats.pruned.get(optimize.OVER_MEMORY, 0) > 0
    monkeypatch.setattr(optimize, "exceeds_memory", lambda *a, **k: False)
    pricing_all = search(work, shape, cluster, train)
    assert optimize.OVER_MEMORY not in pricing_all.stats.pruned
    assert pricing_all.priced > skipping.priced
    assert [e.config for e in skipping.best] == [e.config for e in pricing_all.best]
    assert [e.step_time_s for e in skipping.best] == [e.step_time_s for e in pricing_all.best]


FLOOR_CASES = {
    "gpt": ("gpt-1.7b", 24, 2048, "dgx-a100-80g", 4, [
        *(dict(dp=32, zero=z, micro_batch=2) for z in (0, 1, 2, 3)),
        dict(dp=8, tp=2, cp=2, zero=3, micro_batch=1, sequence_parallel=True),
        dict(dp=4, tp=2, pp=4, zero=1, micro_batch=1, schedule="1f1b", sequence_parallel=True),
        dict(dp=8, pp=4, zero=1, micro_batch=1, schedule="interleaved", virtual_stages=2)]),
    "moe": ("tiny-moe", 4, 32, "hgx-h100-80g", 1, [
        dict(dp=8, ep=4, zero=1, micro_batch=1),
        dict(dp=4, tp=2, ep=4, zero=3, micro_batch=1, sequence_parallel=True),
        dict(dp=8, ep=2, zero=2, micro_batch=1, fusions=("ep_a2a_overlap",))]),
}


@pytest.mark.parametrize("case", FLOOR_CASES.values(), ids=FLOOR_CASES.keys())
def test_the_floor_is_below_every_checkpoint_choices_step_time(case) -> None:
    """``_floors_s`` (the bound plus ``step.floor_terms_s``) never exceeds the priced step time
    of any checkpoint choice, nor the twin's that of the offloaded one, on stages of every
    kind (ZeRO 0-3, cp, 1F1B and interleaved pipelines, experts with their all-to-alls
    overlapped or not)."""
    from autopar.core.specs import Checkpoint
    from autopar.costmodel.step import estimate_step
    from autopar.search.optimize import _bound_s, _floors_s, _stage_bounds

    name, heads, seq_len, preset, nodes, configs = case
    train = autopar.TrainSpec(global_batch=64, seq_len=seq_len)
    cluster = autopar.ClusterSpec.preset(preset, nodes=nodes)
    work, facts = _strategies(name, cluster, train, heads=heads)
    half = facts.num_blocks // 2
    policies = [Checkpoint.NONE, Checkpoint.SELECTIVE, Checkpoint.MATMULS, Checkpoint.MOE,
                Checkpoint.FULL, (Checkpoint.FULL,) * half + (Checkpoint.NONE,) * (facts.num_blocks - half)]
    for fields in configs:
        for policy in policies:
            c = autopar.ParallelConfig(**fields, checkpoint=policy)
            w = work(c)
            bound, part = _bound_s(w, c, train, cluster, DEFAULT_EFFICIENCY, {})
            stage_s, _ = _stage_bounds(w, c, train, cluster, DEFAULT_EFFICIENCY, {})
            part = part if c.pp > 1 else None
            own, twin = _floors_s(w, c, train, cluster, DEFAULT_EFFICIENCY, stage_s, part, True)
            for floor, offload in ((own, False), (twin, True)):
                step = estimate_step(w, cluster, train, c.with_(offload=offload),
                                     partition=part).step_time_s
                assert bound <= floor <= step * (1 + 1e-12), (c, offload, floor, step)
