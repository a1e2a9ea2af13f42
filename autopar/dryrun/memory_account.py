"""``MemoryAccount``: every byte a program allocates, by kind, and the peak -- on fake tensors.

A ``TorchDispatchMode`` that sees every op's outputs and counts the storages they live in
(each once, however many views share it) until the storage is freed (a weak reference's
callback) or resized (FSDP2 frees and re-allocates its unsharded parameters with
``UntypedStorage.resize_``, which the account follows while it is active). Under
``FakeTensorMode`` no byte is really allocated, so a rank's program of any size can be
accounted on this machine; the same account works on real tensors.

Each storage gets a kind when it is created, from where the program is:

* ``activations``: made in a forward pass (what autograd keeps, and what dies at once);
* ``temporaries``: made in a backward pass (gradients of activations, recomputation);
* ``optimizer``: made in the optimizer step (the states at the first step);
* ``communication``: the buffers of collectives issued through a process group (FSDP's
  all-gather and reduce-scatter, DDP's all-reduce), not those of tensor parallelism's
  functional collectives, whose outputs are the layer's activations;

and a holder's kind takes precedence whenever the account looks (at every new peak, so the
breakdown of the peak is exact): ``parameters`` (the rank's shards and FSDP's gathered
copies), ``gradients`` (theirs), ``optimizer`` (the optimizer's states). The peak is the
largest sum over all kinds at any op; ``peak_breakdown`` is that moment's split.

A wrapper tensor subclass (torchao's ``Float8TrainingTensor``, the FP8 weight FSDP gathers; its
``WeightWithDynamicFloat8CastTensor``) holds no bytes of its own: its storage is a placeholder
of its nominal size, and its bytes are those of its inner tensors (``__tensor_flatten__``),
which the account counts instead (``_plain``). Counting the wrapper would count the bytes twice
and never free them (FSDP2 frees the inner data with ``resize_``): the dry run of a Llama 3 8B
ZeRO-3 plan with FP8 all-gather found 29 GiB that a real run of the same program on gloo does
not hold.

DTensor finds the shape of an op's output by running the op on fake *global* tensors; those
are not the program's (the account steps aside while ``ShardingPropagator`` does it).

The account also counts the collectives the program issues (``collectives``): torch's
``CommDebugMode`` does too, but its module tracker loses its place when forward and backward
passes of different micro-batches alternate (1F1B: an ``IndexError`` in its forward hook).

The account sits on every op of a step (a 405B pipeline rank's step is some 110,000 ops, half
of them ``tensor.device`` queries from the autograd engine and DTensor), so its per-op path is
kept short: device queries are answered as the fake tensor answers them, ``record_function``'s
markers run without the fake mode, what an op's name implies is worked out once per op,
storages are found by identity in a plain dictionary, and the holders are walked in one loop.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

KINDS = ("parameters", "gradients", "optimizer", "activations", "temporaries",
         "communication")
"""The kinds of bytes, in the order tables show them."""

HOLDER_KINDS = frozenset({"parameters", "gradients", "optimizer"})

_PLAIN = frozenset({torch.Tensor, FakeTensor, torch.nn.Parameter})
"""Tensor types that hold their own bytes (the per-op path's quick test; any other type goes
through ``_plain``)."""

_PROCESS_GROUP_OPS = "c10d"
"""The namespace of collectives issued through a ``ProcessGroup`` (``dist.all_gather_into_tensor``
and friends); tensor parallelism's functional collectives are ``_c10d_functional``."""
_DEVICE = torch.ops.prim.device.default
_NO_MEMORY = frozenset({_DEVICE})
"""Ops that make no tensor (``tensor.device`` comes through the mode under fake tensors)."""
_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional",
                                    "_c10d_functional_autograd"})
_POINT_TO_POINT = ("send", "recv_", "recv_any_source_")
_MARKERS = "profiler"
"""The namespace of ``record_function``'s markers (the pipeline schedule and FSDP put one
around each action): no tensor in or out. The fake mode runs their real kernel, after the
checks it makes of any op it cannot cache; the account runs it at once."""
_FAKE = torch._C._TorchDispatchModeKey.FAKE


