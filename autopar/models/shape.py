"""The model's shape facts, one owner: what every part of autopar reads of a model's size.

A zoo config (``autopar.models``) and a transformers config name the same facts differently
(``num_heads`` / ``num_attention_heads`` / ``n_head``); ``CONFIG_FIELDS`` lists the names and
``config_value`` reads a fact under whichever the config uses. ``vocab_of`` is the token ids a
model reads (config, else its input embedding). ``ModelShape`` is a decoder's whole shape as the
framework exports need it (Megatron-LM and Megatron-Bridge take it as arguments; DeepSpeed and
torchtitan name a model their own way), from a model spec: a zoo model's shape is its config, a
transformers model's its config's fields, a factory's unknown (``None``; the exports say so).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from autopar.core.model_spec import ModelSpec

CONFIG_FIELDS = {
    "num_heads": ("num_heads", "num_attention_heads", "n_head"),
    "num_kv_heads": ("num_kv_heads", "num_key_value_heads"),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "max_positions": ("seq_len", "max_position_embeddings", "n_positions", "n_ctx"),
}
"""Config attribute names of each fact: the zoo's dataclasses, transformers configs."""


def config_value(config: object, key: str) -> int | None:
    """The fact ``key`` of ``CONFIG_FIELDS`` (``num_heads``, ``num_kv_heads``,
    ``num_experts``, ``max_positions``) from a model config of the zoo or of transformers,
    under whichever of its names the config uses; ``None`` where it has none."""
    for name in CONFIG_FIELDS[key]:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def vocab_of(model: object) -> int | None:
    """The token ids ``model`` reads: ``config.vocab_size``, else its input embedding's rows
    (``get_input_embeddings``, else its first ``nn.Embedding``); ``None`` if it has neither."""
    from torch import nn

    value = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    if not isinstance(emb, nn.Embedding) and isinstance(model, nn.Module):
        emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
    return emb.num_embeddings if isinstance(emb, nn.Embedding) else None



@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shape."""

    family: str
    """``gpt``, ``llama``, ``moe``, or a transformers architecture (``LlamaForCausalLM``)."""
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_positions: int
    tied: bool
    """The head shares the embedding's weight."""
    gated: bool
    """SwiGLU MLP with RMSNorm, RoPE and no biases (Llama); else GELU, LayerNorm, learned
    positions and biases (GPT-2, Megatron-LM's GPT)."""
    rope_theta: float = 0.0
    rope_scaling: tuple[tuple[str, object], ...] = ()
    """The rotary embedding's frequency scaling as the config gives it (``rope_type``,
    ``factor``...: transformers' ``rope_parameters`` or ``rope_scaling``); () for none."""
    num_experts: int = 0
    top_k: int = 0
    capacity_factor: float | None = None
    """Slots per expert over the balanced load; ``None``: dropless (``models/moe``)."""
    moe_ffn_hidden_size: int = 0
    """Each expert's width where it differs from the dense MLP's (``deepseek``); else 0."""
    shared_expert_size: int = 0
    """Width of the shared experts every token goes through (``deepseek``); 0: none."""
    first_k_dense: int = 0
    """Leading layers with a dense MLP (``deepseek``)."""
    aux_loss_coef: float = 0.0
    """Weight of the router's load-balancing loss (``models/moe``)."""
    qkv_bias: bool = False
    """Biases on the q, k and v projections (Qwen2's; Llama's ``attention_bias``)."""
    qk_norm: bool = False
    """RMSNorm on each head's q and k (Qwen3's)."""
    norm_eps: float = 0.0
    """The norms' epsilon where the config gives it (0: the target's default)."""
    head_size: int = 0
    """Each attention head's width where the config gives it (Qwen3's 128 over hidden 2048 /
    32 heads); 0: ``hidden_size / num_heads``."""
    mla: tuple[tuple[str, int | None], ...] = ()
    """Multi-head latent attention's ranks and head sizes (``q_lora_rank``, ``kv_lora_rank``,
    ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``; ``deepseek``), or ()."""
    unmapped: tuple[str, ...] = ()
    """What of the model's architecture the Llama-style switches (SwiGLU, RMSNorm, RoPE, q/k
    norm and qkv bias as given) do not express: a transformers config's other architecture,
    activation, biases or sliding window (``_unmapped``). The Megatron and Bridge exports
    refuse such a model unless told to write it anyway."""


