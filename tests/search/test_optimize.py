"""Branch-and-bound search over the outer space (cost model in the loop)."""

from __future__ import annotations

import autopar
from autopar.api import workload_of
from autopar.search.optimize import search
from autopar.search.space import ModelShape


def test_search_beats_every_constrained_plan_and_honours_constraints() -> None:
    model = autopar.models.build("gpt-1.7b", device="meta")
    train = autopar.TrainSpec(global_batch=512, seq_len=2048)
    cluster = autopar.ClusterSpec.preset("dgx-a100-80g", nodes=4)
    work = workload_of(model, train)
    shape = ModelShape(num_blocks=24, num_heads=24)
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
    model = autopar.models.build("gpt-175b", device="meta")
    train = autopar.TrainSpec(global_batch=8, seq_len=2048)
    cluster = autopar.ClusterSpec.preset("dgx-a100-80g", nodes=1)
    work = workload_of(model, train)
    result = search(work, ModelShape(num_blocks=96, num_heads=96), cluster, train)
    assert not result.best
    assert result.smallest is not None
    assert result.smallest.peak_memory_bytes > cluster.usable_hbm_bytes
