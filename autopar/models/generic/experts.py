"""A hand-written mixture of experts in a generic decoder: found on the module tree, priced on
static shapes, split over the ep ranks with the user's own routing code.

**What is recognised** (``listed_moe``): a module whose parameter-holding children are exactly
a router ``nn.Linear(h, E)`` and an ``nn.ModuleList`` of E >= 2 experts of one class with the
same parameter shapes, each mapping h features to h; its forward takes the activations first
and returns a tensor of their shape. The usual hand-written MoE (Mixtral's reference
``MoeLayer``, nanoMoE): a top-k over the router's outputs, then each expert run on the rows
``torch.where`` finds for it and the outputs added back weighted. A module with other
parameters beside them -- a shared expert, a gate bias -- is not one: its trace stops at the
data-dependent row counts with ``tracing_errors.data_dependent_shape_error``.

**The top-k** (``top_k``) is read, not guessed: the layer's forward runs on zeros under
a ``TorchFunctionMode`` that stops it at its first ``topk`` over E values and records its k.

**Static shapes** (``MoEForward`` on symbolic tensors -- the trace, the dry run's fake tensors):
the user's loop has one unbacked row count per expert, which nothing on the meta device can
size. The layer then runs its router, the top-k, and every expert on the mean rows of a dropless
layer, ``ceil(k * T / E)`` (``moe.model.dropless_rows``, the zoo's mark of a dropless layer that
``workload.py`` reads), cut from one (E * rows, h) dispatch buffer, and the outputs added back
weighted -- the FLOPs and the all-to-all volume of the real dropless layer at a balanced load.
Its expert parameters are named in ``GraphIR.expert_params`` (``static_experts``), so the cost
model divides them by ep as it does stacked expert weights.

**Expert parallelism** (``ExpertLayer.install``, ``passes/expert_parallel.py``): rank r of the
ep group keeps experts ``r * E/ep ..`` under their own names (the others become
``OtherRankExpert``, which holds nothing: a checkpoint's expert keys live on their owners, as a
pipeline stage's do). The user's forward runs twice under one random state, with the expert list
swapped for stand-ins: the first pass records each expert call's rows (and returns zeros), the
rows go to their owners through the dispatch's ``exchange`` (the zoo's dropless all-to-all, uneven
splits), the owners run their experts, the outputs come back, and the second pass returns them to
the calls in order -- so routing, weighting and combining are the user's code, on the rank's own
tokens. The gradient reaches the rows through the first pass and the routing weights through the
second. The first pass's routing is extra work over one process's: the router GEMM, the top-k
and the gathers once more per layer and micro-batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch import nn
from torch.overrides import TorchFunctionMode

from autopar.core.errors import AutoparError
from autopar.models.expert_layers import ExpertLayer
from autopar.models.routing import dropless_rows, is_symbolic, scale_grad

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

torch.fx.wrap("dropless_rows")  # traced as the one call that marks a dropless layer here too


@dataclass(frozen=True)
class ListedMoE:
    """One recognised layer: ``module`` routes with ``router`` to ``module.<experts>``."""

    path: str
    module: nn.Module
    experts: str
    """The attribute of ``module`` holding the ``nn.ModuleList`` of experts."""
    router: nn.Linear

    @property
    def expert_list(self) -> nn.ModuleList:
        return self.module.get_submodule(self.experts)  # type: ignore[return-value]

    @property
    def num_experts(self) -> int:
        return self.router.out_features


def listed_moe(root: nn.Module) -> list[ListedMoE]:
    """Every recognised mixture-of-experts layer under ``root`` (a model or a pipeline stage),
    in module order (see the module docstring)."""
    found = []
    for path, module in root.named_modules():
        layer = _recognise(path, module)
        if layer is not None:
            found.append(layer)
    return found


def _recognise(path: str, module: nn.Module) -> ListedMoE | None:
    holding = [(n, c) for n, c in module.named_children()
               if any(True for _ in c.parameters())]
    lists = [(n, c) for n, c in holding if isinstance(c, nn.ModuleList)]
    routers = [c for _, c in holding if isinstance(c, nn.Linear)]
    if len(holding) != 2 or len(lists) != 1 or len(routers) != 1:
        return None
    name, experts = lists[0]
    router = routers[0]
    if len(experts) < 2 or router.out_features != len(experts):
        return None
    held = [e for e in experts if not isinstance(e, OtherRankExpert)]
    shapes = {(type(e), tuple((n, tuple(p.shape)) for n, p in e.named_parameters()))
              for e in held}
    if len(shapes) != 1 or not _maps(held[0], router.in_features):
        return None
    return ListedMoE(path, module, name, router)


def _maps(expert: nn.Module, width: int) -> bool:
    """Whether ``expert`` maps rows of ``width`` features to rows of ``width`` features."""
    param = next(expert.parameters())
    try:
        with torch.no_grad():
            out = expert(torch.zeros(2, width, device=param.device, dtype=param.dtype))
    except Exception:  # noqa: BLE001 - an expert that cannot take rows is not one
        return False
    return isinstance(out, torch.Tensor) and tuple(out.shape) == (2, width)


# ---------------------------------------------------------------------------- top-k, read


class _TopKFound(Exception):
    pass


class _TopKReader(TorchFunctionMode):
    """Stops a forward at its first ``topk`` over ``width`` values and records its k."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.width = width
        self.k: int | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.topk, torch.Tensor.topk) and args:
            k = args[1] if len(args) > 1 else kwargs.get("k")
            dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
            if isinstance(k, int) and args[0].shape[dim] == self.width:
                self.k = k
                raise _TopKFound
        return func(*args, **kwargs)