def _active_fake_mode() -> FakeTensorMode | None:
    """The fake mode ops run under now. ``torch._guards.detect_fake_mode()`` answers the same
    outside compilation (the one fake mode on the dispatch stack), at some 20 times the cost."""
    return torch._C._get_dispatch_mode(_FAKE)


def _op_facts(func: Any) -> tuple[bool, str | None, bool]:
    """What the account does with ``func``: whether it is a marker (``_MARKERS``), the
    collective's name to count (None for other ops), and whether its buffers are
    ``communication``."""
    if func.namespace not in _COLLECTIVE_NAMESPACES:
        return func.namespace == _MARKERS, None, False
    name = func._schema.name.split("::")[-1]
    return False, name, func.namespace == _PROCESS_GROUP_OPS and \
        not name.startswith(_POINT_TO_POINT)


class MemoryAccount(TorchDispatchMode):
    """Bytes alive by kind while a program runs under it, and their peak.

    ``holders()`` yields ``(kind, tensor)`` for what the program holds -- parameters,
    gradients, optimizer states -- and is asked at every new peak."""

    def __init__(self, holders: Callable[[], Iterable[tuple[str, torch.Tensor]]]) -> None:
        super().__init__()
        self._holders = holders
        self._by_storage: dict[int, list[Any]] = {}
        """Entries ``[bytes, kind, weak reference]`` by ``id`` of the storage; the weak
        reference's callback frees the entry before the storage's id can be used again."""
        self._facts: dict[Any, tuple[bool, str | None, bool]] = {}
        self.totals: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.total = 0
        self.peak = 0
        self.peak_breakdown: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.in_optimizer = False
        self.collectives: dict[str, int] = {}
        """Collectives issued, by op name (``all_gather_into_tensor``, ``_allgather_base_``,
        ``send``...), functional and process-group ones alike."""
        self._fake_on_entry: FakeTensorMode | None = None
        self._resize: Callable[..., Any] | None = None
        self._propagate: Callable[..., Any] | None = None
        self._propagating = 0
        """Inside DTensor's shape propagation, which runs the op on fake global tensors."""

    # ----- what is alive -----
    def _entry(self, storage: torch.UntypedStorage) -> list[Any] | None:
        return self._by_storage.get(id(storage))

    def _add(self, storage: torch.UntypedStorage, kind: str) -> list[Any] | None:
        key = id(storage)
        entry = self._by_storage.get(key)
        if entry is not None:
            return entry
        nbytes = storage.nbytes()
        entry = [nbytes, kind, None]
        try:
            entry[2] = weakref.ref(storage, lambda _, key=key, entry=entry: self._free(key, entry))
        except TypeError:  # a storage that takes no weak reference cannot be followed
            return None
        self._by_storage[key] = entry
        self.totals[kind] += nbytes
        self.total += nbytes
        return entry

    def _free(self, key: int, entry: list[Any]) -> None:
        self.totals[entry[1]] -= entry[0]
        self.total -= entry[0]
        entry[0] = 0
        if self._by_storage.get(key) is entry:
            del self._by_storage[key]

    def _relabel(self, entry: list[Any], kind: str) -> None:
        if entry[1] != kind:
            self.totals[entry[1]] -= entry[0]
            self.totals[kind] += entry[0]
            entry[1] = kind

    def _resized(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        entry = self._entry(storage)
        if entry is None:
            entry = self._add(storage, self._kind_here())
            if entry is None:
                return
        change = nbytes - entry[0]
        entry[0] = nbytes
        self.totals[entry[1]] += change
        self.total += change
        self._maybe_peak()

    def track(self, tensors: Iterable[torch.Tensor], kind: str) -> None:
        """Count ``tensors`` (already allocated, e.g. the parameters) as ``kind``."""
        for t in tensors:
            if isinstance(t, DTensor):
                _storage(t)  # which raises: count a DTensor's local tensor
            for p in _plain(t):
                entry = self._add(_storage(p), kind)
                if entry is not None:
                    self._relabel(entry, kind)
        self._maybe_peak()

    def _kind_here(self) -> str:
        if self.in_optimizer:
            return "optimizer"
        if torch._C._current_autograd_node() is not None:
            return "temporaries"
        return "activations"

    def _look_at_holders(self) -> None:
        by_storage, totals = self._by_storage, self.totals
        for kind, t in self._holders():
            if isinstance(t, DTensor):
                _storage(t)  # which raises: count a DTensor's local tensor
            for p in ((t,) if type(t) in _PLAIN else _plain(t)):
                entry = by_storage.get(id(p.untyped_storage()))
                if entry is not None and entry[1] != kind:
                    totals[entry[1]] -= entry[0]
                    totals[kind] += entry[0]
                    entry[1] = kind

    def _maybe_peak(self) -> None:
        if self.total > self.peak:
            self._look_at_holders()
            self.peak = self.total
            self.peak_breakdown = dict(self.totals)

    # ----- the mode -----
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No ``torch._dynamo.disable`` around ``__torch_dispatch__`` (torch's default for a
        mode): the account never runs under ``torch.compile``, and the wrapper costs a few
        microseconds at each of a step's ops."""
        return False

    def __enter__(self) -> MemoryAccount:
        self._fake_on_entry = _active_fake_mode()
        account = self
        original = torch.UntypedStorage.resize_

        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            out = original(storage, size)
            account._resized(storage, int(size))
            return out

        self._resize = original
        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        propagate = ShardingPropagator._propagate_tensor_meta_non_cached

        def shapes_only(propagator: ShardingPropagator, *args: Any, **kwargs: Any) -> Any:
            account._propagating += 1
            try:
                return propagate(propagator, *args, **kwargs)
            finally:
                account._propagating -= 1

        self._propagate = propagate
        ShardingPropagator._propagate_tensor_meta_non_cached = shapes_only  # type: ignore
        return super().__enter__()

    def __exit__(self, *args: Any) -> None:
        if self._resize is not None:
            torch.UntypedStorage.resize_ = self._resize  # type: ignore[method-assign]
            self._resize = None
        if self._propagate is not None:
            ShardingPropagator._propagate_tensor_meta_non_cached = self._propagate  # type: ignore
            self._propagate = None
        super().__exit__(*args)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is _DEVICE and len(args) == 1 and isinstance(args[0], FakeTensor):
            # a fake tensor's device, as FakeTensorMode's handler answers it: no tensor made
            fake = args[0]
            return torch.device("meta") if fake.fake_mode.in_kernel_invocation \
                else fake.fake_device
        for t in types:
            if t is DTensor:
                return NotImplemented  # let DTensor run its local ops, which come back here
        facts = self._facts.get(func)
        if facts is None:
            facts = self._facts[func] = _op_facts(func)
        marker, name, communicates = facts
        if marker:
            fake = torch._C._unset_dispatch_mode(_FAKE)
            try:
                return func(*args, **(kwargs or {}))
            finally:
                if fake is not None:
                    torch._C._set_dispatch_mode(fake)
        out = func(*args, **kwargs) if kwargs else func(*args)
        if func in _NO_MEMORY or self._propagating or \
                _active_fake_mode() is not self._fake_on_entry:
            return out  # DTensor's own shape propagation, not the program's memory
        kind = self._kind_here()
        if isinstance(out, torch.Tensor) and type(out) in _PLAIN:
            self._add(out.untyped_storage(), kind)
        else:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and not isinstance(t, DTensor):
                    for p in _plain(t):
                        self._add(p.untyped_storage(), kind)
        if name is not None:
            self.collectives[name] = self.collectives.get(name, 0) + 1
        if communicates:
            for t in tree_flatten((args, kwargs))[0]:
                if isinstance(t, torch.Tensor) and not isinstance(t, DTensor):
                    entry = self._entry(t.untyped_storage())
                    if entry is not None and entry[1] not in HOLDER_KINDS:
                        self._relabel(entry, "communication")
        if self.total > self.peak:
            self._maybe_peak()
        return out


def _plain(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that hold ``t``'s bytes: ``t``, or a wrapper subclass's inner tensors (see
    the module docstring), recursively."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    return [p for name in names for p in _plain(getattr(t, name))]


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    if isinstance(t, DTensor):
        raise TypeError("count a DTensor's local tensor, not the DTensor: its storage is not "
                        "the bytes it holds")
    return t.untyped_storage()
