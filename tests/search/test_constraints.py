"""Constraints are honoured: a fixed ``ParallelConfig`` field appears in the plan and in every
runner-up, the constrained plan is never faster than the free one, and a constraint that is
unknown or cannot be met raises ``AutoparError``.

GPT-1.7B (24 blocks, 24 heads) on 2 DGX A100 nodes, global batch 64 x 2048 tokens: small enough
for a fraction of a second per search, big enough that every decision has more than one value.
"""

from __future__ import annotations

import pytest

import autopar
from autopar import AutoparError, ClusterSpec, Plan, TrainSpec

REL = 1e-9
"""Relative float tolerance on step-time comparisons."""
HALF = ("full",) * 12 + ("none",) * 12
"""A per-block checkpoint policy for the 24 blocks."""


@pytest.fixture(scope="module")
def model():
    return autopar.models.build("gpt-1.7b", device="meta")


@pytest.fixture(scope="module")
def cluster() -> ClusterSpec:
    return ClusterSpec.preset("dgx-a100-80g", nodes=2)


@pytest.fixture(scope="module")
def train() -> TrainSpec:
    return TrainSpec(global_batch=64, seq_len=2048)


@pytest.fixture(scope="module")
def free(model, cluster, train) -> Plan:
    return autopar.optimize(model, cluster, train)


def _honours(plan: Plan, constraints: dict[str, object]) -> None:
    for p in (plan, *plan.alternatives):
        for key, want in constraints.items():
            got = getattr(p.config, key)
            assert got == want, f"{p.summary()}: {key}={got!r}, constrained to {want!r}"
        assert p.estimate.fits, p.summary()


def _no_faster(plan: Plan, free: Plan) -> None:
    assert plan.estimate.step_time_s >= free.estimate.step_time_s * (1 - REL), (
        f"constrained {plan.summary()} {plan.estimate.step_time_s:.4f} s beats the free plan "
        f"{free.summary()} {free.estimate.step_time_s:.4f} s")



@pytest.mark.parametrize("constraints", [
    {"tp": 2},
    {"pp": 2},
    {"dp": 4},
    {"cp": 2},
    {"zero": 0},
    {"zero": 2},
    {"micro_batch": 2},
    {"dp": 2, "micro_batch": 32},       # beyond the search's own menu of sizes
    {"num_microbatches": 8},
    {"schedule": "1f1b"},
    {"schedule": "gpipe"},
    {"schedule": "interleaved"},
    {"pp": 2, "schedule": "gpipe"},
    {"pp": 2, "virtual_stages": 3},
    {"pp": 2, "virtual_stages": 12},    # beyond the search's own menu of chunks
    {"virtual_stages": 2},              # needs pp > 1: the search must not drop it
    {"checkpoint": "selective"},
    {"checkpoint": "full"},
    {"checkpoint": HALF},
    {"tp": 2, "sequence_parallel": True},
    {"tp": 2, "sequence_parallel": False},
    {"sequence_parallel": True},  # tp must then be > 1
    {"offload": True},
    {"offload": False},
    {"fusions": ("scale_mask_softmax", "bias_dropout_add")},
    {"tp": 2, "pp": 2, "schedule": "interleaved", "checkpoint": "full"},
], ids=lambda c: ",".join(f"{k}={v if k != 'checkpoint' or isinstance(v, str) else 'per-block'}"
                          for k, v in c.items()))
def test_constraint_appears_in_the_plan_and_costs_time(constraints, model, cluster, train,
                                                       free) -> None:
    plan = autopar.optimize(model, cluster, train, constraints)
    _honours(plan, constraints)
    _no_faster(plan, free)
    if "num_microbatches" in constraints:
        assert plan.estimate.num_microbatches == constraints["num_microbatches"]


def test_expert_parallel_constraint_on_a_moe_model() -> None:
    moe = autopar.models.build("tiny-moe", device="meta")
    cluster = ClusterSpec.preset("hgx-h100-80g", nodes=1)
    train = TrainSpec(global_batch=64, seq_len=32)
    free = autopar.optimize(moe, cluster, train)
    for ep in (2, 4):
        plan = autopar.optimize(moe, cluster, train, {"ep": ep})
        _honours(plan, {"ep": ep})
        _no_faster(plan, free)


def test_free_plan_fits_and_leads_its_runner_ups(free) -> None:
    assert free.estimate.fits
    times = [p.estimate.step_time_s for p in (free, *free.alternatives)]
    assert times == sorted(times)


def test_unknown_constraint_key_is_an_error_naming_it(model, cluster, train) -> None:
    with pytest.raises(AutoparError, match="tensor_parallel"):
        autopar.optimize(model, cluster, train, {"tensor_parallel": 2})


@pytest.mark.parametrize("constraints", [
    {"tp": 3},                                  # 3 does not divide 8 GPUs
    {"dp": 4, "tp": 4},                         # 16 GPUs on an 8-GPU node
    {"tp": 16},                                 # more than the GPUs
    {"pp": 25},                                 # more stages than the 24 blocks
    {"micro_batch": 3},                         # divides no per-replica batch of 64
    {"num_microbatches": 5},                    # 5 does not divide 64
    {"zero": 5},                                # not a ZeRO stage
    {"checkpoint": "most"},                     # not a policy
    {"schedule": "zigzag"},                     # not a schedule
    {"schedule": "1f1b", "virtual_stages": 2},  # model chunks need the interleaved schedule
    {"tp": "2"},                                # not an integer
], ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_contradictory_constraint_is_an_error(constraints, model, train) -> None:
    one_node = ClusterSpec.preset("dgx-a100-80g", nodes=1)
    with pytest.raises(AutoparError):
        autopar.optimize(model, one_node, train, constraints)
