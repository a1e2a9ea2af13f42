"""The ``hf-llama`` family's init, one parameter at a time (``autopar.models.init``).

The laws are those of transformers' ``PreTrainedModel._init_weights`` (5.x), which a Llama-style
model runs on its global generator: ``nn.Linear`` weights N(0, ``initializer_range``) (0.02
when unset) and biases zero, ``nn.Embedding`` weights N(0, ``initializer_range``) with the
``padding_idx`` row zero, and every module whose class name holds ``RMSNorm`` or ``LayerNorm``
at identity (weight one, bias zero). Only the random stream differs: each parameter draws from
its own (``param_generator``), so a rank can draw just its shards, and ``ModelSpec.build``
draws the one-process model the same way. The rotary embedding's ``inv_freq`` buffers are
computed by transformers itself: ``_init_weights`` on a CPU copy of the module.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from autopar.models.init import Constant, InitScheme, Law, Normal, unknown_buffer
from autopar.models.layers import INIT_STD


def _is_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return "RMSNorm" in name or "LayerNorm" in name


def hf_scheme(model: nn.Module) -> InitScheme:
    """The init scheme of a transformers Llama-style causal LM (on meta or allocated)."""
    std = getattr(model.config, "initializer_range", None) or INIT_STD

    def law_of(name: str) -> Law | None:
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        if isinstance(module, nn.Linear):
            return Normal(std) if attr == "weight" else Constant(0.0)
        if isinstance(module, nn.Embedding):
            return Normal(std, zero_row=module.padding_idx)
        if _is_norm(module):
            return Constant(1.0) if attr == "weight" else Constant(0.0)
        return None

    def buffer(name: str) -> torch.Tensor:
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        if list(module.parameters()) or not hasattr(model, "_init_weights"):
            raise unknown_buffer(model, name)
        computed = copy.deepcopy(module).to_empty(device="cpu")
        model._init_weights(computed)  # transformers computes the rotary tables from config
        return computed.get_buffer(attr)

    return InitScheme.of(model, law_of, buffer)
