"""Initialisation one parameter at a time, so that a process can draw just the shards it holds.

Every parameter has its own random stream: a CPU ``torch.Generator`` seeded from the pair
(seed, the parameter's name) (``param_generator``). A parameter's value therefore depends on
the seed, its name, its shape and its law only -- not on the order in which the model is
built, on which other parameters exist, or on which process draws it. That is what lets a rank
of a sharded program build the model on the meta device, apply the plan, and then fill only
its own shards (``passes/materialize.py``): it draws one whole parameter on the CPU from that
parameter's stream, keeps its slice and frees the rest, parameter after parameter. The
one-process build (``ModelSpec.build(device, seed)``, the zoo's ``init_weights``) draws every
parameter the same way, so the two agree bit for bit.

An ``InitScheme`` says, for one model, the law of each parameter (``Normal`` or ``Constant``)
under its first name in ``named_parameters()`` order; a weight tied to another (GPT's head,
``head.weight`` is ``tok_emb.weight``) takes the value of that first name, so a pipeline
stage holding only the head draws the embedding's values. Values are drawn in fp32 and then
cast to the parameter's dtype, so a model built in bf16 equals the fp32 model cast to bf16.
Buffers (RoPE tables, causal masks) are computed, never drawn (``InitScheme.buffer``).

The laws are the families' own: GPT-2's N(0, 0.02) for every weight matrix and embedding, the
residual projections at 0.02 / sqrt(2 L), ones for norm weights, zeros for biases
(``layers.GPT2Init``); transformers' ``_init_weights`` for the ``hf-llama`` family
(N(0, ``initializer_range``), a padding row of zeros, ones for RMSNorm weights;
``hf_llama/init.py``). A family without a scheme (``Family.init`` is ``None``) initialises
its own way (``init_weights()``); a sharded build of it builds the whole model once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from autopar.core.errors import AutoparError

if TYPE_CHECKING:
    from autopar.models.family import Family


@dataclass(frozen=True)
class Normal:
    """N(0, ``std``); with ``zero_row`` that row of the result set to zero afterwards (an
    embedding's padding index, as transformers does)."""

    std: float
    zero_row: int | None = None

    def __call__(self, full: torch.Tensor, generator: torch.Generator) -> None:
        full.normal_(0.0, self.std, generator=generator)
        if self.zero_row is not None:
            full[self.zero_row] = 0.0


@dataclass(frozen=True)
class Constant:
    """Every entry ``value`` (ones for norm weights, zeros for biases); draws nothing."""

    value: float

    def __call__(self, full: torch.Tensor, generator: torch.Generator) -> None:
        full.fill_(self.value)


Law = Normal | Constant
"""How one parameter is drawn: called with the whole fp32 tensor and its own generator."""


def param_generator(seed: int, name: str) -> torch.Generator:
    """The CPU generator of parameter ``name`` under ``seed``: seeded with 63 bits of the
    BLAKE2b hash of ``"{seed}/{name}"`` (Python's ``hash`` differs between processes)."""
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).digest()
    return torch.Generator(device="cpu").manual_seed(int.from_bytes(digest, "little") >> 1)


def resolve_seed(seed: int | None) -> int:
    """``seed``, or for ``None`` one drawn from torch's global generator: a bare
    ``models.build(..., device="cpu")`` still takes its weights from ``torch.manual_seed``."""
    if seed is not None:
        return int(seed)
    return int(torch.randint(0, 2**62, (), dtype=torch.int64))