def top_k(layer: ListedMoE) -> int | None:
    """The k of the layer's routing: its forward run on zeros (on its router's device: meta
    for a model built there) up to its first ``torch.topk`` over E values; ``None`` where it
    makes none (or fails before one)."""
    width = layer.router.in_features
    weight = layer.router.weight
    for shape in ((2, 4, width), (8, width)):
        reader = _TopKReader(layer.num_experts)
        try:
            with reader, torch.no_grad():
                _user_forward(layer.module)(torch.zeros(shape, device=weight.device,
                                                        dtype=weight.dtype))
        except _TopKFound:
            return reader.k
        except Exception:  # noqa: BLE001 - try the next input shape
            continue
    return None


def _user_forward(module: nn.Module):
    known = module.__dict__.get("forward")
    return known.user if isinstance(known, MoEForward) else module.forward


# ------------------------------------------------------------------- the layer's forward


class OtherRankExpert(nn.Module):
    """Where another ep rank's expert was: it holds nothing and is never called."""

    def __init__(self, index: int, owner: int) -> None:
        super().__init__()
        self.index, self.owner = index, owner

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise AutoparError(f"expert {self.index} lives on ep rank {self.owner}, and was called "
                           "outside the expert-parallel dispatch",
                           where="autopar.models.generic.experts",
                           fix="call the MoE layer itself, not its experts")


class _Tape:
    """The expert calls of one forward: recorded in the first pass, answered in the second."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, torch.Tensor]] = []
        self.outs: list[torch.Tensor] | None = None
        self.next = 0


class _ExpertCall(nn.Module):
    """Expert ``index`` as the user's forward calls it in the two passes (``owner.tape``)."""

    def __init__(self, index: int, owner: MoEForward) -> None:
        super().__init__()
        self.index, self.owner = index, owner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tape = self.owner.tape
        rows = x.reshape(-1, x.size(-1))
        if tape.outs is None:
            tape.calls.append((self.index, rows))
            return torch.zeros_like(x)
        if tape.next >= len(tape.outs) or tape.calls[tape.next][0] != self.index or \
                tape.calls[tape.next][1].size(0) != rows.size(0):
            raise AutoparError("the MoE layer called its experts differently in the two passes "
                               "of the expert-parallel dispatch (random or stateful routing)",
                               where="autopar.models.generic.experts",
                               fix="route deterministically, or plan this model with ep = 1")
        out = tape.outs[tape.next]
        tape.next += 1
        return out.view_as(x)


