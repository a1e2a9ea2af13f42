"""The propagation of a column split through one region's traced code: the op-by-op rules
of ``tensor_parallel.py`` (its step 2), and the data they produce.

From the column-split linears' outputs forward, each tensor's split dimension and the count of
units the ranks share there; a row split ends it; anything a rank could not run on its shard
raises ``Unmappable`` naming the op. ``propagate`` returns the region's ``RegionLayout``: its
column splits and their sections, its row splits, the counts tp must divide, its heads and the
size arguments a rank's code divides by tp (``tensor_parallel.rewrite``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.fx import GraphModule, Node

VALUE = "autopar_value"
"""``node.meta`` key of the value a node had on the fake run (a fake tensor, an int...)."""


class Unmappable(Exception):
    """The propagation reached an op it cannot run on a rank's shard."""

    def __init__(self, what: str, origins: frozenset[str]) -> None:
        super().__init__(what)
        self.what, self.origins = what, origins


@dataclass(frozen=True)
class SplitFeatures:
    """A tensor split over the tp ranks along ``dim`` into ``count`` units (each rank holds
    ``count / tp`` of them); ``origins``: the column linears whose split it comes from."""

    dim: int
    count: int
    origins: frozenset[str]


@dataclass(frozen=True)
class SizeArgument:
    """A size argument a rank's code divides by tp: ``args[arg]`` of node ``node`` (or item
    ``item`` of it, where the sizes are one tuple argument)."""

    node: str
    arg: int | str
    item: int | None = None


@dataclass(frozen=True)
class RegionLayout:
    """How one region splits: its column linears (name -> sections: 1, or 3 for a fused q, k and
    v), its row linears, the unit counts tp must divide (with what they are), its heads
    (query, key/value) where it has an attention, and the size arguments its code divides."""

    columns: Mapping[str, int]
    rows: tuple[str, ...]
    units: tuple[tuple[int, str], ...]
    heads: tuple[int, int] | None
    sites: tuple[SizeArgument, ...]

    def problem(self, tp: int) -> str | None:
        for count, what in self.units:
            if count % tp:
                return f"tp={tp} does not divide the {count} {what}"
        return None


@dataclass
class Region:
    """One module of the block that holds linears, traced for its call (``VALUE`` recorded)."""

    path: str
    """Its path in the block (``attn``)."""
    graph: GraphModule
    linears: tuple[str, ...]
    """Its ``nn.Linear`` calls (their paths in the region), in call order."""
    rewritten: dict[tuple[tuple[str, ...], int], Callable] = field(default_factory=dict)


_POINTWISE_FUNCTIONS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.neg, operator.pow,
    torch.add, torch.sub, torch.mul, torch.div, torch.pow, torch.neg, torch.exp, torch.tanh,
    torch.sigmoid, torch.sqrt, torch.rsqrt, torch.cos, torch.sin, torch.where, torch.abs,
    torch.masked_fill, torch.clamp, torch.square,
    F.gelu, F.relu, F.silu, F.tanh, F.sigmoid, F.dropout, F.leaky_relu, F.elu, F.softplus,
    F.mish, F.hardswish, F.relu6,
}
_POINTWISE_METHODS = frozenset({
    "add", "sub", "mul", "div", "pow", "neg", "exp", "tanh", "sigmoid", "sqrt", "rsqrt", "abs",
    "relu", "masked_fill", "clamp", "square", "float", "half", "bfloat16", "to", "type_as",
    "contiguous", "clone", "detach", "__add__", "__mul__", "__sub__", "__truediv__"})
_POINTWISE_MODULES = (nn.GELU, nn.ReLU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Dropout, nn.Identity,
                      nn.Mish, nn.LeakyReLU, nn.ELU, nn.Softplus, nn.Hardswish, nn.ReLU6)
