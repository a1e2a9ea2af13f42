"""The ``generic`` family: any decoder whose forward is embedding -> a chain of its repeated
blocks -> final norm and head, described from its module tree and its traced forward
(``describe.py``), with no code of its own model.

It is the fallback family (``Family.fallback``): tried only when no family of its own
recognises a model -- a user's ``FILE.py:FACTORY`` model, a transformers decoder of an
architecture no family names (Gemma 2, GPT-NeoX, Falcon, BERT...), whose forward torch.fx
cannot trace and torch.export reads (``exported.py``). Its models run every plan but:

* tensor parallelism where its blocks' attention and MLP cannot run on a rank's shards: their
  code is read from a trace (``tensor_parallel.py``: which linears split by columns and rows,
  how the code cuts the features into heads, q, k and v sections) and rewritten to a rank's
  sizes; what it cannot map (a norm over the split features, the features' size read back) is
  refused with the reason (``Family.tensor_layout``); so is any model read with torch.export,
  whose blocks' code fx cannot trace.
* context parallelism where its blocks' attention is anything but causal
  ``F.scaled_dot_product_attention`` with no mask, or its positions anything but
  ``torch.arange`` over the sequence length (a hand-written masked softmax attention, a
  registered mask or position buffer): refused with the reason (``Family.context_problem``,
  ``context.py``). Otherwise each block takes the context-parallel hook and runs its SDPA
  calls by it, and the positions are the rank's global ones. A model read with torch.export
  is refused too (the positions and attention are read off fx graphs).
* mixture of experts: a hand-written layer -- a router ``nn.Linear(h, E)`` beside an
  ``nn.ModuleList`` of E experts, run on the rows its own code routes to each
  (``experts.py``) -- is priced on static shapes, and split over the ep ranks with the user's
  routing code run twice (rows recorded, sent to the experts' owners, answered); its routing
  is taken to be per token (``Family.token_routing``; ``verify`` holds a capacity-dropping
  layer to it). Tensor parallelism of its experts is refused (whole experts, ep splits them).
* initialisation: no per-parameter scheme (``Family.init`` is ``None``): the model's own code
  initialises it, so a sharded build builds it whole once on the CPU (``passes/materialize.py``).

A model whose forward is not such a chain is no model of this family; ``family_of`` then says
why, which is what ``admissibility.ModelFacts.unsplittable`` reports (pp = 1 plans only, which
run without a description: ``passes/program.py``).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING

from autopar.core.errors import AutoparError
from autopar.models.family import Family, register
from autopar.models.generic import experts
from autopar.models.generic.describe import (context_problem, describe, is_block,
                                             read_by_export)
from autopar.models.generic.tensor_parallel import ModelLayout, model_layout

if TYPE_CHECKING:
    from torch import nn

    from autopar.models.parts import ModelParts


def mismatch(model: nn.Module) -> str | None:
    """``None`` where ``model``'s forward is a chain of its blocks, else why not."""
    found = describe(model)
    return found if isinstance(found, str) else None


_LAYOUTS: weakref.WeakKeyDictionary[nn.Module, ModelLayout | str] = \
    weakref.WeakKeyDictionary()


def tensor_layout(model: nn.Module) -> ModelLayout | str:
    """How ``model``'s blocks split under tensor parallelism, or why they cannot (cached per
    model: a fake run and a trace of its first block's modules)."""
    found = describe(model)
    if isinstance(found, str):
        return f"the generic decoder description does not apply: {found}"
    fx_failed = read_by_export(model)
    if fx_failed is not None:
        return ("its forward was read with torch.export, and tensor parallelism rewrites the "
                f"blocks' attention and MLP from their torch.fx graphs ({fx_failed})")
    moe = experts.tensor_parallel_problem(model)
    if moe is not None:
        return moe
    known = _LAYOUTS.get(model)
    if known is None:
        known = _LAYOUTS[model] = model_layout(model, found.blocks)
    return known


_PARTS: weakref.WeakKeyDictionary[nn.Module, ModelParts] = weakref.WeakKeyDictionary()


def parts(model: nn.Module) -> ModelParts:
    known = _PARTS.get(model)
    if known is not None:
        return known
    found = describe(model)
    if isinstance(found, str):
        raise AutoparError(f"the generic decoder description does not apply: {found}",
                           where="autopar.models.generic", fix="use pp=1 for this model")
    ref = weakref.ref(model)

    def shard_block(block: nn.Module, styles: Mapping[str, str], tp: int) -> dict[str, int]:
        owner = ref()
        layout = tensor_layout(owner) if owner is not None else "the model is gone"
        if isinstance(layout, str):
            raise AutoparError(f"the plan splits this model by tensor parallelism, which its "
                               f"blocks cannot run: {layout}", where="plan.module_strategies",
                               fix="use tp=1 for this model")
        return layout.apply(block, styles, tp)

    known = _PARTS[model] = dataclasses.replace(found, shard_block=shard_block,
                                                embedding_in_shards=False)
    return known


def _install_experts(model: nn.Module) -> None:
    experts.install(model)


FAMILY = register(Family(name="generic", parts=None, describe=parts, mismatch=mismatch,
                         fallback=True, tensor_layout=tensor_layout,
                         context_attention=is_block, context_problem=context_problem,
                         expert_layers=experts.expert_layers, token_routing=True,
                         prepare=_install_experts, trace_experts=experts.static_experts))

__all__ = ["FAMILY", "describe", "tensor_layout"]
