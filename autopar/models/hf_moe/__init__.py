"""The ``hf-moe`` family: transformers' mixture-of-experts decoders laid out like Llama,
built by transformers itself.

Covered (recognised by layout, ``parts.py``, not by class): ``Qwen2MoeForCausalLM`` (routed
experts plus a sigmoid-gated shared expert, dense ``mlp_only_layers`` allowed),
``Qwen3MoeForCausalLM`` and ``MixtralForCausalLM`` -- Llama-style attention and a sparse MoE
block whose ``experts`` are transformers' stacked ``gate_up_proj``/``down_proj`` called as
``experts(hidden, top_k_index, top_k_weights)`` (dropless). Pipeline stages call the blocks
as ``hf_llama`` does (its ``ModelParts``, imported); the plan's blocks are the repeated sparse
layers, a dense layer before them (``mlp_only_layers=[0]``) runs on the first stage, and dense
and sparse layers alternating (``decoder_sparse_step=2``) plan pp = 1 only
(``models.blocks.BlockSpan``); tensor parallelism splits attention and
the dense and shared-expert MLPs as there, and keeps the router and the experts whole on every
tp rank; expert parallelism shards the stacked weights over the ep ranks and routes through
the one all-to-all dispatch (``experts.py``, ``passes/expert_parallel.py``). Context
parallelism runs the attention as ``hf_llama``'s (``hf_llama/context.py``); the routers route
each token on its own (dropless, no load-balancing loss in the loss: ``Family.token_routing``),
so splitting the sequence over the cp ranks leaves the routing as one process's.

``output_router_logits`` set: the CausalLM adds ``router_aux_loss_coef *
load_balancing_loss_func`` over all sparse layers' router logits of a forward, which
``load_balancing.py`` gives each router as a gradient (``Family.prepare``, on the ranks and in
``verify``'s reference); the loss reported stays the cross-entropy. It needs every layer's
counts of a forward before its backward, so such a model plans with pp = 1 only
(``admissibility``). Unset -- transformers' default -- the model trains on the cross-entropy
alone.

A router with jitter noise (Mixtral's ``router_jitter_noise`` > 0) runs as the model's own
code draws it: each rank its own noise for its own tokens, as every data-parallel process
does (``verify`` turns it off on both sides, ``autopar/verify/dropout.py``).

Refused, with the reason in ``family_of``'s error:

* experts in another layout (a list of expert MLPs as in DeepSeek-V2/Qwen2-MoE of older
  transformers, transposed or biased stacked weights, GPT-OSS), soft-capped logits, blocks with
  other children (Gemma-style extra norms).
"""

from __future__ import annotations

from autopar.models.family import Family, register
from autopar.models.hf_llama.context import is_context_attention, use_context_attention
from autopar.models.hf_llama.modules import is_silu, rms_norm
from autopar.models.hf_llama.parts import HF_LLAMA_PARTS
from autopar.models.hf_moe.experts import expert_layers
from autopar.models.hf_moe.init import moe_scheme
from autopar.models.hf_moe.load_balancing import install_load_balancing, router_loss_problem
from autopar.models.hf_moe.parts import mismatch

FAMILY = register(Family(name="hf-moe", parts=HF_LLAMA_PARTS, mismatch=mismatch,
                         rms_norm=rms_norm, is_silu=is_silu, init=moe_scheme,
                         expert_layers=expert_layers, context_attention=is_context_attention,
                         use_context_attention=use_context_attention,
                         context_problem=router_loss_problem, token_routing=True,
                         prepare=install_load_balancing))

__all__ = ["FAMILY"]
