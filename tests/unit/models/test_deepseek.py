"""The DeepSeek-V3-style family: sizes against the report, the dense layers outside the block
group, and the one-process model's MoE modes."""

from __future__ import annotations

import pytest
import torch

import autopar
from autopar import TrainSpec
from autopar.core.errors import AutoparError
from autopar.models.training import ModelSpec


def test_deepseek_v3_preset_counts_the_reports_671b_within_the_mla_difference():
    config = ModelSpec("deepseek-v3").build("meta").config
    # 61 layers x (GQA 205.5 M - MLA 187.0 M) = 1.1 B more than the report's 671 B main model
    assert config.num_params() == pytest.approx(671e9, rel=0.005)
    assert sum(p.numel() for p in ModelSpec("deepseek-v3").build("meta").parameters()) == \
        config.num_params()


def test_trace_groups_the_moe_layers_and_leaves_the_dense_ones_before_them():
    model = ModelSpec("tiny-deepseek").build("meta")
    graph = autopar.trace(model, TrainSpec(global_batch=2, seq_len=32))
    assert graph.blocks.path == "layers" and len(graph.blocks.instances) == 2
    workload = autopar.workload_of(model, TrainSpec(global_batch=2, seq_len=32))
    assert workload.num_blocks == 2
    assert workload.block.params_expert > 0 and workload.block.ep_dropless
    assert workload.pre.params > 256 * 64  # the embedding and the dense layer


def test_dropless_equals_a_capacity_that_drops_nothing():
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    dropless = ModelSpec("tiny-deepseek").build("cpu", 0)
    roomy = ModelSpec("tiny-deepseek", {"capacity_factor": 4.0}).build("cpu", 0)
    a, b = dropless(tokens, tokens), roomy(tokens, tokens)
    assert a.item() == pytest.approx(b.item(), rel=1e-6)
    a.backward()
    b.backward()
    for (name, p), (_, q) in zip(dropless.named_parameters(), roomy.named_parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-5), name


def test_load_balancing_loss_trains_the_router_without_entering_the_loss():
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    grads = []
    for coef in (0.0, 0.5):
        model = ModelSpec("tiny-moe", {"router_aux_loss_coef": coef}).build("cpu", 0)
        loss = model(tokens, tokens)
        loss.backward()
        grads.append((loss.item(), model.layers[0].moe.router.weight.grad.clone(),
                      model.layers[-1].moe.experts.w_up.grad.clone()))
    (l0, r0, e0), (l1, r1, e1) = grads
    assert l0 == l1  # the reported loss is the cross-entropy
    assert not torch.allclose(r0, r1)  # the router's gradient has the aux term
    assert torch.equal(e0, e1)  # the last experts, which feed no router, do not


def test_first_k_dense_must_leave_a_moe_layer():
    with pytest.raises(AutoparError, match="first_k_dense"):
        ModelSpec("tiny-deepseek", {"first_k_dense": 3}).build("meta")