_NORMS = (nn.LayerNorm, nn.RMSNorm)
_SOFTMAX = {torch.softmax: 1, F.softmax: 1, torch.log_softmax: 1, F.log_softmax: 1}
_MATMUL = {operator.matmul, torch.matmul, torch.bmm}
_SDPA_ARGS = ("query", "key", "value", "attn_mask")


def _value(a: object) -> object:
    return a.meta.get(VALUE) if isinstance(a, Node) else a


def _shape(a: object) -> tuple[int, ...] | None:
    v = _value(a)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _name(node: Node) -> str:
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


class _Propagation:
    def __init__(self, region: Region, columns: frozenset[str], discovering: bool) -> None:
        self.region, self.columns, self.discovering = region, columns, discovering
        self.split: dict[Node, SplitFeatures] = {}
        self.shape_of: dict[Node, SplitFeatures] = {}
        """``x.shape`` / ``x.size()`` nodes of split tensors (their item at the split dim is
        the rank's share, not the model's size)."""
        self.items: dict[Node, dict[int, SplitFeatures]] = {}
        """``split``/``chunk`` nodes -> the split of each item."""
        self.sections: dict[str, int] = {}
        self.rows: list[str] = []
        self.units: list[tuple[int, str]] = []
        self.heads: tuple[int, int] | None = None
        self.sites: list[SizeArgument] = []

    def fail(self, node: Node, why: str, *splits: SplitFeatures | None) -> Unmappable:
        origins = frozenset().union(*(s.origins for s in splits if s is not None))
        return Unmappable(f"{self.region.path}: {node.name} ({node.op} {_name(node)}) {why}",
                          origins)

    def run(self) -> RegionLayout:
        gm = self.region.graph
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "get_attr"):
                continue
            inputs = [n for n in node.all_input_nodes if n in self.split]
            shapes = [n for n in node.all_input_nodes if n in self.shape_of]
            items = [n for n in node.all_input_nodes if n in self.items]
            if node.op == "output":
                if inputs:
                    raise self.fail(node, "returns a column split's features: no row split "
                                    "closes it in the module", self.split[inputs[0]])
                continue
            if node.op == "call_module" and str(node.target) in self.region.linears:
                self._linear(node, inputs)
            elif shapes:
                self._size(node, shapes)
            elif items:
                self._item(node, items)
            elif inputs:
                self._op(node, inputs)
        columns = {c: self.sections[c] for c in self.region.linears if c in self.sections}
        named: dict[int, str] = {}
        for count, what in self.units:  # each count once, named by what last made it
            named[count] = what
        return RegionLayout(columns, tuple(self.rows), tuple(named.items()), self.heads,
                            tuple(self.sites))

    # linears: a column split starts, a row split ends
    def _linear(self, node: Node, inputs: list[Node]) -> None:
        name = str(node.target)
        out = _shape(node)
        if inputs:
            s = self.split[inputs[0]]
            if s.dim != len(_shape(inputs[0]) or ()) - 1:
                raise self.fail(node, "reads a column split's features along another "
                                "dimension than its input features", s)
            if name in self.columns and not self.discovering:
                raise self.fail(node, "is split by columns but reads another column split's "
                                "features", s)
            self.rows.append(name)
            self.units.append((s.count, f"features {name} reads"))
            return
        if name not in self.columns or out is None:
            return
        fused = self._sections(node)
        self.sections[name] = fused
        self.split[node] = SplitFeatures(len(out) - 1, out[-1], frozenset({name}))
        width = out[-1] // fused
        self.units.append((width, f"output features of {name}" +
                           (f" in each of its {fused} sections" if fused > 1 else "")))

    def _sections(self, node: Node) -> int:
        """1, or the equal sections a split/chunk right at the linear's output cuts it into."""
        dims = len(_shape(node) or ())
        found = set()
        for user in node.users:
            cut = _cut(user)
            if cut is None:
                found.add(1)
                continue
            dim, parts = cut
            if dim % dims == dims - 1 and parts < 1:
                raise self.fail(user, "cuts a column split's features anywhere but into the "
                                "equal sections of the linear's output (sections of unequal "
                                "width)", SplitFeatures(0, 0, frozenset({str(node.target)})))
            found.add(parts if dim % dims == dims - 1 else 1)
        if len(found) > 1:
            raise self.fail(node, "is read both whole and cut into sections along its "
                            "features", SplitFeatures(0, 0, frozenset({str(node.target)})))
        return found.pop() if found else 1

    # sizes read back from a split tensor
    def _size(self, node: Node, shapes: list[Node]) -> None:
        src = self.shape_of[shapes[0]]
        if node.op == "call_function" and node.target is operator.getitem:
            index = node.args[1]
            dims = len(_value(shapes[0]))  # type: ignore[arg-type]
            if isinstance(index, int) and index % dims == src.dim and node.users:
                raise self.fail(node, "reads the size of a column split's features, which a "
                                "rank holds only part of", src)
            return
        raise self.fail(node, "reads the sizes of a column split's features", src)

    def _item(self, node: Node, items: list[Node]) -> None:
        if node.op == "call_function" and node.target is operator.getitem and \
                node.args[0] in self.items and isinstance(node.args[1], int):
            got = self.items[node.args[0]].get(node.args[1])
            if got is not None:
                self.split[node] = got
            return
        raise self.fail(node, "reads the sections of a column split other than one by one",
                        *self.items[items[0]].values())

    # every other op reading a split tensor
    def _op(self, node: Node, inputs: list[Node]) -> None:
        s = self.split[inputs[0]]
        out = _shape(node)
        target, op = node.target, node.op
        module = self.region.graph.get_submodule(str(target)) if op == "call_module" else None
        name = target if op == "call_method" else None
        if op == "call_function" and target is getattr:
            if node.args[1] == "shape":
                self.shape_of[node] = s
                return
            if node.args[1] in ("ndim", "dtype", "device", "is_cuda"):
                return
            raise self.fail(node, f"reads .{node.args[1]} of a column split", s)
        if name == "size":
            if len(node.args) > 1 or "dim" in node.kwargs:
                dim = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
                if dim % len(_shape(inputs[0]) or (0,)) == s.dim:
                    raise self.fail(node, "reads the size of a column split's features, "
                                    "which a rank holds only part of", s)
                return
            self.shape_of[node] = s
            return
        if name in ("dim", "ndimension"):
            return
        if isinstance(module, _POINTWISE_MODULES) or target in _POINTWISE_FUNCTIONS or \
                name in _POINTWISE_METHODS:
            self._pointwise(node, out)
            return
        if isinstance(module, _NORMS):
            kept = len(module.normalized_shape)  # type: ignore[union-attr]
            if s.dim >= len(out or ()) - kept:
                raise self.fail(node, "normalises over a column split's features", s)
            self.split[node] = s
            return
        if target in _SOFTMAX or name in ("softmax", "log_softmax"):
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            if not isinstance(dim, int) or dim % len(out or (0,)) == s.dim:
                raise self.fail(node, "normalises over the split dimension", s)
            self.split[node] = s
            return
        if name in ("view", "reshape") or target is torch.reshape:
            self._view(node, inputs[0], s)
            return
        if name in ("flatten",) or target is torch.flatten:
            self._view(node, inputs[0], s, rewrite=False)
            return
        if name in ("transpose", "swapaxes") or target in (torch.transpose, torch.swapaxes):
            a, b = node.args[1:3]
            dims = len(out or ())
            a, b = a % dims, b % dims
            moved = b if s.dim == a else a if s.dim == b else s.dim
            self.split[node] = SplitFeatures(moved, s.count, s.origins)
            return
        if name == "permute" or target is torch.permute:
            order = node.args[1] if isinstance(node.args[1], (tuple, list)) else node.args[1:]
            dims = len(out or ())
            order = [d % dims for d in order]
            self.split[node] = SplitFeatures(order.index(s.dim), s.count, s.origins)
            return
        cut = _cut(node)
        if cut is not None:
            self._cut_along(node, inputs[0], s, cut)
            return
        if target is F.scaled_dot_product_attention:
            self._attention(node)
            return
        if target in _MATMUL or name in ("matmul", "bmm", "__matmul__"):
            self._matmul(node, out)
            return
        if target is torch.cat:
            self._cat(node, out)
            return
        if target is operator.getitem:
            self._index(node, inputs[0], s, out)
            return
        raise self.fail(node, "reads a column split's features, and autopar has no rule to "
                        "run it on a rank's shard", s)

    def _pointwise(self, node: Node, out: tuple[int, ...] | None) -> None:
        """Element-wise with broadcasting: every split argument lands on the same output
        dimension, and every other tensor argument has size 1 there (or no such dimension)."""
        if out is None:
            raise self.fail(node, "makes no tensor of a column split", *self._of(node))
        dims = len(out)
        landed = None
        for arg in _flat(node.args, node.kwargs):
            shape = _shape(arg)
            if shape is None:
                continue
            s = self.split.get(arg)  # type: ignore[arg-type]
            if s is None:
                continue
            at = s.dim + dims - len(shape)
            if landed is not None and (landed.dim, landed.count) != (at, s.count):
                raise self.fail(node, "combines column splits split differently", landed, s)
            before = landed.origins if landed else frozenset()
            landed = SplitFeatures(at, s.count, s.origins | before)
        assert landed is not None
        for arg in _flat(node.args, node.kwargs):
            shape = _shape(arg)
            if shape is None or arg in self.split:
                continue
            at = landed.dim - (dims - len(shape))
            if at >= 0 and shape[at] != 1:
                raise self.fail(node, f"combines a column split with a whole tensor of shape "
                                f"{list(shape)} along the split dimension", landed)
        self.split[node] = landed

    def _of(self, node: Node) -> list[SplitFeatures]:
        return [self.split[n] for n in node.all_input_nodes if n in self.split]

    def _view(self, node: Node, src: Node, s: SplitFeatures, rewrite: bool = True) -> None:
        before, after = _shape(src), _shape(node)
        assert before is not None and after is not None
        group = _group_of(before, after, s.dim)
        if group is None:
            raise self.fail(node, f"reshapes {list(before)} to {list(after)} so that the split "
                            "dimension does not lead its group", s)
        lands = group
        count = after[lands]
        self.units.append((count, f"units {node.name} cuts the features into"))
        self.split[node] = SplitFeatures(lands, count, s.origins)
        if rewrite:
            self._size_site(node, lands, len(after), s)

    def _size_site(self, node: Node, dim: int, dims: int, s: SplitFeatures) -> None:
        """Record the size argument of ``node`` (a ``view``/``reshape``) at output ``dim``."""
        offset = 1 if node.op == "call_method" or node.target is torch.reshape else 0
        args = node.args[offset:]
        if "shape" in node.kwargs or "size" in node.kwargs:
            raise self.fail(node, "takes its sizes by keyword", s)
        if len(args) == 1 and isinstance(args[0], (tuple, list)):
            sizes, item = args[0], True
        else:
            sizes, item = args, False
        if len(sizes) != dims:
            raise self.fail(node, "takes sizes autopar cannot read one by one", s)
        size = sizes[dim]
        if isinstance(size, int) and size == -1:
            return
        self.sites.append(SizeArgument(node.name, offset if item else offset + dim,
                               dim if item else None))

    def _cut_along(self, node: Node, src: Node, s: SplitFeatures, cut: tuple[int, int]) -> None:
        dim, parts = cut
        dims = len(_shape(src) or ())
        if dim % dims != s.dim:
            self.items[node] = {i: s for i in range(parts)}
            return
        origin = next(iter(s.origins))
        if src.op != "call_module" or self.sections.get(origin, 1) != parts:
            raise self.fail(node, "cuts a column split's features anywhere but into the equal "
                            "sections of the linear's output", s)
        each = SplitFeatures(s.dim, s.count // parts, s.origins)
        self.items[node] = {i: each for i in range(parts)}
        if node.target == "chunk" or node.target is torch.chunk:
            return
        offset = 1
        size = node.args[offset] if len(node.args) > offset else \
            node.kwargs.get("split_size_or_sections", node.kwargs.get("split_size"))
        if isinstance(size, (tuple, list)):
            for i in range(len(size)):
                self.sites.append(SizeArgument(node.name, offset, i))
        else:
            self.sites.append(SizeArgument(node.name, offset))

    def _attention(self, node: Node) -> None:
        named = dict(zip(_SDPA_ARGS, node.args))
        named.update({k: v for k, v in node.kwargs.items() if k in _SDPA_ARGS})
        q, k, v = (named.get(n) for n in _SDPA_ARGS[:3])
        splits = [self.split.get(t) for t in (q, k, v)]  # type: ignore[arg-type]
        if any(sp is None for sp in splits):
            raise self.fail(node, "attends with some of q, k and v split by heads and others "
                            "whole", *splits)
        dims = len(_shape(q) or ())
        if any(sp.dim != dims - 3 for sp in splits):  # type: ignore[union-attr]
            raise self.fail(node, "attends over q, k and v split along another dimension than "
                            "their heads", *splits)
        mask = named.get("attn_mask")
        shape = _shape(mask)
        if mask in self.split or (shape is not None and len(shape) >= 3 and
                                  shape[len(shape) - 3] != 1):
            raise self.fail(node, "attends with a mask of its own per head", *splits)
        qs, ks = splits[0], splits[1]
        self.heads = (qs.count, ks.count)  # type: ignore[union-attr]
        self.units.append((ks.count, "key/value heads"))  # type: ignore[union-attr]
        self.units.append((qs.count, "attention heads"))  # type: ignore[union-attr]
        self.split[node] = qs  # type: ignore[assignment]

    def _matmul(self, node: Node, out: tuple[int, ...] | None) -> None:
        a, b = node.args[:2]
        dims = len(out or ())
        found = []
        for t in (a, b):
            shape = _shape(t)
            s = self.split.get(t)  # type: ignore[arg-type]
            if s is None:
                continue
            if s.dim >= len(shape or ()) - 2:  # type: ignore[arg-type]
                raise self.fail(node, "multiplies along a column split's features (a partial "
                                "sum no row split closes)", s)
            found.append(SplitFeatures(s.dim + dims - len(shape or ()), s.count, s.origins))
        if len(found) == 2 and (found[0].dim, found[0].count) != (found[1].dim,
                                                                    found[1].count):
            raise self.fail(node, "multiplies tensors split differently", *found)
        for t in (a, b):
            shape = _shape(t)
            if t in self.split or shape is None:
                continue
            at = found[0].dim - (dims - len(shape))
            if 0 <= at < len(shape) - 2 and shape[at] != 1:
                raise self.fail(node, "multiplies a split tensor by a whole one along the "
                                "split dimension", found[0])
        self.split[node] = SplitFeatures(found[0].dim, found[0].count,
                                 frozenset().union(*(f.origins for f in found)))

    def _cat(self, node: Node, out: tuple[int, ...] | None) -> None:
        tensors = node.args[0]
        dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
        dims = len(out or ())
        splits = [self.split.get(t) for t in tensors]  # type: ignore[union-attr]
        first = next(sp for sp in splits if sp is not None)
        if any(sp is None or (sp.dim, sp.count) != (first.dim, first.count) for sp in splits) \
                or dim % dims == first.dim:
            raise self.fail(node, "concatenates column splits with whole tensors or along the "
                            "split dimension", first)
        self.split[node] = first

    def _index(self, node: Node, src: Node, s: SplitFeatures, out: tuple[int, ...] | None) -> None:
        index = node.args[1]
        index = index if isinstance(index, tuple) else (index,)
        dims = len(_shape(src) or ())
        if any(isinstance(i, Node) for i in index) or sum(i is Ellipsis for i in index) > 1:
            raise self.fail(node, "indexes a column split by tensors", s)
        plain = [i for i in index if i is not None and i is not Ellipsis]
        if Ellipsis in index:
            at = index.index(Ellipsis)
            fill = [slice(None)] * (dims - len(plain))
            index = (*index[:at], *fill, *index[at + 1:])
        position, out_dim = 0, 0
        for i in index:
            if i is None:
                out_dim += 1
                continue
            if position == s.dim:
                if i != slice(None):
                    raise self.fail(node, "indexes into the split dimension", s)
                self.split[node] = SplitFeatures(out_dim, s.count, s.origins)
                return
            if not isinstance(i, int):
                out_dim += 1
            position += 1
        self.split[node] = SplitFeatures(out_dim + (s.dim - position), s.count, s.origins)


def _flat(args: tuple, kwargs: dict) -> list[object]:
    found: list[object] = []
    torch.fx.node.map_aggregate((args, kwargs), lambda a: found.append(a) or a)
    return found


def _cut(node: Node) -> tuple[int, int] | None:
    """(dim, parts) of a ``split``/``chunk`` node into equal parts, else ``None``."""
    if node.op == "call_method" and node.target in ("split", "chunk"):
        args = node.args[1:]
    elif node.op == "call_function" and node.target in (torch.split, torch.chunk):
        args = node.args[1:]
    else:
        return None
    src = _shape(node.args[0])
    if src is None:
        return None
    dim = args[1] if len(args) > 1 else node.kwargs.get("dim", 0)
    size = args[0] if args else node.kwargs.get("chunks", node.kwargs.get(
        "split_size_or_sections", node.kwargs.get("split_size")))
    n = src[dim]
    if node.target in ("chunk", torch.chunk):
        parts = _value(size)
        return (dim, parts) if isinstance(parts, int) and n % parts == 0 else (dim, -1)
    size = _value(size)
    if isinstance(size, (tuple, list)):
        sizes = [_value(v) for v in size]
        return (dim, len(sizes)) if len(set(sizes)) == 1 else (dim, -1)
    return (dim, n // size) if isinstance(size, int) and size and n % size == 0 else (dim, -1)


def _group_of(before: tuple[int, ...], after: tuple[int, ...], dim: int) -> int | None:
    """The output dimension a ``view`` from ``before`` to ``after`` maps input ``dim`` onto:
    the first dimension of size > 1 of the output group whose elements are those of the input
    group ``dim`` belongs to, where ``dim`` leads its group (the dims before it there have size
    1); ``None`` where it does not."""
    i = j = 0
    while i < len(before) and j < len(after):
        gi, gj = [i], [j]
        pa, pb = before[i], after[j]
        while pa != pb:
            if pa < pb:
                i += 1
                if i >= len(before):
                    return None
                gi.append(i)
                pa *= before[i]
            else:
                j += 1
                if j >= len(after):
                    return None
                gj.append(j)
                pb *= after[j]
        if dim in gi:
            if any(before[d] != 1 for d in gi[:gi.index(dim)]):
                return None
            return next((d for d in gj if after[d] != 1), gj[0])
        i += 1
        j += 1
    return None


def propagate(region: Region, columns: frozenset[str], discovering: bool = False) -> RegionLayout:
    """``region``'s layout with ``columns`` split by columns (``discovering``: those of them
    reading a column split are row splits instead); ``Unmappable`` where its code cannot run
    on a rank's shards."""
    return _Propagation(region, columns, discovering).run()
