"""The ``generic`` family: any decoder whose forward is embedding -> a chain of its repeated
blocks -> final norm and head, described from its module tree and its traced forward
(``describe.py``), with no code of its own model.

It is the fallback family (``Family.fallback``): tried only when no family of its own
recognises a model -- a user's ``FILE.py:FACTORY`` model. Its models run every plan but:

* tensor parallelism: the description does not know how the attention reads its heads (a
  fused ``c_attn``, a ``view`` by a fixed head count), so splitting q/k/v by columns could hand
  a rank parts of heads; tp > 1 is refused with that reason (``Family.tensor_parallel``).
* context parallelism where its blocks' attention is anything but causal
  ``F.scaled_dot_product_attention`` with no mask, or its positions anything but
  ``torch.arange`` over the sequence length (a hand-written masked softmax attention, a
  registered mask or position buffer): refused with the reason (``Family.context_problem``,
  ``context.py``). Otherwise each block takes the context-parallel hook and runs its SDPA
  calls by it, and the positions are the rank's global ones.
* initialisation: no per-parameter scheme (``Family.init`` is ``None``): the model's own code
  initialises it, so a sharded build builds it whole once on the CPU (``passes/materialize.py``).

A model whose forward is not such a chain is no model of this family; ``family_of`` then says
why, which is what ``admissibility.ModelFacts.unsplittable`` reports (pp = 1 plans only, which
run without a description: ``passes/program.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autopar.core.errors import AutoparError
from autopar.models.family import Family, register
from autopar.models.generic.describe import context_problem, describe, is_block

if TYPE_CHECKING:
    from torch import nn

    from autopar.models.parts import ModelParts


def mismatch(model: nn.Module) -> str | None:
    """``None`` where ``model``'s forward is a chain of its blocks, else why not."""
    found = describe(model)
    return found if isinstance(found, str) else None


def parts(model: nn.Module) -> ModelParts:
    found = describe(model)
    if isinstance(found, str):
        raise AutoparError(f"the generic decoder description does not apply: {found}",
                           where="autopar.models.generic", fix="use pp=1 for this model")
    return found


TENSOR_PARALLEL = ("the generic decoder description does not know how this model's attention "
                   "reads its heads from q, k and v (a fused projection such as c_attn, or a "
                   "view by a fixed head count), so a column split could hand a rank parts of "
                   "heads")

FAMILY = register(Family(name="generic", parts=None, describe=parts, mismatch=mismatch,
                         fallback=True, tensor_parallel=TENSOR_PARALLEL,
                         context_attention=is_block, context_problem=context_problem))

__all__ = ["FAMILY", "TENSOR_PARALLEL", "describe"]
