"""A decoder's ``ModelParts`` read off its module tree and its traced forward.

The description, for a model no family of its own describes (a user's ``FILE.py:FACTORY``, a
transformers decoder of an architecture no family names):

1. The blocks are the repeated-block group of the module tree
   (``models.blocks.find_block_group``), the modules of an ``nn.ModuleList`` (or
   ``nn.Sequential``). The container may hold other modules before them (DeepSeek-V3's dense
   first layers) or after them (``models.blocks.BlockSpan``): those run as the blocks do.
2. The forward ``forward(tokens)`` (every other argument at its default, ``use_cache=False``,
   so it returns the logits) is read as a graph in which each module of the container is one
   ``call_module`` node: ``torch.fx`` traces it with those modules as leaves; where fx cannot
   (transformers' ``forward(..., **kwargs)``), ``torch.export`` does, and its flat graph is
   collapsed into those calls (``exported.py``).
3. The modules must form a chain, ``x = module_i(x, *args_i, **kwargs_i)`` in container order:
   module ``i + 1`` reads module ``i``'s output (or one item of it, for modules returning a
   tuple), nothing else reads a module's output but the next module and, for the last, the code
   after them. Each module may take its own extra arguments (Gemma 2 alternates sliding-window
   and full attention masks).
4. The graph is cut into three graphs: *embed* (the tokens -> the first module's input: the
   embeddings, positions, dropout), *extra* (every module's extra arguments: masks, rotary
   tables) and *finish* (the last module's output -> the logits: final norm, head, a soft cap).
   Under context parallelism (fx-read descriptions only) the positions the first two build
   (``torch.arange`` over the sequence length) read the rank's global positions, and the
   blocks' SDPA runs over the K and V gathered from the cp ranks; what makes that sound, and
   the models refused, is ``context.py``. The extra arguments and the finish may read the
   tokens and the first module's input only through their shape, dtype or device, and no
   parameter before the blocks: every pipeline stage then recomputes the extra arguments from
   its own input (``ModelParts.block_args``) and the last one its logits, with no tensor sent
   but the activations.

A stage runs each graph's generated code with the stage root as ``self``: the root holds the
model's submodules under their original names (``passes/stage.py``), which are the names the
code reads. An exported graph holds for the dtype and the sizes it was traced at
(``exported.Specialization``); a stage of another compute dtype or micro-batch runs the graphs
of another export (``_Exports``). ``describe`` returns the parts, or the reason the forward is
not such a chain -- the reason ``admissibility.ModelFacts.unsplittable`` reports (pp = 1
plans only).
"""

from __future__ import annotations

import inspect
import operator
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.fx
from torch import nn
from torch.fx import GraphModule, Node

from autopar.core.errors import AutoparError
from autopar.models.blocks import find_block_group
from autopar.models.generic.context import block_problem, context_attention, with_positions
from autopar.models.generic.exported import (Exported, ExportFailed, Specialization,
                                             export_chain, meta_copy)
from autopar.models.generic.module_graph import failure, training
from autopar.models.parts import ModelParts, stage_seq_len, token_positions

_META_ATTRS = frozenset({"shape", "device", "dtype", "ndim", "is_cuda"})
"""Tensor attributes that read no values."""
_META_METHODS = frozenset({"size", "dim", "new_zeros", "new_ones", "new_empty", "new_full"})
_META_FUNCTIONS = (torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like)
_aten = torch.ops.aten
_META_OPS = frozenset({_aten.sym_size.int, _aten.sym_numel.default, _aten.sym_stride.int,
                       _aten.new_zeros.default, _aten.new_ones.default, _aten.new_empty.default,
                       _aten.new_full.default, _aten.zeros_like.default, _aten.ones_like.default,
                       _aten.empty_like.default, _aten.full_like.default})
"""ATen ops (an exported graph's) that read only the shape, dtype or device of their first
argument."""
_MOVES = frozenset({_aten.to.dtype, _aten.to.device, _aten.to.dtype_layout,
                    _aten._to_copy.default})


class NotAChain(Exception):
    """The forward is not embedding -> a chain of the blocks -> head (the message says why)."""


class _BlocksAsLeaves(torch.fx.Tracer):
    def __init__(self, leaves: Iterable[str]) -> None:
        super().__init__()
        self.leaves = frozenset(leaves)
        # a buffer read is a get_attr node, so what the code reads of it (``inv_freq.device``)
        # is read on each rank at run time, not baked in as the meta device of the trace
        self.proxy_buffer_attributes = True

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname in self.leaves or super().is_leaf_module(m, qualname)


