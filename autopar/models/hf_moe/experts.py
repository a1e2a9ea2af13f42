"""transformers' stacked-weights experts as expert parallelism sees them (``ExpertLayer``).

Under expert parallelism the experts module's ``forward(hidden, top_k_index, top_k_weights)``
becomes the dispatch (``passes/expert_parallel.py``): the block's router has already chosen,
on this rank's own tokens, exactly as in one process; the dispatch sends the rows to the
experts' owners, which run ``run`` -- each local expert's ``act_fn(gate) * up`` then ``down``
on its rows, the math of transformers' eager loop -- and brings them back weighted. The
forward is replaced on the module itself, so FSDP2's hooks on it still gather the weights
first. transformers' experts drop nothing: ``capacity_factor`` is ``None`` (dropless).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autopar.models.expert_layers import Dispatch, ExpertLayer
from autopar.models.hf_moe.parts import EXPERT_WEIGHTS, sparse_blocks
from autopar.models.routing import local_weight


def expert_layers(module: nn.Module) -> list[ExpertLayer]:
    """Every sparse MoE block under ``module`` (a model or a pipeline stage), in order."""
    return [_expert_layer(block) for block in sparse_blocks(module)]


def _expert_layer(block: nn.Module) -> ExpertLayer:
    experts = block.experts
    num_experts, top_k = block.gate.weight.shape[0], block.gate.top_k

    def run(x: torch.Tensor, counts: list[int] | None, grad_scale: float) -> torch.Tensor:
        gate_up = local_weight(experts.gate_up_proj, grad_scale)  # (E_local, 2I, h)
        down = local_weight(experts.down_proj, grad_scale)  # (E_local, h, I)
        if counts is None:  # (E_local, C, h)
            gate, up = torch.bmm(x, gate_up.transpose(1, 2)).chunk(2, dim=-1)
            return torch.bmm(experts.act_fn(gate) * up, down.transpose(1, 2))
        outs = []
        for i, rows in enumerate(torch.split(x, counts)):
            gate, up = F.linear(rows, gate_up[i]).chunk(2, dim=-1)
            outs.append(F.linear(experts.act_fn(gate) * up, down[i]))
        return torch.cat(outs)

    def install(dispatch: Dispatch | None) -> None:
        if dispatch is None:
            experts.__dict__.pop("forward", None)
            return

        def forward(hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
            return dispatch(hidden_states, top_k_index, top_k_weights).to(hidden_states.dtype)

        experts.forward = forward

    # the sparse block flattens its hidden states to (b * s, h) tokens before its router, its
    # experts and its shared expert: it runs on a rank's sequence shard as on the whole
    return ExpertLayer(experts=experts, weights=EXPERT_WEIGHTS, num_experts=num_experts,
                       top_k=top_k, capacity_factor=None, run=run, install=install,
                       module=block)
