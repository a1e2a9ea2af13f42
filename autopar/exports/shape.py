"""The model's shape as the exports need it, from the plan's model spec.

Megatron-LM and Megatron-Bridge take the transformer's shape as arguments; DeepSpeed and
torchtitan name a model their own way. A zoo model's shape is its config
(``autopar.models.make_config``); a transformers model's is its config's fields; a factory's is
unknown (``None``), and the exports say so in their tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from autopar.admissibility import config_value
from autopar.core.plan import Plan


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


def model_shape(plan: Plan) -> ModelShape | None:
    """The shape of the model the plan records, or ``None`` when it records none or a factory."""
    spec = plan.model_spec
    if spec is None:
        from autopar.core.model_spec import ModelSpec

        spec = ModelSpec.zoo(plan.model)
    if spec is None:
        return None
    if spec.name:
        from autopar import models

        return _zoo(models.make_config(spec.name, **spec.overrides))
    if spec.transformers is not None:
        return _transformers(spec.transformers["architecture"], spec.transformers["config"])
    return None


def _facts(config: Any) -> dict[str, int]:
    """The facts zoo and transformers configs name differently, read under either name
    (``admissibility.config_value``)."""
    heads = config_value(config, "num_heads")
    return {"num_heads": heads, "num_kv_heads": config_value(config, "num_kv_heads") or heads,
            "max_positions": config_value(config, "max_positions") or 0,
            "num_experts": config_value(config, "num_experts") or 0}


def _zoo(config: Any) -> ModelShape:
    gated = config.family != "gpt"
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
        aux_loss_coef=float(getattr(config, "router_aux_loss_coef", 0.0)), **_facts(config))


def _transformers(architecture: str, config: Mapping[str, Any]) -> ModelShape | None:
    """A Llama-style transformers config (``num_hidden_layers``, ``intermediate_size``...)."""
    try:
        facts = _facts(SimpleNamespace(**config))
        if facts["num_heads"] is None:
            return None
        return ModelShape(
            family=architecture, num_layers=int(config["num_hidden_layers"]),
            hidden_size=int(config["hidden_size"]),
            ffn_hidden_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)), gated=True,
            rope_theta=float(config.get("rope_theta", 10000.0)),
            top_k=int(config.get("num_experts_per_tok", 0) or 0), **facts)
    except (KeyError, TypeError, ValueError):
        return None
