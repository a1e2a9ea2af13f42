"""``--model hf-llama``: a tiny transformers ``LlamaForCausalLM`` for tests and CPU verification.

No weights are downloaded: the spec records the architecture and its config fields
(``ModelSpec.transformers_config``), and ``ModelSpec.build`` constructs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autopar.core.model_spec import ModelSpec

HF_LLAMA = "hf-llama"
"""The shorthand: a transformers ``LlamaForCausalLM`` made from ``HF_LLAMA_TINY``
(``--model-arg`` sets any ``LlamaConfig`` field)."""

HF_LLAMA_TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "max_position_embeddings": 64}
"""Its config fields: the shape of ``tiny-llama`` (GQA 4/2 heads), 64 positions."""


def tiny_spec(overrides: Mapping[str, Any]) -> ModelSpec:
    """The spec of ``hf-llama`` with ``overrides`` set on its config."""
    return ModelSpec.transformers_config("LlamaForCausalLM", {**HF_LLAMA_TINY, **overrides})
