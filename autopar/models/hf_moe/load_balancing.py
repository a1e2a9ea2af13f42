"""transformers' load-balancing loss (``output_router_logits``) as a gradient at each router.

With ``output_router_logits`` set, transformers' CausalLM adds ``router_aux_loss_coef *
load_balancing_loss_func(router_logits of every sparse layer, E, top_k)`` to the loss:

    aux = E * sum_e (A_e / N) * (B_e / N)

over the N = layers x tokens rows of all sparse layers' logits of one forward, ``A_e`` the
top-k assignments to expert e (top-k of ``softmax(logits)``), ``B_e`` the sum of the
probabilities ``softmax(logits)[:, e]``. ``A`` has no gradient, so the loss's gradient reaches
each layer's logits through its own ``B_l`` only: ``d aux / d B_l,e = E * A_e / N^2`` with the
counts ``A`` of *every* layer. The routers here keep no loss tensor: each router's forward
records its layer's counts and rows (``_Counts``), and an identity on its routing weights
(``_LoadBalancingGrad``, as the zoo's ``models/moe`` ``_AuxLossGrad``: Megatron-Core's
``MoEAuxLossAutoScaler``) adds ``coef * aux_loss_grad_scale * E * A / N^2`` as the gradient of
``B_l`` in the backward, when every layer has recorded. So no stage computes the loss's value
(the training loss reported stays the cross-entropy) and activation checkpointing recomputes
the same counts. The counts of one forward must all be known before its backward: the model
runs in one pipeline stage (``admissibility``'s ``cross_stage_loss``); data, tensor and
expert parallelism keep it exact (each rank routes its own micro-batch with the whole router,
as the one process does per micro-batch).
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.models.hf_moe.parts import sparse_blocks
from autopar.models.routing import router_loss_reason


class _Counts:
    """Each sparse layer's top-k assignments per expert and rows of the latest forward."""

    def __init__(self) -> None:
        self.layers: dict[int, tuple[torch.Tensor, int]] = {}

    def coefficient(self, num_experts: int) -> torch.Tensor:
        """``E * A / N^2``: the gradient of ``aux`` by each layer's probability sums."""
        counts = torch.stack([c for c, _ in self.layers.values()]).sum(dim=0)
        rows = sum(r for _, r in self.layers.values())
        return counts * (num_experts / rows**2)


class _LoadBalancingGrad(torch.autograd.Function):
    """Identity on the routing weights whose backward adds ``scale * E * A / N^2`` as the
    gradient of the layer's probability sums ``B_l``."""

    @staticmethod
    def forward(ctx, weights: torch.Tensor, prob_sums: torch.Tensor, counts: _Counts,
                num_experts: int, scale: float) -> torch.Tensor:
        ctx.counts, ctx.num_experts, ctx.scale = counts, num_experts, scale
        return weights.view_as(weights)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        coefficient = ctx.counts.coefficient(ctx.num_experts) * ctx.scale
        return grad, coefficient.to(grad.device), None, None, None


class _RouterHook:
    """A sparse block's router forward hook (a class, so that ``copy.deepcopy`` of the model
    copies it with the block and the counts)."""

    def __init__(self, block: nn.Module, layer: int, counts: _Counts, num_experts: int,
                 top_k: int, coef: float) -> None:
        self.block, self.layer, self.counts = block, layer, counts
        self.num_experts, self.top_k, self.coef = num_experts, top_k, coef

    def __call__(self, router: nn.Module, args: tuple, output: tuple) -> tuple:
        logits, weights, indices = output
        # load_balancing_loss_func's own steps: softmax in the logits' dtype, its top-k
        probs = torch.softmax(logits, dim=-1)
        _, chosen = torch.topk(probs, self.top_k, dim=-1)
        assigned = torch.histc(chosen.reshape(-1).float(), bins=self.num_experts, min=0,
                               max=self.num_experts)
        self.counts.layers[self.layer] = (assigned.detach(), logits.shape[0])
        scale = self.coef * self.block.aux_loss_grad_scale
        weights = _LoadBalancingGrad.apply(weights, probs.float().sum(dim=0), self.counts,
                                           self.num_experts, scale)
        return logits, weights, indices


def router_loss_problem(model: nn.Module) -> str | None:
    """Why context parallelism cannot run ``model`` (``Family.context_problem``): each cp rank
    routes only its chunks of the sequence (``router_loss_reason``)."""
    return router_loss_reason(getattr(model, "config", None))


def install_load_balancing(model: nn.Module) -> None:
    """Give ``model``'s routers transformers' load-balancing loss when its config sets
    ``output_router_logits`` (``router_aux_loss_coef`` > 0); each sparse block gets
    ``aux_loss_grad_scale`` (``models.set_aux_loss_grad_scale``). Once per model."""
    config = getattr(model, "config", None)
    coef = float(getattr(config, "router_aux_loss_coef", 0.0) or 0.0)
    if not getattr(config, "output_router_logits", False) or coef == 0.0:
        return
    blocks = sparse_blocks(model)
    if any(hasattr(b, "aux_loss_grad_scale") for b in blocks):
        return
    counts = _Counts()
    top_k = int(config.num_experts_per_tok)
    for layer, block in enumerate(blocks):
        block.aux_loss_grad_scale = 1.0
        num_experts = block.gate.weight.shape[0]
        block.gate.register_forward_hook(
            _RouterHook(block, layer, counts, num_experts, top_k, coef))
