"""A decoder's ``ModelParts`` read off its module tree and its traced forward.

The description, for a model no family of its own describes (a user's ``FILE.py:FACTORY``):

1. The blocks are the repeated-block group of the module tree
   (``models.blocks.find_block_group``), which must be a whole ``nn.ModuleList`` (or
   ``nn.Sequential``).
2. ``torch.fx`` traces ``forward(tokens)`` (every other argument at its default, so a
   ``targets=None`` forward returns the logits) with each block a leaf: the graph calls the
   blocks as ``call_module`` nodes.
3. The blocks must form a chain, ``x = blocks[i](x, *extra, **extra_kw)`` in list order: block
   ``i + 1`` reads block ``i``'s output (or its item 0, for blocks returning a tuple), nothing
   else reads a block's output but the next block and, for the last, the code after the blocks,
   and every block takes the same extra arguments.
4. The graph is cut into three graphs: *embed* (the tokens -> the first block's input: the
   embeddings, positions, dropout), *extra* (the blocks' extra arguments: masks, rotary
   tables) and *finish* (the last block's output -> the logits: final norm, head). Under
   context parallelism the positions the first two build (``torch.arange`` over the sequence
   length) read the rank's global positions, and the blocks' SDPA runs over the K and V
   gathered from the cp ranks; what makes that sound, and the models refused, is
   ``context.py``. The extra
   arguments and the finish may read the tokens and the first block's input only through their
   shape, dtype or device, and no parameter before the blocks: every pipeline stage then
   recomputes the extra arguments from its own input (``ModelParts.block_args``) and the last
   one its logits, with no tensor sent but the activations.

A stage runs each graph's generated code with the stage root as ``self``: the root holds the
model's submodules under their original names (``passes/stage.py``), which are the names the
code reads. ``describe`` returns the parts, or the reason the forward is not such a chain --
the reason ``admissibility.ModelFacts.unsplittable`` reports (pp = 1 plans only).
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.fx
from torch import nn
from torch.fx import GraphModule, Node

from autopar.models.blocks import find_block_group
from autopar.models.generic.context import block_problem, context_attention, with_positions
from autopar.models.parts import ModelParts, stage_seq_len, token_positions

_META_ATTRS = frozenset({"shape", "device", "dtype", "ndim", "is_cuda"})
"""Tensor attributes that read no values."""
_META_METHODS = frozenset({"size", "dim", "new_zeros", "new_ones", "new_empty", "new_full"})
_META_FUNCTIONS = (torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like)


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
    extra: GraphModule
    finish: GraphModule
    block_returns_tuple: bool


_CACHE: weakref.WeakKeyDictionary[nn.Module, ModelParts | str] = weakref.WeakKeyDictionary()
_CONTEXT_PROBLEMS: weakref.WeakKeyDictionary[nn.Module, str | None] = \
    weakref.WeakKeyDictionary()
"""Model -> why its described chain cannot run context-parallel (``context.py``), or None."""
_BLOCKS: weakref.WeakSet[nn.Module] = weakref.WeakSet()
"""The blocks of every described chain: each takes a context-parallel hook, which
``call_block`` runs its SDPA calls by (``Family.context_attention`` of the generic family)."""


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
    if len(group.instances) != len(container):
        raise NotAChain(f"only {len(group.instances)} of the {len(container)} modules of "
                        f"{group.path} are identical blocks")
    gm = _trace(model, group.instances)
    graph = gm.graph
    tokens = next(n for n in graph.nodes if n.op == "placeholder")
    calls = [n for n in graph.nodes if n.op == "call_module" and n.target in group.instances]
    order = [n.target for n in calls]
    if order != list(group.instances):
        raise NotAChain(f"its forward calls the blocks of {group.path} as "
                        f"{', '.join(map(str, order)) or 'none of them'}, not once each in order")
    outs, as_tuple = _outputs(calls)
    x0 = calls[0].args[0] if calls[0].args else None
    if not isinstance(x0, Node):
        raise NotAChain(f"{calls[0].target} takes no activations as its first argument")
    extra = (calls[0].args[1:], dict(calls[0].kwargs))
    for prev, call in zip(outs, calls[1:]):
        if not call.args or call.args[0] is not prev:
            raise NotAChain(f"{call.target} does not read the output of the block before it "
                            "as its first argument (x = block(x, ...))")
        if (call.args[1:], dict(call.kwargs)) != extra:
            raise NotAChain(f"{call.target} takes other extra arguments than {calls[0].target}")
    blocks = set(calls) | set(outs)
    for out, call in zip(outs[:-1], calls[1:]):
        readers = {u for u in out.users} - {call}
        if readers:
            raise NotAChain(f"the output of {order[outs.index(out)]} is read beyond the next "
                            f"block ({', '.join(r.name for r in readers)}): a skip connection "
                            "across blocks")
    result = _result(graph)
    embed = _cut(gm, [x0], {tokens: "tokens"}, blocks, "the first block's input")
    extra_gm = _cut(gm, [extra], {tokens: "tokens", x0: "x"}, blocks,
                    "the blocks' extra arguments", meta_only=(tokens, x0))
    finish = _cut(gm, [result], {tokens: "tokens", x0: "x", outs[-1]: "h"}, blocks - {outs[-1]},
                  "the logits", meta_only=(tokens, x0))
    first, last, shared = (_modules(model, g, group.path) for g in (embed, finish, extra_gm))
    # context parallelism: the positions' aranges read the rank's global positions, and the
    # blocks' attention must be causal SDPA alone (context.py)
    position_problems = (with_positions(embed, "the embedding's graph"),
                         with_positions(extra_gm, "the blocks' extra arguments"))
    _CONTEXT_PROBLEMS[model] = (
        block_problem(model.get_submodule(str(calls[0].target)), str(calls[0].target),
                      *extra) or next((p for p in position_problems if p), None))
    _BLOCKS.update(model.get_submodule(str(c.target)) for c in calls)
    both = sorted(set(first) & set(last))
    if both:
        raise NotAChain(f"{', '.join(both)} runs both before and after the blocks")
    graphs = _Graphs(embed, extra_gm, finish, as_tuple)
    return ModelParts(
        blocks=group.path, first=tuple(first), last=tuple(last), head=_head(model, finish),
        embedding=_embedding(model, embed), embed=graphs_embed(graphs),
        finish=graphs_finish(graphs), block_args=graphs_block_args(graphs),
        call_block=call_tuple_block if as_tuple else call_block,
        shared=tuple(m for m in shared if m not in first and m not in last))


def context_problem(model: nn.Module) -> str | None:
    """Why ``model``, described as a chain, cannot run context-parallel (``context.py``);
    ``None`` where it can (``Family.context_problem`` of the generic family)."""
    found = describe(model)
    return found if isinstance(found, str) else _CONTEXT_PROBLEMS.get(model)


def is_block(module: nn.Module) -> bool:
    """Whether ``module`` is a block of a described chain (``Family.context_attention`` of the
    generic family: the blocks take the context-parallel hook)."""
    return module in _BLOCKS


def _trace(model: nn.Module, leaves: tuple[str, ...]) -> GraphModule:
    import inspect

    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError) as err:
        raise NotAChain(f"its forward's signature cannot be read ({err})") from None
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not named or named[0].kind not in (named[0].POSITIONAL_ONLY,
                                          named[0].POSITIONAL_OR_KEYWORD):
        raise NotAChain("its forward takes no positional token ids")
    concrete = {}
    for p in named[1:]:
        if p.default is p.empty:
            raise NotAChain(f"its forward's argument {p.name!r} has no default")
        concrete[p.name] = p.default
    was_training = model.training
    model.train()
    try:
        graph = _BlocksAsLeaves(leaves).trace(model, concrete_args=concrete or None)
    except Exception as err:  # noqa: BLE001 - any fx failure is the reason given
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise NotAChain(f"torch.fx cannot trace its forward with the blocks as leaves "
                        f"({type(err).__name__}: {first_line[:200]})") from None
    finally:
        model.train(was_training)
    return GraphModule(model, graph)


def _outputs(calls: list[Node]) -> tuple[list[Node], bool]:
    """Each block's hidden output: the call itself, or its item 0 where the blocks return a
    tuple (every use of the call is then ``out[0]``)."""
    outs = []
    tuples = []
    for call in calls:
        users = list(call.users)
        item0 = [u for u in users if u.op == "call_function" and u.target is operator.getitem
                 and u.args[1] == 0]
        if users and len(item0) == len(users) == 1:
            outs.append(item0[0])
            tuples.append(True)
        elif any(u.op == "call_function" and u.target is operator.getitem for u in users):
            raise NotAChain(f"{call.target}'s output is read by more than its item 0")
        else:
            outs.append(call)
            tuples.append(False)
    if len(set(tuples)) > 1:
        raise NotAChain("some blocks' outputs are tuples, others not")
    return outs, tuples[0]


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
    if user.op == "call_function" and user.target in _META_FUNCTIONS:
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
    """The last module with parameters the finish calls (the head); "" where none."""
    calls = [str(n.target) for n in finish.graph.nodes if n.op == "call_module"
             and any(True for _ in model.get_submodule(str(n.target)).parameters())]
    return calls[-1] if calls else ""


def _embedding(model: nn.Module, embed: GraphModule) -> str:
    """The ``nn.Embedding`` reading the tokens; "" where none."""
    tokens = next(n for n in embed.graph.nodes if n.op == "placeholder")
    for user in tokens.users:
        if user.op == "call_module" and isinstance(model.get_submodule(str(user.target)),
                                                   nn.Embedding):
            return str(user.target)
    return ""


# ---- what a stage runs: the graphs' code with the stage root as ``self`` ----------------------
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


def graphs_embed(graphs: _Graphs):
    def embed(root: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
        positions = token_positions(root, stage_seq_len(root), tokens.device)
        return _run(graphs.embed, root, tokens, positions)  # type: ignore[return-value]
    return embed


def graphs_block_args(graphs: _Graphs):
    def block_args(root: nn.Module, x: torch.Tensor, seq_len: int) -> tuple:
        held, positions = _held(root, seq_len, x.device)
        return _run(graphs.extra, root, _tokens_like(x, held), x,  # type: ignore[return-value]
                    positions)
    return block_args


def graphs_finish(graphs: _Graphs):
    def finish(root: nn.Module, h: torch.Tensor) -> torch.Tensor:
        held, _ = _held(root, stage_seq_len(root) or h.shape[1], h.device)
        return _run(graphs.finish, root, _tokens_like(h, held), h, h)  # type: ignore
    return finish


def call_block(block: nn.Module, x: torch.Tensor, extra: tuple) -> torch.Tensor:
    """``block(x, *args, **kwargs)`` with the traced forward's extra arguments (under context
    parallelism with its SDPA calls run by its hook: ``context.context_attention``)."""
    args, kwargs = extra
    with context_attention(block):
        return block(x, *args, **kwargs)


def call_tuple_block(block: nn.Module, x: torch.Tensor, extra: tuple) -> torch.Tensor:
    """``block(x, *args, **kwargs)[0]``: a block returning a tuple whose item 0 is the chain."""
    args, kwargs = extra
    with context_attention(block):
        return block(x, *args, **kwargs)[0]