@dataclass(frozen=True)
class _Graphs:
    """The three graphs a stage runs (their code, called with the stage root as ``self``)."""

    embed: GraphModule
    """(tokens, positions) -> the first module's input."""
    extra: GraphModule
    """(tokens, x, positions) -> each container module's (args, kwargs), in container order."""
    finish: GraphModule
    """(tokens, x, h, positions) -> the logits."""
    items: tuple[int | None, ...]
    """Per container module: the item of its output that the chain passes on (``None``: the
    output itself)."""


@dataclass(frozen=True)
class _Chain:
    """What reading a forward's graph finds: the graphs and the modules each stage holds."""

    graphs: _Graphs
    first: tuple[str, ...]
    last: tuple[str, ...]
    shared: tuple[str, ...]
    head: str
    embedding: str
    calls: list[Node] = field(compare=False)
    """The container modules' calls in the forward's graph."""
    positions_problem: str | None = None
    """Why the positions the embedding and the extra arguments build cannot be the rank's
    global ones under context parallelism (``context.with_positions``); ``None``: they can."""

    def layout(self) -> tuple:
        return self.first, self.last, self.shared, self.head, self.embedding


_CACHE: weakref.WeakKeyDictionary[nn.Module, ModelParts | str] = weakref.WeakKeyDictionary()
_CONTEXT_PROBLEMS: weakref.WeakKeyDictionary[nn.Module, str | None] = \
    weakref.WeakKeyDictionary()
"""Model -> why its described chain cannot run context-parallel (``context.py``), or None."""
_EXPORTED: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
"""Model -> why torch.fx could not trace its forward, for a chain read with torch.export."""
_BLOCKS: weakref.WeakSet[nn.Module] = weakref.WeakSet()
"""The blocks of every described chain: each takes a context-parallel hook, which
``call_block`` runs its SDPA calls by (``Family.context_attention`` of the generic family)
where ``_CONTEXT_PROBLEMS`` has no reason against it."""


def describe(model: nn.Module) -> ModelParts | str:
    """``model``'s parts, or why its forward is not a chain of its blocks (cached per model)."""
    known = _CACHE.get(model)
    if known is None:
        try:
            known = _describe(model)
        except NotAChain as why:
            known = str(why)
        _CACHE[model] = known
    return known


def _describe(model: nn.Module) -> ModelParts:
    group = find_block_group(model)
    if group is None:
        raise NotAChain("it has no repeated blocks (an nn.ModuleList of identical modules)")
    container = model.get_submodule(group.path)
    prefix = f"{group.path}." if group.path else ""
    leaves = tuple(prefix + name for name, _ in container.named_children())
    token, fixed = _feed(model)
    fx_failed = None
    try:
        gm = _trace(model, leaves, fixed)
        exports = None
    except NotAChain as err:
        fx_failed = err
        exports = _Exports.first(model, leaves, token, fixed, str(err))
        gm = exports.exported.graph_module
    chain = _read(model if exports is None else exports.exported.template, gm, leaves)
    # the first block and every module of the container that is no block: what cp checks
    checked = [c for c in chain.calls if str(c.target) not in group.instances[1:]]
    _BLOCKS.update(model.get_submodule(str(c.target)) for c in chain.calls)
    if exports is None:
        _CONTEXT_PROBLEMS[model] = _context_problem(model, chain, checked)
        select = _fixed(chain.graphs)
    else:
        _EXPORTED[model] = str(fx_failed)
        _CONTEXT_PROBLEMS[model] = (
            "its forward was read with torch.export (torch.fx cannot trace it), and context "
            "parallelism runs only where fx reads the blocks' attention and the positions")
        exports.known.append((exports.exported.specialization, chain))
        select = exports.graphs
    weights = tuple(str(n.target) for n in chain.graphs.embed.graph.nodes if n.op == "get_attr")
    return ModelParts(
        blocks=group.path, first=chain.first, last=chain.last, head=chain.head,
        embedding=chain.embedding, embed=graphs_embed(select, weights),
        finish=graphs_finish(select), block_args=graphs_block_args(select, group.path),
        call_block=call_block, shared=chain.shared)


