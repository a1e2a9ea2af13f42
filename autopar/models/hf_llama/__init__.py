"""The ``hf-llama`` family: transformers' ``LlamaForCausalLM`` and the architectures laid out
like it (Mistral, Qwen2, Qwen3, Gemma), built by transformers itself.

Its folder holds what autopar adds to them: the layout for the passes (``parts.py``, which also
recognises a model by it), the norm and activation classes the fusion pass swaps
(``modules.py``), transformers' init drawn one parameter at a time (``init.py``), its
attention run context-parallel through transformers' attention interface (``context.py``),
and the ``hf-llama`` shorthand, a tiny Llama (``shorthand.py``). Registered on
import; transformers itself is imported only by the code that builds a model.
"""

from __future__ import annotations

from autopar.models.family import Family, register
from autopar.models.hf_llama.context import is_context_attention, use_context_attention
from autopar.models.hf_llama.init import hf_scheme
from autopar.models.hf_llama.modules import is_silu, rms_norm
from autopar.models.hf_llama.parts import HF_LLAMA_PARTS, LAYOUT, mismatch
from autopar.models.hf_llama.shorthand import HF_LLAMA, HF_LLAMA_TINY, tiny_spec

FAMILY = register(Family(name="hf-llama", parts=HF_LLAMA_PARTS, mismatch=mismatch,
                         rms_norm=rms_norm, is_silu=is_silu, shorthands={HF_LLAMA: tiny_spec},
                         init=hf_scheme, context_attention=is_context_attention,
                         use_context_attention=use_context_attention))

__all__ = ["FAMILY", "HF_LLAMA", "HF_LLAMA_TINY", "HF_LLAMA_PARTS", "LAYOUT"]
