"""transformers' load-balancing loss (``output_router_logits``) on the ``hf-moe`` family
(``models/hf_moe/load_balancing.py``): the routers' gradient hook gives the gradients of
transformers' own ``cross-entropy + router_aux_loss_coef * aux_loss`` while the model's loss
stays the cross-entropy; pipeline stages are refused."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.core.errors import AutoparError
from autopar.costmodel.cluster import process_cluster
from autopar.models import prepare_training, set_aux_loss_grad_scale
from autopar.models.training import ModelSpec, synthetic_batch

pytest.importorskip("transformers")

CONFIG = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
          "num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2,
          "moe_intermediate_size": 32, "intermediate_size": 128,
          "shared_expert_intermediate_size": 64, "max_position_embeddings": 64,
          "mlp_only_layers": [1], "output_router_logits": True, "router_aux_loss_coef": 0.5}
SPEC = ModelSpec.transformers_config("Qwen2MoeForCausalLM", CONFIG)
_SHAPE = {k: v for k, v in CONFIG.items() if k not in ("num_experts", "moe_intermediate_size",
                                                        "shared_expert_intermediate_size",
                                                        "mlp_only_layers", "intermediate_size")}
SPECS = {
    "qwen2-moe": SPEC,
    "qwen3-moe": ModelSpec.transformers_config("Qwen3MoeForCausalLM", {
        **_SHAPE, "num_experts": 4, "moe_intermediate_size": 32, "intermediate_size": 128,
        "head_dim": 16}),
    "mixtral": ModelSpec.transformers_config("MixtralForCausalLM", {
        **_SHAPE, "num_local_experts": 4, "intermediate_size": 32}),
}
GRAD_REL = 1e-5
"""fp32, one process: the hook's gradient and autograd's through transformers' loss sum the
same terms in another order. Measured: 0 (bit for bit)."""


def _grads(model, loss_of) -> dict[str, torch.Tensor]:
    tokens, targets = synthetic_batch(0, 2, 16, 256)
    loss_of(model, tokens, targets).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _cross_entropy(model, tokens, targets):
    return F.cross_entropy(model(tokens).logits.flatten(0, 1), targets.flatten())


def _transformers_loss(model, tokens, targets):
    """transformers' own: with output_router_logits it computes ``aux_loss``
    (``load_balancing_loss_func``) and, given labels, adds ``router_aux_loss_coef`` times it."""
    out = model(tokens)
    ce = F.cross_entropy(out.logits.flatten(0, 1), targets.flatten())
    return ce + CONFIG["router_aux_loss_coef"] * out.aux_loss


def _worst(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    assert got.keys() == want.keys()
    return max(((g - w).abs().max() / w.abs().max().clamp_min(1e-30)).item()
               for g, w in ((got[k], want[k]) for k in want))


@pytest.mark.parametrize("name", list(SPECS))
def test_the_router_hook_trains_transformers_load_balancing_loss(name):
    torch.set_flush_denormal(True)
    spec = SPECS[name]
    plain = spec.build("cpu", seed=3)
    hooked = copy.deepcopy(plain)
    prepare_training(hooked)
    want = _grads(plain, _transformers_loss)
    got = _grads(hooked, _cross_entropy)  # the aux loss's gradient comes from the hooks
    assert _worst(got, want) <= GRAD_REL
    # and it matters: the cross-entropy alone moves the routers otherwise
    alone = _grads(spec.build("cpu", seed=3), _cross_entropy)
    router = "model.layers.0.mlp.gate.weight"
    assert ((alone[router] - want[router]).abs().max() / want[router].abs().max()) > 100 * GRAD_REL


def test_the_hook_scales_with_the_loss_and_survives_a_copy():
    """What the program multiplies the loss by (1/micro-batches, the fp16 scale) scales the
    aux gradient too (``set_aux_loss_grad_scale``); ``verify``'s reference deep-copies the
    model for a low-precision run."""
    torch.set_flush_denormal(True)
    plain = SPEC.build("cpu", seed=3)
    want = _grads(plain, lambda m, x, y: _transformers_loss(m, x, y) * 0.25)
    hooked = SPEC.build("cpu", seed=3)
    prepare_training(hooked)
    prepare_training(hooked)  # once per model
    copied = copy.deepcopy(hooked)
    set_aux_loss_grad_scale(copied, 0.25)
    got = _grads(copied, lambda m, x, y: _cross_entropy(m, x, y) * 0.25)
    assert _worst(got, want) <= GRAD_REL


def test_pipeline_stages_are_refused_with_the_reason():
    train = TrainSpec(global_batch=4, seq_len=16, precision="fp32")
    # the dense layer first: the sparse ones are one run of blocks a pipeline could cut
    model = ModelSpec.transformers_config("Qwen2MoeForCausalLM",
                                          {**CONFIG, "mlp_only_layers": [0]}).build("meta")
    with pytest.raises(AutoparError) as err:
        autopar.plan_for(model, process_cluster(4), train, ParallelConfig(dp=2, pp=2),
                         name=SPEC.label)
    assert "output_router_logits" in err.value.what and err.value.where == "pp"
    plan = autopar.plan_for(model, process_cluster(2), train, ParallelConfig(dp=2, ep=2),
                            name=SPEC.label)
    assert plan.config.ep == 2


def test_context_parallelism_is_refused_with_the_reason():
    # each cp rank routes only its chunks of the sequence; the loss counts a whole micro-batch
    train = TrainSpec(global_batch=4, seq_len=16, precision="fp32")
    with pytest.raises(AutoparError) as err:
        autopar.plan_for(SPEC.build("meta"), process_cluster(2), train, ParallelConfig(cp=2),
                         name=SPEC.label)
    assert "output_router_logits" in err.value.what and err.value.where == "cp"