def _read(model: nn.Module, gm: GraphModule, leaves: tuple[str, ...]) -> _Chain:
    """The chain of ``gm`` (a forward with each module of ``leaves`` one call), cut into the
    graphs a stage runs; ``NotAChain`` where it is no such chain (the module docstring)."""
    graph = gm.graph
    tokens = next(n for n in graph.nodes if n.op == "placeholder")
    calls = [n for n in graph.nodes if n.op == "call_module" and n.target in leaves]
    order = [str(n.target) for n in calls]
    if order != list(leaves):
        container = leaves[0].rpartition(".")[0]
        raise NotAChain(f"its forward calls the modules of {container} as "
                        f"{', '.join(order) or 'none of them'}, not once each in order")
    outs, items = _outputs(calls)
    x0 = calls[0].args[0] if calls[0].args else None
    if not isinstance(x0, Node):
        raise NotAChain(f"{calls[0].target} takes no activations as its first argument")
    for prev, call in zip(outs, calls[1:]):
        if not call.args or call.args[0] is not prev:
            raise NotAChain(f"{call.target} does not read the output of the block before it "
                            "as its first argument (x = block(x, ...))")
    blocks = set(calls) | set(outs)
    for out, call in zip(outs[:-1], calls[1:]):
        readers = {u for u in out.users} - {call}
        if readers:
            raise NotAChain(f"the output of {order[outs.index(out)]} is read beyond the next "
                            f"block ({', '.join(r.name for r in readers)}): a skip connection "
                            "across blocks")
    result = _result(graph)
    extras = [(c.args[1:], dict(c.kwargs)) for c in calls]
    embed = _cut(gm, [x0], {tokens: "tokens"}, blocks, "the first block's input")
    extra = _cut(gm, [extras], {tokens: "tokens", x0: "x"}, blocks,
                 "the blocks' extra arguments", meta_only=(tokens, x0))
    finish = _cut(gm, [result], {tokens: "tokens", x0: "x", outs[-1]: "h"}, blocks - {outs[-1]},
                  "the logits", meta_only=(tokens, x0))
    container = leaves[0].rpartition(".")[0]
    first, last, shared = (_modules(model, g, container) for g in (embed, finish, extra))
    both = sorted(set(first) & set(last))
    if both:
        raise NotAChain(f"{', '.join(both)} runs both before and after the blocks")
    head, embedding = _head(model, finish), _embedding(model, embed)
    # the graphs take the rank's global positions under cp (context.py), as a last input
    problems = (with_positions(embed, "the embedding's graph"),
                with_positions(extra, "the blocks' extra arguments"))
    return _Chain(_Graphs(embed, extra, finish, items), tuple(first), tuple(last),
                  tuple(m for m in shared if m not in first and m not in last), head,
                  embedding, calls, next((p for p in problems if p), None))


def _context_problem(model: nn.Module, chain: _Chain, checked: list[Node]) -> str | None:
    """Why the fx-read ``chain`` cannot run context-parallel (``context.py``: each call of
    ``checked`` traced, the blocks' others like the first)."""
    extras = [(c.args[1:], c.kwargs) for c in chain.calls]
    if any(e != extras[0] for e in extras[1:]):
        return ("its blocks take different extra arguments, which context parallelism does "
                "not check one by one")
    for call in checked:
        name = str(call.target)
        why = block_problem(model.get_submodule(name), name, call.args[1:], dict(call.kwargs))
        if why is not None:
            return why
    return chain.positions_problem


def context_problem(model: nn.Module) -> str | None:
    """Why ``model``, described as a chain, cannot run context-parallel (``context.py``);
    ``None`` where it can (``Family.context_problem`` of the generic family)."""
    found = describe(model)
    return found if isinstance(found, str) else _CONTEXT_PROBLEMS.get(model)


def read_by_export(model: nn.Module) -> str | None:
    """Why torch.fx could not trace ``model``'s forward where its chain was read with
    torch.export (whose graphs tensor parallelism cannot rewrite); ``None`` otherwise."""
    describe(model)
    return _EXPORTED.get(model)


def is_block(module: nn.Module) -> bool:
    """Whether ``module`` is a block of a described chain (``Family.context_attention`` of the
    generic family: the blocks take the context-parallel hook)."""
    return module in _BLOCKS


