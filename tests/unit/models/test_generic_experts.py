"""A hand-written mixture of experts in a user's decoder (``models/generic/experts.py``):
recognised on the module tree with the top-k its code routes by, priced as a dropless layer
on its mean rows (expert parameters divided by ep, the all-to-all of the whole dispatch
buffer), planned with expert and context parallelism and without tensor parallelism; a layer
with anything else beside its router and experts is not recognised."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autopar import AutoparError, ParallelConfig, TrainSpec
from autopar.analysis.admissibility import facts_of, problems
from autopar.core.model_spec import ModelSpec
from autopar.models import family_of
from autopar.models.generic.experts import MoEForward, install, listed_moe, top_k
from autopar.analysis.tracing import trace
from autopar.analysis.workload import build_workload

NANOMOE = Path(__file__).resolve().parents[2] / "data" / "nanomoe.py"
TRAIN = TrainSpec(global_batch=8, seq_len=32, precision="fp32")


def _model(factory: str = "make", device: str = "meta") -> torch.nn.Module:
    return ModelSpec.parse(f"{NANOMOE}:{factory}").build(device, 0)


def test_the_layers_their_experts_and_top_k_are_found():
    model = _model()
    layers = listed_moe(model)
    assert [(m.path, m.experts, m.num_experts) for m in layers] == [
        ("h.0.moe", "experts", 4), ("h.1.moe", "experts", 4)]
    assert [top_k(m) for m in layers] == [2, 2]
    assert not listed_moe(_model("make_shared"))  # a shared expert beside them: not one


def test_the_trace_prices_a_dropless_layer_on_its_mean_rows():
    model = _model()
    g = trace(model, TRAIN, batch=2)
    per_expert = sum(p.numel() for p in model.h[0].moe.experts[0].parameters())
    assert len(g.expert_params) == 2 * 4 * 4  # 2 layers x 4 experts x (2 weights, 2 biases)
    block = build_workload(g, 4.0).block
    assert block.ep_dropless
    assert block.params_expert == 4 * per_expert
    tokens = 2 * TRAIN.seq_len
    mean_rows = -(-2 * tokens // 4)  # ceil(k T / E)
    # the all-to-all moves the whole (E * mean rows, h) dispatch buffer, per sequence
    assert block.ep_alltoall_elements == pytest.approx(4 * mean_rows * 64 / 2)
    assert "forward" not in model.h[0].moe.__dict__  # the trace took its forward back


def test_expert_and_context_parallel_plans_are_admissible_and_tensor_parallel_ones_not():
    facts = facts_of(_model())
    assert facts.num_experts == 4 and facts.token_routing
    assert problems(facts, ParallelConfig(dp=4, ep=2), TRAIN) == []
    assert problems(facts, ParallelConfig(dp=2, cp=2, ep=4), TRAIN) == []
    refused = problems(facts, ParallelConfig(dp=2, tp=2), TRAIN)
    assert refused and "expert parallelism" in refused[0].what


def test_the_layer_runs_the_users_forward_until_expert_parallelism_dispatches():
    torch.manual_seed(0)
    model = _model(device="cpu")
    tokens = torch.randint(0, 256, (2, 16))
    before = model(tokens)
    assert len(install(model)) == 2 and family_of(model).name == "generic"
    assert isinstance(model.h[1].moe.__dict__["forward"], MoEForward)
    torch.testing.assert_close(model(tokens), before, rtol=0, atol=0)


def test_an_expert_of_another_rank_is_a_clear_error_when_called():
    from autopar.models.generic.experts import OtherRankExpert

    with pytest.raises(AutoparError, match="lives on ep rank 1"):
        OtherRankExpert(3, 1)(torch.zeros(1, 4))