def model_shape(spec: ModelSpec | None) -> ModelShape | None:
    """The shape of the model ``spec`` builds, or ``None`` for a factory's (or no spec)."""
    if spec is None:
        return None
    if spec.name:
        from autopar.models import make_config

        return _zoo(make_config(spec.name, **spec.overrides))
    if spec.transformers is not None:
        return _transformers(spec.transformers["architecture"], spec.transformers["config"])
    return None


def _facts(config: Any) -> dict[str, int]:
    """The facts zoo and transformers configs name differently, read under either name
    (``config_value``)."""
    heads = config_value(config, "num_heads")
    return {"num_heads": heads, "num_kv_heads": config_value(config, "num_kv_heads") or heads,
            "max_positions": config_value(config, "max_positions") or 0,
            "num_experts": config_value(config, "num_experts") or 0}


def _zoo(config: Any) -> ModelShape:
    gated = config.gated
    return ModelShape(
        family=config.family, num_layers=config.num_layers, hidden_size=config.hidden_size,
        ffn_hidden_size=config.ffn_hidden_size, vocab_size=config.vocab_size,
        tied=config.tie_embeddings, gated=gated,
        rope_theta=float(getattr(config, "rope_theta", 0.0)),
        top_k=getattr(config, "top_k", 0), capacity_factor=getattr(config, "capacity_factor", None),
        moe_ffn_hidden_size=getattr(config, "moe_ffn_hidden_size", 0),
        shared_expert_size=getattr(config, "num_shared_experts", 0)
        * getattr(config, "moe_ffn_hidden_size", 0),
        first_k_dense=getattr(config, "first_k_dense", 0),
        aux_loss_coef=float(getattr(config, "router_aux_loss_coef", 0.0)),
        norm_eps=float(getattr(config, "norm_eps", 0.0) or 0.0),
        head_size=int(getattr(config, "head_dim", 0) or 0),
        mla=tuple((k, getattr(config, k)) for k in MLA_FIELDS)
        if str(getattr(config, "attention", "")) == "mla" else (),
        unmapped=_zoo_unmapped(config), **_facts(config))


ROPE_DEFAULT_THETA = 10000.0
"""transformers' rotary base where a config gives none."""


def _rope_parameters(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The rotary embedding's parameters of a transformers config: ``rope_parameters``
    (transformers 5, which moved ``rope_theta`` and ``rope_scaling`` into it), else
    ``rope_scaling`` (transformers 4)."""
    found = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return found if isinstance(found, Mapping) else {}


def _rope_theta(config: Mapping[str, Any]) -> float:
    """The rotary base: the top-level ``rope_theta`` (transformers 4), else
    ``rope_parameters["rope_theta"]`` (transformers 5), else transformers' default."""
    theta = config.get("rope_theta") or _rope_parameters(config).get("rope_theta")
    return float(theta or ROPE_DEFAULT_THETA)


def _rope_scaling(config: Mapping[str, Any]) -> tuple[tuple[str, object], ...]:
    """The rotary scaling's fields, sorted (the base apart), or () for plain RoPE."""
    params = dict(_rope_parameters(config))
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind == "default":
        return ()
    params.pop("rope_theta", None)
    params.pop("type", None)
    params["rope_type"] = kind
    return tuple(sorted(params.items()))


LLAMA_STYLE = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                         "Qwen3ForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM"})
"""transformers architectures whose block is Llama's (RMSNorm, gated MLP, RoPE, no output
biases) but for what ``ModelShape`` records of them: Qwen2's q/k/v biases, Qwen3's q/k norms,
the experts' count and width (transformers' modeling files of each)."""
QKV_BIAS = frozenset({"Qwen2ForCausalLM"})
"""Architectures with biases on q, k and v whatever the config says (Qwen2's attention)."""
QK_NORM = frozenset({"Qwen3ForCausalLM", "Qwen3MoeForCausalLM"})
"""Architectures with an RMSNorm on each head's q and k (Qwen3's attention)."""