def _feed(model: nn.Module) -> tuple[str, dict[str, object]]:
    """(the forward's token argument, the values the others are fixed at) as every caller calls
    the model (``models.feed.feed_of``: defaults, ``use_cache=False`` for a transformers
    forward, whether it names it or takes it through ``**kwargs``), the targets at their
    default too, so that the forward returns the logits."""
    from autopar.models.feed import FeedKind, feed_of

    try:
        feed = feed_of(model)
    except AutoparError as err:
        raise NotAChain(err.what) from None
    if feed.kind is not FeedKind.TOKENS or feed.decoder is not None:
        raise NotAChain("its forward reads " + ("images" if feed.kind is FeedKind.IMAGES else
                                                "token ids in an encoder and a decoder")
                        + ", not one chain of blocks over the tokens")
    fixed = dict(feed.fixed)
    if feed.target is not None:
        target = inspect.signature(model.forward).parameters[feed.target]
        if target.default is target.empty:
            raise NotAChain(f"its forward's argument {feed.target!r} has no default")
        fixed[feed.target] = target.default
    return feed.main, fixed


def _trace(model: nn.Module, leaves: tuple[str, ...], fixed: dict[str, object]) -> GraphModule:
    try:
        with training(model):
            graph = _BlocksAsLeaves(leaves).trace(model, concrete_args=fixed or None)
    except Exception as err:  # noqa: BLE001 - any fx failure is the reason given
        raise NotAChain(f"torch.fx cannot trace its forward with the blocks as leaves "
                        f"({failure(err)})") from None
    return GraphModule(model, graph)


def _outputs(calls: list[Node]) -> tuple[list[Node], tuple[int | None, ...]]:
    """Each module's output the chain passes on: the call itself, or one item of it where the
    module returns a tuple (every use of the call is then ``out[item]``); and that item."""
    outs: list[Node] = []
    items: list[int | None] = []
    for call in calls:
        users = list(call.users)
        getitems = [u for u in users if u.op == "call_function" and u.target is operator.getitem]
        if getitems and len(getitems) == len(users) == 1 and isinstance(getitems[0].args[1], int):
            outs.append(getitems[0])
            items.append(getitems[0].args[1])
        elif getitems:
            raise NotAChain(f"{call.target}'s output is read by more than one item of it")
        else:
            outs.append(call)
            items.append(None)
    return outs, tuple(items)


def _result(graph: torch.fx.Graph) -> Node:
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], Node):
        out = out[0]
    if not isinstance(out, Node):
        raise NotAChain("its forward(tokens) does not return the logits (a tensor, or a tuple "
                        "whose first item is)")
    return out


def _cut(gm: GraphModule, outputs: list, inputs: dict[Node, str], blocks: set[Node],
         what: str, meta_only: tuple[Node, ...] = ()) -> GraphModule:
    """A graph of the nodes ``outputs`` need, ``inputs`` its placeholders; ``NotAChain`` where it
    needs a block's output or reads one of ``meta_only`` by value."""
    needed: set[Node] = set()
    stack = _nodes_in(outputs)
    while stack:
        node = stack.pop()
        if node in needed or node in inputs:
            continue
        if node in blocks:
            raise NotAChain(f"{what} read the output of {_block_name(node)}")
        if node.op == "placeholder":
            raise NotAChain(f"{what} read the forward's argument {node.target!r}")
        needed.add(node)
        stack.extend(node.all_input_nodes)
    for source in meta_only:
        for user in source.users:
            if user in needed and not _reads_meta_only(user, source):
                name = "the tokens" if source is meta_only[0] else "the first block's input"
                raise NotAChain(f"{what} read {name} by value ({user.name}: {user.op} "
                                f"{getattr(user.target, '__name__', user.target)}), not only "
                                "its shape: a later pipeline stage does not have them")
    graph = torch.fx.Graph()
    env: dict[Node, Node] = {node: graph.placeholder(name) for node, name in inputs.items()}
    for node in gm.graph.nodes:
        if node in needed:
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(torch.fx.node.map_arg(outputs[0], lambda n: env[n]))
    for node in graph.nodes:
        if node.op == "get_attr" and not _is_tensor_of(gm, node.target):
            raise NotAChain(f"{what} read {node.target}, a constant the trace made")
    return GraphModule(gm, graph)


def _nodes_in(value: object) -> list[Node]:
    found: list[Node] = []
    torch.fx.node.map_arg(value, lambda n: found.append(n) or n)
    return found


def _block_name(node: Node) -> str:
    while node.op != "call_module":
        node = node.args[0]
    return str(node.target)