class MoEForward:
    """The forward a recognised layer runs by (an instance attribute; ``user`` is its own)."""

    def __init__(self, layer: ListedMoE, k: int | None) -> None:
        self.layer, self.k = layer, k
        self.user = _user_forward(layer.module)
        self.dispatch: Any = None
        """``passes/expert_parallel.ExpertDispatch`` under expert parallelism, else ``None``."""
        self.tape = _Tape()
        self.stand_ins = nn.ModuleList(_ExpertCall(i, self) for i in range(layer.num_experts))
        """The expert list the user's forward sees during the two passes."""

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if is_symbolic(x):
            return self.static(x)
        if self.dispatch is None:
            return self.user(x, *args, **kwargs)
        return self.two_passes(x, *args, **kwargs)

    def static(self, x: torch.Tensor) -> torch.Tensor:
        """The layer on static shapes (see the module docstring)."""
        layer, e = self.layer, self.layer.num_experts
        if self.k is None:
            raise AutoparError(f"cannot read the top-k of the mixture of experts at "
                               f"{layer.path or 'the model'}: its forward makes no torch.topk "
                               f"over its {e} router outputs on meta tensors",
                               where=f"model.{layer.path}",
                               fix="route with torch.topk(router_logits, k, dim=-1)")
        flat = x.reshape(-1, x.size(-1))
        weights = torch.topk(layer.router(flat).softmax(-1), self.k, dim=-1)[0]
        rows = dropless_rows(flat.size(0), e, self.k)
        pick = torch.arange(e * rows, device=flat.device) % flat.size(0)
        buf = flat[pick]
        if self.dispatch is not None:
            out = self.dispatch.exchange_slots(buf.view(e, rows, -1)).reshape(e * rows, -1)
        else:
            out = torch.cat([expert(buf.narrow(0, i * rows, rows))
                             for i, expert in enumerate(layer.expert_list)])
        combined = torch.zeros_like(flat).index_add(0, pick, out)
        return (combined * weights.sum(-1, keepdim=True)).view_as(x)

    def two_passes(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        tape = self.tape = _Tape()
        with self._swapped():
            with torch.random.fork_rng(devices=[x.device] if x.is_cuda else []):
                self.user(x, *args, **kwargs)  # the second pass draws the same numbers
            tape.outs = self._exchange(tape.calls)
            out = self.user(x, *args, **kwargs)
        if tape.next != len(tape.calls):
            raise AutoparError("the MoE layer's second pass called its experts fewer times than "
                               "its first", where="autopar.models.generic.experts",
                               fix="route deterministically, or plan this model with ep = 1")
        return out

    def _exchange(self, calls: list[tuple[int, torch.Tensor]]) -> list[torch.Tensor]:
        """Each call's outputs: its rows sent to the expert's owner and back."""
        if not calls:
            raise AutoparError("the MoE layer called none of its experts",
                               where="autopar.models.generic.experts",
                               fix="check the layer's routing")
        order = sorted(range(len(calls)), key=lambda c: calls[c][0])
        counts = torch.zeros(self.layer.num_experts, dtype=torch.int64)
        for index, rows in calls:
            counts[index] += rows.size(0)
        out = self.dispatch.exchange(torch.cat([calls[c][1] for c in order]), counts)
        pieces = torch.split(out, [calls[c][1].size(0) for c in order])
        by_call = dict(zip(order, pieces))
        return [by_call[c] for c in range(len(calls))]

    @contextlib.contextmanager
    def _swapped(self) -> Iterator[None]:
        module, name = self.layer.module, self.layer.experts
        real = module._modules[name]
        module._modules[name] = self.stand_ins
        try:
            yield
        finally:
            module._modules[name] = real


def _forward_of(layer: ListedMoE) -> tuple[MoEForward, bool]:
    """The layer's ``MoEForward``, installed where it had none; whether it was installed now."""
    known = layer.module.__dict__.get("forward")
    if isinstance(known, MoEForward):
        return known, False
    known = layer.module.forward = MoEForward(layer, top_k(layer))
    return known, True


def install(model: nn.Module) -> list[MoEForward]:
    """Give every recognised layer of ``model`` its ``MoEForward`` (once); returns them."""
    return [_forward_of(layer)[0] for layer in listed_moe(model)]


@contextlib.contextmanager
def static_experts(model: nn.Module) -> Iterator[frozenset[str]]:
    """``install`` for the while of a trace, taking back what it installed after; yields the
    qualified names of the recognised layers' expert parameters (``GraphIR.expert_params``)."""
    installed = [(layer, _forward_of(layer)[1]) for layer in listed_moe(model)]
    names = set()
    for layer, _ in installed:
        prefix = f"{layer.path}.{layer.experts}" if layer.path else layer.experts
        names.update(f"{prefix}.{n}" for n, _ in layer.expert_list.named_parameters())
    try:
        yield frozenset(names)
    finally:
        for layer, new in installed:
            if new:
                layer.module.__dict__.pop("forward", None)


# --------------------------------------------------------------------- expert parallelism


def expert_layers(root: nn.Module) -> list[ExpertLayer]:
    """Every recognised layer of ``root`` as expert parallelism sees it."""
    return [_expert_layer(f) for f in install(root)]


def _expert_layer(forward: MoEForward) -> ExpertLayer:
    layer = forward.layer
    experts, e = layer.expert_list, layer.num_experts
    first: list[int] = [0]

    def shard(ep: DeviceMesh) -> list[nn.Module]:
        size, rank = ep.size(), ep.get_local_rank()
        local = e // size
        first[0] = rank * local
        for i in range(e):
            if not first[0] <= i < first[0] + local:
                experts[i] = OtherRankExpert(i, i // local)
        return [experts[i] for i in range(first[0], first[0] + local)]

    def run(x: torch.Tensor, counts: list[int] | None, grad_scale: float) -> torch.Tensor:
        if counts is None:  # (E_local, C, h)
            return torch.stack([_scaled(experts[first[0] + j], part, grad_scale)
                                for j, part in enumerate(x)])
        return torch.cat([_scaled(experts[first[0] + j], rows, grad_scale)
                          for j, rows in enumerate(torch.split(x, counts))])

    def install_dispatch(dispatch: Any) -> None:
        forward.dispatch = dispatch

    return ExpertLayer(experts=experts, weights=(), num_experts=e, top_k=forward.k or 0,
                       capacity_factor=None, run=run, install=install_dispatch, shard=shard)


def _scaled(expert: nn.Module, rows: torch.Tensor, grad_scale: float) -> torch.Tensor:
    """``expert(rows)`` with its weights' gradients scaled by ``grad_scale`` and the rows'
    left as they are: the output's gradient scaled on the way in, the input's unscaled on the
    way out (exact for a power-of-two ep)."""
    return scale_grad(expert(scale_grad(rows, 1.0 / grad_scale)), grad_scale)


def tensor_parallel_problem(model: nn.Module) -> str | None:
    """Why a model with recognised layers cannot split them by tensor parallelism."""
    layers = listed_moe(model)
    if not layers:
        return None
    return (f"its mixture-of-experts layers ({layers[0].path}, ...) route rows to whole "
            "experts: split them by expert parallelism (ep) instead")