@dataclass(frozen=True)
class InitScheme:
    """How every parameter and buffer of one model is initialised, one at a time."""

    laws: Mapping[str, Law]
    """First name of every parameter (``named_parameters()`` order) -> its law."""
    shapes: Mapping[str, torch.Size]
    """First name of every parameter -> its whole shape."""
    aliases: Mapping[str, str]
    """Every name of every parameter (``remove_duplicate=False``) -> its first name."""
    buffer: Callable[[str], torch.Tensor]
    """Buffer name -> its computed value (CPU, whole)."""

    @classmethod
    def of(cls, model: nn.Module, law_of: Callable[[str], Law | None],
           buffer: Callable[[str], torch.Tensor]) -> InitScheme:
        """The scheme of ``model`` (on any device, meta included) with ``law_of(first name)``
        for every parameter; ``AutoparError`` naming a parameter without one."""
        first: dict[int, str] = {}
        aliases: dict[str, str] = {}
        laws: dict[str, Law] = {}
        shapes: dict[str, torch.Size] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            canonical = first.setdefault(id(p), name)
            aliases[name] = canonical
            if canonical != name:
                continue
            law = law_of(name)
            if law is None:
                raise AutoparError(f"no initialisation law for the parameter {name!r} of a "
                                   f"{type(model).__name__}", where="autopar.models.init",
                                   fix="give the family's init scheme a law for it")
            laws[name], shapes[name] = law, p.shape
        return cls(laws, shapes, aliases, buffer)

    def canonical(self, name: str) -> str:
        """The first name of the parameter called ``name``."""
        try:
            return self.aliases[name]
        except KeyError:
            raise AutoparError(f"the model has no parameter {name!r}",
                               where="autopar.models.init",
                               fix="initialise the model the scheme was made from") from None

    def value(self, name: str, seed: int) -> torch.Tensor:
        """The whole parameter ``name`` (or any of its names) under ``seed``: fp32, CPU."""
        canonical = self.canonical(name)
        full = torch.empty(self.shapes[canonical], dtype=torch.float32, device="cpu")
        self.laws[canonical](full, param_generator(seed, canonical))
        return full


@contextmanager
def keeping_parameters() -> Iterator[None]:
    """``Module.to_empty`` (and ``to``) swap the new tensors into the existing parameter objects
    (``torch.utils.swap_tensors``) inside this block. By default ``to_empty`` from meta makes
    new ``Parameter`` objects, one per module holding it, which unties a weight two modules
    share (GPT's head, a transformers ``lm_head`` tied to the embedding) and leaves anyone
    holding the old objects on meta."""
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        yield
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)


_DRAWS = frozenset({
    torch.Tensor.normal_, torch.Tensor.uniform_, torch.nn.init.normal_,
    torch.nn.init.uniform_, torch.nn.init.trunc_normal_})
"""Random fills a constructor's ``reset_parameters`` or ``_init_weights`` makes; on meta
``Tensor.normal_`` runs torch's Python reference, whose first call imports torch._dynamo
(0.7 s of the planner's command line on the CI machine)."""


class _NoMetaDraws(TorchFunctionMode):
    """Skips ``_DRAWS`` on meta tensors, which hold no values to draw: the tensor is returned
    as the fill would return it, shape, dtype and device unchanged."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DRAWS:
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


@contextmanager
def building_on(device: torch.device | str) -> Iterator[None]:
    """Build a model on ``device`` (a ``torch.device`` context); on meta the constructors'
    random fills are skipped (``_NoMetaDraws``), which changes nothing but the time: a
    meta tensor has a shape and no values."""
    device = torch.device(device)
    if device.type != "meta":
        with device:
            yield
        return
    with _NoMetaDraws(), device:
        yield


def tied_groups(model: nn.Module) -> list[list[str]]:
    """Every name of each parameter ``model`` holds under several names (a tied embedding and
    head), one list per parameter, in ``named_parameters`` order."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def scheme_of(model: nn.Module, family: Family | None = None) -> InitScheme | None:
    """The init scheme of ``model`` (its family's, or ``family``'s); ``None`` where the family
    has none or no family describes the model."""
    if family is None:
        from autopar.models.family import family_of

        try:
            family = family_of(model)
        except AutoparError:
            return None
    return family.init(model) if family.init is not None else None


@torch.no_grad()
def apply_scheme_(model: nn.Module, scheme: InitScheme, seed: int | None = None) -> None:
    """Initialise ``model`` (allocated: built on a device, or after ``to_empty``) in place by
    ``scheme``: each parameter drawn whole from its own stream, each buffer computed. ``seed``
    ``None`` draws one from torch's global generator (``resolve_seed``)."""
    seed = resolve_seed(seed)
    for name, p in model.named_parameters():
        p.copy_(scheme.value(name, seed))
    for name, b in model.named_buffers():
        b.copy_(scheme.buffer(name))


def unknown_buffer(model: nn.Module, name: str) -> AutoparError:
    """The error for a buffer a family's init scheme does not compute."""
    return AutoparError(f"the init scheme of {type(model).__name__} computes no buffer {name!r}",
                        where="autopar.models.init", fix="compute it in the family's scheme")


def initialise_(model: nn.Module, family: Family, seed: int | None = None) -> None:
    """Initialise a model of ``family`` built on a real device: by the family's scheme, or
    with the model's own ``init_weights()`` for a family without one."""
    scheme = scheme_of(model, family)
    if scheme is None:
        model.init_weights()
    else:
        apply_scheme_(model, scheme, seed)
