"""The models newcomers bring that no zoo family builds, for the property cases and the
newcomer catalogue: tiny transformers configs of every architecture they tried, and hand-written
decoders in several styles.

``ARCHITECTURES`` maps a short name to a transformers architecture (its class name and how to
make its config fields at a given ``Shape``: the config class's own constructor fills every
field it derives, such as Gemma's per-layer ``layer_types``); ``transformers_spec`` is the
``ModelSpec`` of one. Token ids the configs name (padding, begin, end) are kept inside the
tiny vocabularies. ``decoder_spec`` is a hand-written decoder of ``autopar/verify/decoders.py``
at a shape: a copy of that file with the shape's constants, written to a folder, loaded by
path on every rank as a user's ``FILE.py:FACTORY`` is.

``autopar.verify.cases`` draws from both (``bench/fuzz_verify.py``, ``tests/dist/
test_verify_cases.py``); ``bench/newcomers.py`` plans, checks and verifies every one of them at
one shape (``bench/results/newcomers.md``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopar.core.model_spec import ModelSpec


@dataclass(frozen=True)
class Shape:
    """A tiny model's shape; each architecture reads the fields it has."""

    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    vocab: int = 256
    ffn: int = 128
    experts: int = 4
    top_k: int = 2
    seq: int = 64
    """Positions the model takes (``max_position_embeddings``)."""

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim


_TOKENS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def _llama_like(s: Shape, **more: Any) -> dict[str, Any]:
    return dict(hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.layers,
                num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                vocab_size=s.vocab, max_position_embeddings=s.seq, **_TOKENS, **more)


def _head_dim(s: Shape, **more: Any) -> dict[str, Any]:
    return _llama_like(s, head_dim=s.head_dim, **more)


