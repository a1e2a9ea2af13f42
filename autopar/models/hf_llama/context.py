"""Context parallelism for transformers' decoders: their attention through autopar's hook.

A transformers attention module (Llama, Mistral, Qwen2/3, Gemma, the MoE decoders, Phi-3,
GPT-2) computes q, k and v, applies its rotary embedding, and calls the function registered in
transformers' ``AttentionInterface`` under ``config._attn_implementation`` as
``fn(module, q, k, v, attention_mask, dropout=, scaling=, **kwargs)``, q (b, heads, s, d) and
k, v (b, kv heads, s, d). Under context parallelism (``passes/context_parallel.py``) each such
module holds a ``context_parallel`` hook (``GatheredKVAttention``: the rank's queries against
the K and V all-gathered over the cp group, causally masked by the chunks' global positions),
and ``use_context_attention`` registers ``context_attention_forward`` under
``CONTEXT_ATTENTION`` and sets the model's implementation to it, so that every layer calls the
hook with its own scaling (Gemma's, Qwen3's), its grouped kv heads (SDPA's ``enable_gqa``) and
its sliding window (``attention_window``, masked by global position), and gets what
transformers expects back: the output (b, s, heads, d) and no weights. The stages give the
blocks no mask then (``parts.py``): the hook builds the gathered one.
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.core.errors import AutoparError

CONTEXT_ATTENTION = "autopar_context_parallel"
"""The name autopar's attention function is registered under in transformers'
``AttentionInterface`` (``config._attn_implementation`` of a model running context-parallel)."""


def is_context_attention(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers self-attention that calls the attention function of
    its config (``Family.context_attention`` of the transformers families): a causal module
    named ``...Attention`` holding its config and its layer index."""
    return (type(module).__name__.endswith("Attention") and getattr(module, "is_causal", None)
            is True and hasattr(module, "config") and hasattr(module, "layer_idx"))


def attention_window(config: object, attention: nn.Module | None) -> int | None:
    """The sliding window of ``attention``: its own ``sliding_window`` where it has one
    (Qwen2's per-layer types), else none where the config has per-layer types or
    ``use_sliding_window=False``, else the config's (Mistral: every layer); ``None``: full.
    A window of 0 (Qwen2-MoE's with the window off) is none."""
    if attention is not None and hasattr(attention, "sliding_window"):
        return attention.sliding_window or None
    if getattr(config, "layer_types", None) is not None or \
            getattr(config, "use_sliding_window", True) is False:
        # per-layer types name the windowed layers (their attention holds the window), or the
        # config turns the window off (Qwen2-MoE keeps sliding_window=0 then)
        return None
    return getattr(config, "sliding_window", None) or None


def context_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor,
                              value: torch.Tensor, attention_mask: torch.Tensor | None,
                              dropout: float = 0.0, scaling: float | None = None,
                              **kwargs: object) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract, run by ``module.context_parallel`` (see the
    module docstring): (b, s, heads, d) output, no attention weights."""
    hook = getattr(module, "context_parallel", None)
    where = f"{type(module).__name__} (layer {getattr(module, 'layer_idx', '?')})"
    if hook is None:
        raise AutoparError("the attention runs autopar's context-parallel attention function "
                           "but holds no context_parallel hook", where=where,
                           fix="run the model through autopar.parallelize with cp > 1, or "
                               "set config._attn_implementation back to 'sdpa'")
    if attention_mask is not None or kwargs.get("softcap") is not None:
        raise AutoparError("context-parallel attention builds its own causal mask of the "
                           "chunks' global positions and takes no other mask or soft cap",
                           where=where, fix="use cp=1 for this model")
    out = hook(query, key, value, dropout_p=dropout, scale=scaling,
               enable_gqa=query.shape[1] != key.shape[1],
               window=attention_window(getattr(module, "config", None), module))
    return out.transpose(1, 2).contiguous(), None


def use_context_attention(model: nn.Module) -> None:
    """Register ``context_attention_forward`` in transformers' ``AttentionInterface`` (once per
    process) and set ``model``'s attention implementation to it
    (``Family.use_context_attention`` of the transformers families)."""
    from transformers import AttentionInterface

    AttentionInterface.register(CONTEXT_ATTENTION, context_attention_forward)
    model.config._attn_implementation = CONTEXT_ATTENTION  # type: ignore[union-attr]


def runs_context_attention(config: object) -> bool:
    """Whether a model of ``config`` runs autopar's context-parallel attention (cp > 1)."""
    return getattr(config, "_attn_implementation", None) == CONTEXT_ATTENTION
