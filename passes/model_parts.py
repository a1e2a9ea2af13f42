"""Where a model's pieces are and how a pipeline stage calls them: its family's ``ModelParts``.

The passes split a model into stages and run each stage's blocks one by one (to checkpoint them
as planned), so they need, per model family, the modules before the blocks, the block list, the
modules after it, and how each is called. Each family describes its own in
``autopar/models/<family>/parts.py`` and registers it (``autopar.models.family``); here the
passes ask the registry for the family of a model, never naming a model class. The built-in
``gpt``, ``llama`` and ``moe`` families are known, transformers' Llama-style causal LMs
(``hf-llama``), GPT-2 and Phi-3, and, last, the ``generic`` family describes any decoder whose
forward is embedding -> a chain of its blocks -> head from its traced forward; another model
raises ``AutoparError`` saying, per family, why it is not one of its models (and the search
plans it with pp = 1 only: ``admissibility.ModelFacts.unsplittable``; such a plan runs the
model whole, ``passes/whole_model.py``).

Every ``ModelParts`` callable takes the *stage root*: a module that holds the model's submodules
under their original names (see ``passes/stage.py``), so ``root.tok_emb`` is the model's
``tok_emb``.
"""

from __future__ import annotations

from torch import nn

from autopar.core.errors import AutoparError
from autopar.models.family import Family, family_of
from autopar.models.parts import ModelParts

__all__ = ["ModelParts", "model_family", "parts_of"]


def model_family(model: nn.Module) -> Family:
    """The family of ``model``; ``AutoparError`` for a model no registered family describes."""
    try:
        return family_of(model)
    except AutoparError as err:
        raise AutoparError(
            f"the execution passes do not know how to split a {type(model).__name__} into "
            f"pipeline stages: {err.what}", where="autopar.parallelize(model=...)",
            fix=err.fix) from None


def parts_of(model: nn.Module) -> ModelParts:
    """The parts of ``model``; ``AutoparError`` for a layout the passes do not know."""
    return model_family(model).parts_of(model)


def parts_or_none(model: nn.Module) -> ModelParts | None:
    """The parts of ``model``; ``None`` for a model no family describes (a one-stage program
    runs it whole: ``passes/whole_model.py``)."""
    try:
        return family_of(model).parts_of(model)
    except AutoparError:
        return None