def _unmapped(architecture: str, config: Mapping[str, Any]) -> tuple[str, ...]:
    """What of a transformers model the Llama-style shape does not express (``ModelShape``'s
    ``unmapped``)."""
    out = []
    if architecture not in LLAMA_STYLE:
        out.append(f"the {architecture} architecture (its norms, activation, biases and "
                   "layout are not read field by field)")
        return tuple(out)
    act = str(config.get("hidden_act") or "silu")
    if act != "silu":
        out.append(f"the activation {act} (the gated MLP is written as SwiGLU)")
    if config.get("mlp_bias"):
        out.append("the MLP's biases")
    window = _config_window(config)
    if window:
        out.append(f"sliding-window attention ({window} tokens)")
    if config.get("shared_expert_intermediate_size"):
        out.append("the shared expert")
    return tuple(out)


def _config_window(config: Mapping[str, Any]) -> int | None:
    """The attention window a transformers config gives some layer: the hf_llama family's rule
    (``context.attention_window``: the config's own, unless per-layer types or
    ``use_sliding_window=False`` say otherwise), and under per-layer types the window of the
    ``sliding_attention`` layers."""
    from autopar.models.hf_llama.context import attention_window

    window = attention_window(SimpleNamespace(**config), None)
    if window is None and "sliding_attention" in (config.get("layer_types") or ()):
        window = config.get("sliding_window") or None
    return window


MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
              "v_head_dim")


def _zoo_unmapped(config: Any) -> tuple[str, ...]:
    """What of a zoo model a Llama- or GPT-style shape does not express: GPT-OSS's attention
    sinks, sliding window, attention and expert biases and clamped SwiGLU (``models/moe``)."""
    out = []
    if getattr(config, "attention_sinks", False):
        out.append("attention sinks")
    if getattr(config, "sliding_window", None):
        out.append(f"sliding-window attention ({config.sliding_window} tokens)")
    if getattr(config, "attention_bias", False):
        out.append("the attention's biases")
    if getattr(config, "expert_bias", False):
        out.append("the experts' biases")
    if getattr(config, "swiglu_limit", None):
        out.append(f"the SwiGLU clamped at {config.swiglu_limit}")
    return tuple(out)


def _transformers(architecture: str, config: Mapping[str, Any]) -> ModelShape | None:
    """A Llama-style transformers config (``num_hidden_layers``, ``intermediate_size``...)."""
    try:
        facts = _facts(SimpleNamespace(**config))
        if facts["num_heads"] is None:
            return None
        experts = facts["num_experts"]
        moe_width = int(config.get("moe_intermediate_size") or 0) if experts else 0
        return ModelShape(
            family=architecture, num_layers=int(config["num_hidden_layers"]),
            hidden_size=int(config["hidden_size"]),
            ffn_hidden_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)), gated=True,
            rope_theta=_rope_theta(config), rope_scaling=_rope_scaling(config),
            top_k=int(config.get("num_experts_per_tok", 0) or 0),
            moe_ffn_hidden_size=moe_width,
            qkv_bias=architecture in QKV_BIAS or bool(config.get("attention_bias")),
            qk_norm=architecture in QK_NORM,
            norm_eps=float(config.get("rms_norm_eps") or 0.0),
            head_size=int(config.get("head_dim") or 0),
            unmapped=_unmapped(architecture, config), **facts)
    except (KeyError, TypeError, ValueError):
        return None