def _window(s: Shape, **more: Any) -> dict[str, Any]:
    return _head_dim(s, sliding_window=max(2, s.seq // 4), **more)


@dataclass(frozen=True)
class Architecture:
    """A transformers architecture at a tiny shape."""

    cls: str
    """Its class name in the transformers package (what ``config.json``'s ``architectures``
    names)."""
    config: str
    """Its config class's name."""
    fields: Callable[[Shape], dict[str, Any]]
    decoder: bool = True
    """A causal decoder (BERT and T5 are not: they plan and verify, and are left out where a
    check is about decoders)."""
    model_type: str | None = None
    """The ``model_type`` to record where the class is not transformers' own (``auto_map``,
    InternLM3: built as transformers maps its type)."""


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture("LlamaForCausalLM", "LlamaConfig", _llama_like),
    "mistral": Architecture("MistralForCausalLM", "MistralConfig",
                            lambda s: _llama_like(s, sliding_window=None)),
    "qwen2": Architecture("Qwen2ForCausalLM", "Qwen2Config", _llama_like),
    "qwen3": Architecture("Qwen3ForCausalLM", "Qwen3Config", _head_dim),
    "qwen2-moe": Architecture("Qwen2MoeForCausalLM", "Qwen2MoeConfig", lambda s: _llama_like(
        s, num_experts=s.experts, num_experts_per_tok=s.top_k, moe_intermediate_size=s.ffn // 4,
        shared_expert_intermediate_size=s.ffn)),
    "qwen3-moe": Architecture("Qwen3MoeForCausalLM", "Qwen3MoeConfig", lambda s: _head_dim(
        s, num_experts=s.experts, num_experts_per_tok=s.top_k, moe_intermediate_size=s.ffn // 4)),
    "mixtral": Architecture("MixtralForCausalLM", "MixtralConfig", lambda s: _llama_like(
        s, num_local_experts=s.experts, num_experts_per_tok=s.top_k)),
    "gemma": Architecture("GemmaForCausalLM", "GemmaConfig", _head_dim),
    "gemma2": Architecture("Gemma2ForCausalLM", "Gemma2Config", _window),
    "gemma3": Architecture("Gemma3ForCausalLM", "Gemma3TextConfig", _window),
    "phi3": Architecture("Phi3ForCausalLM", "Phi3Config", _llama_like),
    "gpt2": Architecture("GPT2LMHeadModel", "GPT2Config", lambda s: dict(
        n_embd=s.hidden, n_layer=s.layers, n_head=s.heads, n_inner=s.ffn, vocab_size=s.vocab,
        n_positions=s.seq, bos_token_id=1, eos_token_id=2)),
    "gpt-neox": Architecture("GPTNeoXForCausalLM", "GPTNeoXConfig", lambda s: dict(
        hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, vocab_size=s.vocab, max_position_embeddings=s.seq,
        **_TOKENS)),
    "olmo2": Architecture("Olmo2ForCausalLM", "Olmo2Config", _llama_like),
    "falcon": Architecture("FalconForCausalLM", "FalconConfig", lambda s: dict(
        hidden_size=s.hidden, num_hidden_layers=s.layers, num_attention_heads=s.heads,
        vocab_size=s.vocab, max_position_embeddings=s.seq, **_TOKENS)),
    "stablelm": Architecture("StableLmForCausalLM", "StableLmConfig", _llama_like),
    "granite": Architecture("GraniteForCausalLM", "GraniteConfig", _llama_like),
    "granite-moe": Architecture("GraniteMoeForCausalLM", "GraniteMoeConfig", lambda s: _llama_like(
        s, num_local_experts=s.experts, num_experts_per_tok=s.top_k)),
    "deepseek-v3": Architecture("DeepseekV3ForCausalLM", "DeepseekV3Config", lambda s: {
        **_llama_like(s), "num_key_value_heads": s.heads, "num_hidden_layers": s.layers + 1,
        **dict(moe_intermediate_size=s.ffn // 4, n_routed_experts=s.experts,
        num_experts_per_tok=s.top_k, n_shared_experts=1, first_k_dense_replace=1,
        kv_lora_rank=s.head_dim, q_lora_rank=2 * s.head_dim, qk_rope_head_dim=s.head_dim // 2,
        qk_nope_head_dim=s.head_dim // 2, v_head_dim=s.head_dim, n_group=1, topk_group=1)}),
    # GPT-OSS's own RoPE is YaRN stretched from 4096 positions, which transformers warns of at a
    # tiny max_position_embeddings: the tiny config takes plain RoPE
    "gpt-oss": Architecture("GptOssForCausalLM", "GptOssConfig", lambda s: _window(
        s, num_local_experts=s.experts, num_experts_per_tok=s.top_k,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0})),
    "llama4": Architecture("Llama4ForCausalLM", "Llama4TextConfig", lambda s: _head_dim(
        s, num_local_experts=s.experts, num_experts_per_tok=1, intermediate_size_mlp=s.ffn)),
    "cohere": Architecture("CohereForCausalLM", "CohereConfig", _llama_like),
    "internlm3": Architecture("InternLM3ForCausalLM", "InternLM3Config", _head_dim,
                              model_type="internlm3"),
    "bert": Architecture("BertForMaskedLM", "BertConfig", lambda s: dict(
        hidden_size=s.hidden, intermediate_size=s.ffn, num_hidden_layers=s.layers,
        num_attention_heads=s.heads, vocab_size=s.vocab, max_position_embeddings=s.seq,
        pad_token_id=0), decoder=False),
    "t5": Architecture("T5ForConditionalGeneration", "T5Config", lambda s: dict(
        d_model=s.hidden, d_ff=s.ffn, num_layers=s.layers, num_heads=s.heads, d_kv=s.head_dim,
        vocab_size=s.vocab, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0),
        decoder=False),
}
"""Every transformers architecture newcomers tried (issue 28), by a short name."""


def transformers_spec(name: str, shape: Shape = Shape()) -> ModelSpec:
    """The ``ModelSpec`` of architecture ``name`` (``ARCHITECTURES``) at ``shape``: its config
    class's constructor run on the fields, as ``save_pretrained`` would write its config."""
    import transformers

    arch = ARCHITECTURES[name]
    config = getattr(transformers, arch.config)(**arch.fields(shape)).to_dict()
    if arch.model_type is not None:
        config["model_type"] = arch.model_type
    return ModelSpec.transformers_config(arch.cls, config)


DECODER_STYLES = ("llama", "positions", "mixer", "conv", "encoder")
"""The factories of ``autopar/verify/decoders.py`` (``make_<style>``)."""

_CONSTANTS = re.compile(r"^VOCAB, SEQ, WIDTH, HEADS, KV_HEADS, FFN, LAYERS = .*$", re.MULTILINE)


def decoder_spec(style: str, shape: Shape, folder: str | Path) -> ModelSpec:
    """A hand-written decoder of ``style`` at ``shape``: ``autopar/verify/decoders.py`` with the
    shape's constants, written to ``folder`` (its file name says the shape)."""
    from autopar.verify import decoders as verify_decoders

    if style not in DECODER_STYLES:
        raise ValueError(f"no decoder style {style!r}: one of {', '.join(DECODER_STYLES)}")
    source = Path(verify_decoders.__file__).read_text(encoding="utf-8")
    values = (shape.vocab, shape.seq, shape.hidden, shape.heads, shape.kv_heads, shape.ffn,
              shape.layers)
    text, found = _CONSTANTS.subn(
        "VOCAB, SEQ, WIDTH, HEADS, KV_HEADS, FFN, LAYERS = " + ", ".join(map(str, values)),
        source)
    if found != 1:
        raise ValueError("autopar/verify/decoders.py lost its line of shape constants")
    path = Path(folder) / ("decoders_" + "_".join(map(str, values)) + ".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text:  # another version's
        path.write_text(text, encoding="utf-8")
    return ModelSpec.parse(f"{path}:make_{style}")