def _reads_meta_only(user: Node, source: Node) -> bool:
    if user.op == "call_function" and user.target is getattr:
        return user.args[1] in _META_ATTRS
    if user.op == "call_method":
        return user.target in _META_METHODS and user.args[0] is source and \
            source not in user.args[1:]
    if user.op == "call_function" and (user.target in _META_FUNCTIONS
                                       or user.target in _META_OPS):
        return user.args[0] is source and source not in user.args[1:]
    return False


def _is_tensor_of(gm: GraphModule, target: str) -> bool:
    """Whether ``target`` is a parameter or buffer of the model (not a traced constant)."""
    owner, _, name = target.rpartition(".")
    try:
        module = gm.get_submodule(owner)
    except AttributeError:
        return False
    return name in module._parameters or name in module._buffers


def _modules(model: nn.Module, gm: GraphModule, blocks: str) -> list[str]:
    """The modules (paths) whose calls or tensors ``gm`` reads, and the model root's own
    parameters and buffers it reads, by name (a final norm's weight written inline in the
    forward: the stage that runs this graph holds it)."""
    found: list[str] = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            path = str(node.target)
        elif node.op == "get_attr":
            owner, _, name = str(node.target).rpartition(".")
            path = owner or name
        else:
            continue
        if not path or path in found:
            continue
        if blocks == path or blocks.startswith(path + "."):
            raise NotAChain(f"the forward reads {node.target} of {path}, which holds the blocks")
        found.append(path)
    return [p for p in found if not any(p.startswith(q + ".") for q in found)]


def _head(model: nn.Module, finish: GraphModule) -> str:
    """The module whose output is the logits: the last ``nn.Linear`` whose parameters the
    finish reads (by calling it, or by name in an exported graph), else the last module with
    parameters it reads; "" where none."""
    owners = []
    for n in finish.graph.nodes:
        if n.op == "call_module" and any(True for _ in
                                         model.get_submodule(str(n.target)).parameters()):
            owners.append(str(n.target))
        elif n.op == "get_attr" and isinstance(_attribute(model, str(n.target)), nn.Parameter):
            owners.append(str(n.target).rpartition(".")[0])
    linears = [o for o in owners if isinstance(model.get_submodule(o), nn.Linear)]
    return (linears or owners or [""])[-1]


def _embedding(model: nn.Module, embed: GraphModule) -> str:
    """The ``nn.Embedding`` reading the tokens (called, or its weight read by
    ``aten.embedding`` in an exported graph); "" where none."""
    tokens = next(n for n in embed.graph.nodes if n.op == "placeholder")
    users = list(tokens.users)
    for user in users:
        if user.op == "call_function" and user.target in _MOVES:  # ``tokens.to(device)``
            users.extend(user.users)
            continue
        if user.op == "call_module":
            path = str(user.target)
        elif user.target is _aten.embedding.default and user.args[0].op == "get_attr":
            path = str(user.args[0].target).rpartition(".")[0]
        else:
            continue
        if isinstance(model.get_submodule(path), nn.Embedding):
            return path
    return ""


def _attribute(root: nn.Module, target: str) -> object:
    owner, _, name = target.rpartition(".")
    return getattr(root.get_submodule(owner), name)


# ---- what a stage runs: the graphs' code with the stage root as ``self`` ----------------------
Select = Callable[[nn.Module, torch.dtype, int, int], _Graphs]
"""(stage root, its compute dtype, batch, sequence length) -> the graphs that hold for them."""


def _fixed(graphs: _Graphs) -> Select:
    """An fx-read description's graphs: they read dtypes and sizes off their inputs."""
    return lambda root, dtype, batch, seq: graphs


