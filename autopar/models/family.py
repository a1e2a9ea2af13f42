"""The family registry: what the passes, the search and the model spec ask of a model.

A *family* is one folder ``autopar/models/<family>/`` (torchtitan's ``models/<family>/``): its
model code, its presets and a ``Family`` saying how to recognise one of its models, where its
parts are for the passes (``ModelParts``) and what the fusion pass must know of its own module
classes. The folder's ``__init__`` calls ``register``; ``autopar.models`` imports every
sub-package it finds, so a new family -- or a new transformers architecture -- is a new folder
and touches no other file. Callers ask ``family_of(model)`` and never name a model class.

Families are kept in name order, the fallback families (``Family.fallback``: the ``generic``
decoder, which reads a model's parts off its traced forward, ``Family.describe``) after every
other; their presets in ``PRESETS`` in name order (each family's in its own order, the tiny
test shapes after all the full-size ones).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec
from autopar.models.expert_layers import ExpertLayer, no_expert_layers
from autopar.models.parts import ModelParts
from autopar.models.presets import Preset

if TYPE_CHECKING:
    from torch import nn

    from autopar.models.init import InitScheme


ATTENTION_CORE_HOOK = "attention_core_runner"
"""The attribute an attention module with an unfused core (q.k^T, mask, softmax, dropout, .v)
takes the ``selective`` policy's runner by: ``None``, or ``runner(core, q, k, v)``, which
``passes/checkpointing.py`` sets to run the core checkpointed (the GPT family's eager
attention). A model with no such module runs its unfused cores whole under ``selective``, and
is priced so (``ModelFacts.attention_core_hook``)."""

HEAD_PARAMS = "head_split_params"
"""The attribute an attention module names its per-head parameters by (a tuple of attribute
names, each a tensor whose first dim is the query heads: GPT-OSS's ``sinks``): where tensor
parallelism splits the module's q, k and v by heads, ``passes/tensor_parallel.py`` splits these
``Shard(0)`` with them, and the module computes on its local shard."""


def no_rms_norm(module: nn.Module) -> tuple[nn.Parameter, float | None] | None:
    """A family without an RMSNorm class of its own (``nn.RMSNorm`` the pass knows itself)."""
    return None


def no_silu(module: nn.Module) -> bool:
    """A family without a SiLU module class of its own (``nn.SiLU`` the pass knows itself)."""
    return False


def no_context_attention(module: nn.Module) -> bool:
    """A family whose attention takes no context-parallel hook (context parallelism refused)."""
    return False


def no_context_problem(model: nn.Module) -> str | None:
    """A family whose models' attention, where it takes the hook, runs context-parallel as is."""
    return None


@dataclass(frozen=True)
class Family:
    """One model family: how to recognise its models and what the passes need to run them."""

    name: str
    """The family's name: ``"gpt"``; the ``family`` of its presets and its config class."""
    parts: ModelParts | None
    """Where its models' pieces are and how a pipeline stage calls them; ``None`` for a family
    that reads them off each model (``describe``)."""
    mismatch: Callable[[nn.Module], str | None] | None = None
    """model -> ``None`` where it is of this family, else why not (a clause of the error
    ``family_of`` raises); ``None`` here: the models are the instances of ``model_class``."""
    config_class: type | None = None
    """The frozen config dataclass ``autopar.models.build`` makes (its ``family`` ClassVar is
    ``name``); ``None`` for an adapter of models built elsewhere (transformers)."""
    model_class: type[nn.Module] | None = None
    """The module built from a ``config_class`` instance (``model_class(config)``)."""
    presets: tuple[Preset, ...] = ()
    """Named shapes of ``config_class``, in the order ``autopar models`` lists them."""
    rms_norm: Callable[[nn.Module], tuple[nn.Parameter, float | None] | None] = no_rms_norm
    """module -> (weight, eps) where it is an RMSNorm over the last dim of the family's own
    class (transformers' ``LlamaRMSNorm``), else ``None``: the ``rms_norm`` fusion swaps it."""
    is_silu: Callable[[nn.Module], bool] = no_silu
    """module -> whether it is a parameter-free SiLU of the family's own class (transformers'
    ``SiLUActivation``): the ``swiglu`` fusion reads it as ``F.silu``."""
    context_attention: Callable[[nn.Module], bool] = no_context_attention
    """module -> whether it is a causal attention of the family's that calls its
    ``context_parallel`` submodule, when it has one, as ``(q, k, v, dropout_p=, enable_gqa=,
    scale=, window=)`` in place of causal SDPA: ``passes/context_parallel.py`` gives it one
    under cp > 1."""
    context_problem: Callable[[nn.Module], str | None] = no_context_problem
    """model -> why its attention cannot run context-parallel although the family names hooked
    modules (a generic model's hand-written masked attention, positions the description cannot
    find), which ``admissibility`` reports as the reason cp > 1 is refused; ``None``: it can."""
    use_context_attention: Callable[[nn.Module], None] | None = None
    """model -> switch its attention to call the ``context_parallel`` hooks, where its modules
    do not by themselves (a transformers model: its attention implementation set to autopar's,
    ``models/hf_llama/context.py``); ``passes/context_parallel.py`` calls it once the hooks are
    set. ``None``: the attention calls them itself."""
    token_routing: bool = False
    """Its mixture-of-experts routers route every token on its own -- dropless, no load-balancing
    loss in the training loss (transformers' MoE) --, so context parallelism, which splits a
    call's tokens over the cp ranks, leaves the routing unchanged; ``False``: routing depends on
    the call's tokens together (capacity, an auxiliary loss), or the model has no experts."""
    expert_layers: Callable[[nn.Module], list[ExpertLayer]] = no_expert_layers
    """module (a model of the family, or a pipeline stage of one) -> its mixture-of-experts
    layers as expert parallelism sees them (``models.expert_layers``), in module order."""
    shorthands: Mapping[str, Callable[[Mapping[str, Any]], ModelSpec]] = field(
        default_factory=dict)
    """``--model`` names the family answers beside its presets (``hf-llama``): name ->
    (``--model-arg`` overrides -> the ``ModelSpec`` it stands for)."""
    init: Callable[[nn.Module], InitScheme] | None = None
    """model (meta or allocated) -> its ``InitScheme``: each parameter drawn from its own
    stream (``autopar.models.init``), so that a rank can initialise just its shards and equal
    the one-process build; ``None``: the model initialises itself (``init_weights()``), and a
    sharded build builds it whole once."""

    prepare: Callable[[nn.Module], None] | None = None
    """model -> None: what the family installs on a built model before it trains, on the ranks
    (``autopar.parallelize``) and in ``verify``'s one-process reference alike
    (``prepare_training``): ``hf-moe``'s load-balancing loss under ``output_router_logits``.
    ``None``: nothing."""

    describe: Callable[[nn.Module], ModelParts] | None = None
    """model -> its parts, for a family whose layout differs from model to model (the generic
    decoder family reads it off the module tree and the traced forward); called once its
    ``mismatch`` has accepted the model. ``None``: every model's parts are ``parts``."""
    fallback: bool = False
    """Tried after every other family (the generic decoder family): it describes a model only
    when no family of its own does."""
    tensor_parallel: str | None = None
    """Why the passes cannot split this family's models by tensor parallelism (a fused q/k/v
    projection, GPT-2's ``Conv1D``...), which ``admissibility`` reports as the reason tp > 1 is
    refused; ``None``: they can (the plan's ``nn.Linear``/``nn.Embedding`` splits)."""
    tensor_layout: Callable[[nn.Module], Any] | None = None
    """model -> how its blocks split under tensor parallelism, read off its code (the generic
    family: ``models.generic.tensor_parallel.ModelLayout``, whose ``heads`` and
    ``problem(styles, tp)`` the admissibility check asks), or why they cannot (a string,
    reported as the reason tp > 1 is refused); ``None``: the family's modules split as the
    plan's styles say."""

    trace_experts: Callable[[nn.Module], AbstractContextManager[frozenset[str]]] | None = None
    """model -> a context for the while of a trace, yielding the qualified names of the expert
    parameters it makes traceable (``GraphIR.expert_params``): the generic family's routed
    expert lists run as one static call (``models/generic/experts.py``). The tracer enters every
    family's (``trace_experts`` below); ``None``: nothing to do."""

    def parts_of(self, model: nn.Module) -> ModelParts:
        """The parts of ``model``, one of this family's models."""
        if self.describe is not None:
            return self.describe(model)
        assert self.parts is not None  # __post_init__ requires parts or describe
        return self.parts

    def __post_init__(self) -> None:
        where = f"autopar.models.Family({self.name!r})"
        if self.parts is None and self.describe is None:
            raise AutoparError("a family needs its models' parts, or a describe function "
                               "that reads them off each model; this one has neither",
                               where=where, fix="pass parts=ModelParts(...) or describe=...")
        if self.mismatch is None and self.model_class is None:
            raise AutoparError("a family recognises its models by a mismatch function or by "
                               "its model_class; this one has neither", where=where,
                               fix="pass mismatch=... or model_class=...")
        if self.config_class is not None:
            if self.model_class is None:
                raise AutoparError("a family with a config_class builds it with its "
                                   "model_class, which is missing", where=where,
                                   fix="pass model_class=... (the nn.Module taking the config)")
            if getattr(self.config_class, "family", None) != self.name:
                raise AutoparError(f"{self.config_class.__name__}.family is not {self.name!r}",
                                   where=where,
                                   fix=f"declare family: ClassVar[str] = {self.name!r} on it")
        if self.presets and self.config_class is None:
            raise AutoparError("presets are shapes of a config_class, which is missing",
                               where=where, fix="pass config_class=... or no presets")
        for preset in self.presets:
            if preset.family != self.name:
                raise AutoparError(f"preset {preset.name!r} is of family {preset.family!r}",
                                   where=f"{where}.presets",
                                   fix=f"list it in the folder of {preset.family!r}")

    def why_not(self, model: nn.Module) -> str | None:
        """``None`` where ``model`` is of this family, else why not."""
        if self.mismatch is not None:
            return self.mismatch(model)
        assert self.model_class is not None  # __post_init__ requires one of the two
        if isinstance(model, self.model_class):
            return None
        return f"not a {self.model_class.__name__}"


_FAMILIES: dict[str, Family] = {}
_PRESETS: dict[str, Preset] = {}
PRESETS: Mapping[str, Preset] = MappingProxyType(_PRESETS)
"""Every registered family's presets by name, in the zoo's order (a live read-only view)."""


def register(family: Family) -> Family:
    """Add ``family`` to the registry (a family's ``__init__`` does, on import); returns it.

    ``AutoparError`` where its name, a preset's or a shorthand's is another family's already.
    """
    where = f"autopar.models.register({family.name!r})"
    known = _FAMILIES.get(family.name)
    if known is family:
        return family
    if known is not None:
        raise AutoparError(f"a model family named {family.name!r} is registered already",
                           where=where, fix="give the new family another name")
    taken = {n: f.name for f in _FAMILIES.values() for n in (*_names(f), f.name)}
    for name in (*_names(family), family.name):
        if name in taken:
            raise AutoparError(f"the model name {name!r} is family {taken[name]!r}'s already",
                               where=where, fix="name the preset or shorthand differently")
    _FAMILIES[family.name] = family
    _arrange_presets()
    return family


def unregister(name: str) -> Family:
    """Remove the family ``name`` (and its presets) from the registry; returns it."""
    family = family_named(name)
    del _FAMILIES[name]
    _arrange_presets()
    return family


def _names(family: Family) -> tuple[str, ...]:
    return (*(p.name for p in family.presets), *family.shorthands)


def _arrange_presets() -> None:
    """``PRESETS`` in the zoo's order: families by name, the tiny shapes last."""
    ordered = [p for tiny in (False, True) for f in registered() for p in f.presets
               if p.tiny == tiny]
    _PRESETS.clear()
    _PRESETS.update((p.name, p) for p in ordered)


def registered() -> list[Family]:
    """Every registered family, by name, the fallback families (``Family.fallback``) last."""
    return sorted(_FAMILIES.values(), key=lambda f: (f.fallback, f.name))


def family_named(name: str) -> Family:
    """The registered family ``name``; ``AutoparError`` for another name."""
    family = _FAMILIES.get(name)
    if family is None:
        raise AutoparError(f"no model family named {name!r}", where="model family",
                           fix=f"use one of {', '.join(sorted(_FAMILIES))}")
    return family


def family_of(model: nn.Module) -> Family:
    """The family ``model`` is of (the first, by name, that recognises it; a fallback family,
    the generic decoder, only after every other); ``AutoparError`` naming each family's reason
    where none does."""
    reasons = []
    for family in registered():
        why = family.why_not(model)
        if why is None:
            return family
        reasons.append(f"{family.name}: {why}")
    raise AutoparError(
        f"no model family describes a {type(model).__name__} ({'; '.join(reasons)})",
        where="autopar.models.family_of",
        fix="write its forward as embedding -> a chain of its repeated blocks x = block(x, "
            "...) -> final norm and head (the generic decoder family), use a built-in model or "
            "a transformers causal LM of a registered family, or register a Family for it (a "
            "folder under autopar/models/); pp = 1 plans run without it")


@contextlib.contextmanager
def trace_experts(model: nn.Module) -> Iterator[frozenset[str]]:
    """Every registered family's ``Family.trace_experts`` on ``model`` for the while of a
    trace; yields the expert parameters' names they report."""
    with contextlib.ExitStack() as stack:
        names: set[str] = set()
        for family in _FAMILIES.values():
            if family.trace_experts is not None:
                names |= stack.enter_context(family.trace_experts(model))
        yield frozenset(names)


def prepare_training(model: nn.Module) -> None:
    """Its family's ``Family.prepare`` on ``model``; nothing for a model of no family."""
    try:
        family = family_of(model)
    except AutoparError:
        return
    if family.prepare is not None:
        family.prepare(model)


def config_family(config: object) -> Family | None:
    """The family whose ``config_class`` ``config`` is an instance of; ``None`` for another
    object (a transformers config)."""
    for family in registered():
        if family.config_class is not None and isinstance(config, family.config_class):
            return family
    return None


def shorthands() -> list[str]:
    """Every family's shorthand ``--model`` names (``hf-llama``), by family."""
    return [name for family in registered() for name in family.shorthands]


def shorthand_spec(name: str, overrides: Mapping[str, Any]) -> ModelSpec | None:
    """The spec the shorthand ``name`` stands for, with ``overrides``; ``None`` where no family
    has that shorthand."""
    for family in registered():
        make = family.shorthands.get(name)
        if make is not None:
            return make(overrides)
    return None
