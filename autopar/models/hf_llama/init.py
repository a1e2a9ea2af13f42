"""The ``hf-llama`` family's init, one parameter at a time (``autopar.models.init``).

The laws are those of transformers' ``PreTrainedModel._init_weights`` (5.x), which a Llama-style
model runs on its global generator: ``nn.Linear`` weights N(0, ``initializer_range``) (0.02
when unset) and biases zero, ``nn.Embedding`` weights N(0, ``initializer_range``) with the
``padding_idx`` row zero, and every module whose class name holds ``RMSNorm`` or ``LayerNorm``
at the constant the model's own ``_init_weights`` gives it (one; zero for Gemma's ``(1 + w)``
norm), read from a CPU copy of the norm. Only the random stream differs: each parameter draws
from its own (``param_generator``), so a rank can draw just its shards, and ``ModelSpec.build``
draws the one-process model the same way. Buffers (the rotary embedding's ``inv_freq``,
Gemma's ``embed_scale``) are computed by transformers itself: ``_init_weights`` on a copy of
their module whose parameters stay on the meta device (a full-size embedding is never
allocated for its scale).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from autopar.core.errors import AutoparError
from autopar.models.init import Constant, InitScheme, Law, Normal, unknown_buffer
from autopar.models.layers import INIT_STD


def _is_norm(module: nn.Module) -> bool:
    name = type(module).__name__
    return "RMSNorm" in name or "LayerNorm" in name


def _norm_constant(model: nn.Module, module: nn.Module, attr: str) -> Constant:
    """The constant the model's own ``_init_weights`` fills the norm's ``attr`` with (one
    where the model has no ``_init_weights``: transformers' default)."""
    if not hasattr(model, "_init_weights"):
        return Constant(1.0) if attr == "weight" else Constant(0.0)
    computed = copy.deepcopy(module).to_empty(device="cpu")
    model._init_weights(computed)
    values = getattr(computed, attr).detach().flatten().unique()
    if values.numel() != 1:
        raise AutoparError(f"{type(model).__name__}'s _init_weights fills the norm "
                           f"{type(module).__name__}.{attr} with more than one value",
                           where="autopar.models.hf_llama.init",
                           fix="give the family's init scheme a law for it")
    return Constant(float(values.item()))


def hf_scheme(model: nn.Module,
              other: Callable[[str, nn.Module, float], Law | None] | None = None) -> InitScheme:
    """The init scheme of a transformers Llama-style causal LM (on meta or allocated);
    ``other(attribute, module, std)`` gives the law of a parameter of a module of none of the
    kinds above (a family's own: ``hf_moe``'s experts and routers), ``None`` where it has none."""
    std = getattr(model.config, "initializer_range", None) or INIT_STD
    norm_laws: dict[tuple[type, str], Constant] = {}

    def law_of(name: str) -> Law | None:
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        if isinstance(module, nn.Linear):
            return Normal(std) if attr == "weight" else Constant(0.0)
        if isinstance(module, nn.Embedding):
            return Normal(std, zero_row=module.padding_idx)
        if _is_norm(module):
            key = (type(module), attr)
            if key not in norm_laws:
                norm_laws[key] = _norm_constant(model, module, attr)
            return norm_laws[key]
        return None if other is None else other(attr, module, std)

    def buffer(name: str) -> torch.Tensor:
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        if not hasattr(model, "_init_weights"):
            raise unknown_buffer(model, name)
        computed = copy.deepcopy(module).to("meta")
        for sub in computed.modules():  # only the buffers are allocated; parameters stay meta
            for key, b in sub._buffers.items():
                if b is not None:
                    sub._buffers[key] = torch.empty_like(b, device="cpu")
        model._init_weights(computed)  # transformers computes the buffers from the config
        return computed.get_buffer(attr)

    return InitScheme.of(model, law_of, buffer)