@dataclass
class _Exports:
    """An export-read description's graphs by the dtype and sizes they hold for: the first
    export's, then one more export of the model's meta copy for each other compute dtype or
    size a stage runs (``exported.Specialization``)."""

    exported: Exported
    leaves: tuple[str, ...]
    token: str
    fixed: dict[str, object]
    max_seq: int | None
    known: list[tuple[Specialization, _Chain]] = field(default_factory=list)

    @classmethod
    def first(cls, model: nn.Module, leaves: tuple[str, ...], token: str,
              fixed: dict[str, object], fx_failed: str) -> _Exports:
        max_seq = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        max_seq = max_seq if isinstance(max_seq, int) else None
        try:
            exported = export_chain(meta_copy(model), leaves, token, fixed, max_seq)
        except ExportFailed as err:
            raise NotAChain(f"{fx_failed}; {err}") from None
        return cls(exported, leaves, token, fixed, max_seq)

    def graphs(self, root: nn.Module, dtype: torch.dtype, batch: int, seq: int) -> _Graphs:
        for spec, chain in self.known:
            if spec.holds(dtype, batch, seq):
                return chain.graphs
        first_spec, first = self.known[0]
        template = meta_copy(self.exported.template, dtype)
        dynamic = first_spec.batch[0] <= batch <= first_spec.batch[1] and \
            first_spec.seq[0] <= seq <= first_spec.seq[1]
        try:
            again = export_chain(template, self.leaves, self.token, self.fixed, self.max_seq,
                                 sizes=None if dynamic else (batch, seq))
            chain = _read(template, again.graph_module, self.leaves)
        except (ExportFailed, NotAChain) as err:
            raise AutoparError(f"the model's forward, exported again for {dtype} and batch "
                               f"{batch} x sequence {seq}, is no longer the chain its "
                               f"description read ({err})", where="models/generic/describe.py",
                               fix="run it at the dtype and sizes of the description (fp32), "
                                   "or use pp=1") from None
        if chain.layout() != first.layout() or not again.specialization.holds(dtype, batch,
                                                                              seq):
            raise AutoparError(f"the model's forward, exported again for {dtype} and batch "
                               f"{batch} x sequence {seq}, reads other modules than its "
                               "description", where="models/generic/describe.py",
                               fix="use pp=1 for this model")
        self.known.append((again.specialization, chain))
        return chain.graphs


def _run(gm: GraphModule, root: nn.Module, *args: object) -> object:
    return type(gm).forward(root, *args)


def _tokens_like(x: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Stand-in token ids of the stage's shape (the graphs read only their shape and device)."""
    return torch.zeros((), dtype=torch.long, device=x.device).expand(x.shape[0], seq_len)


def _held(root: nn.Module, seq_len: int, device: torch.device
          ) -> tuple[int, torch.Tensor | None]:
    """(the tokens this rank holds of a sequence of ``seq_len``, their global positions under
    context parallelism, else ``None``)."""
    positions = token_positions(root, seq_len, device)
    return (seq_len if positions is None else positions.numel()), positions


def _weights_dtype(root: nn.Module, names: tuple[str, ...]) -> torch.dtype:
    """The dtype of the first floating tensor of ``names`` on ``root`` (the embedding's
    weight: the stage's compute dtype, bf16 under a bf16 plan's mixed precision); float32
    where there is none."""
    for name in names:
        value = _attribute(root, name)
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.dtype
    return torch.float32


def graphs_embed(select: Select, weights: tuple[str, ...]):
    """``ModelParts.embed``; ``weights``: the tensors the embedding's graph reads."""
    def embed(root: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        positions = token_positions(root, stage_seq_len(root), tokens.device)
        graphs = select(root, _weights_dtype(root, weights), *tokens.shape)
        return _run(graphs.embed, root, tokens, positions)  # type: ignore[return-value]
    return embed


def graphs_block_args(select: Select, container: str):
    def block_args(root: nn.Module, x: torch.Tensor, seq_len: int) -> dict:
        held, positions = _held(root, seq_len, x.device)
        graphs = select(root, x.dtype, x.shape[0], held)
        extras = _run(graphs.extra, root, _tokens_like(x, held), x, positions)
        return {module: (*extras[int(key)], graphs.items[int(key)])  # type: ignore[index]
                for key, module in root.get_submodule(container).named_children()}
    return block_args


def graphs_finish(select: Select):
    def finish(root: nn.Module, h: torch.Tensor) -> torch.Tensor:
        held, _ = _held(root, stage_seq_len(root) or h.shape[1], h.device)
        graphs = select(root, h.dtype, h.shape[0], held)
        return _run(graphs.finish, root, _tokens_like(h, held), h, h)  # type: ignore
    return finish


def call_block(block: nn.Module, x: torch.Tensor, extra: dict) -> torch.Tensor:
    """``block(x, *args, **kwargs)`` with the extra arguments the traced forward passes it
    (``extra``: ``block_args``' by module), its output's item the chain passes on where it
    returns a tuple; under context parallelism with its SDPA calls run by its hook
    (``context.context_attention``)."""
    args, kwargs, item = extra[block]
    with context_attention(block):
        out = block(x, *args, **kwargs)
    return out if item is None else out[item]
