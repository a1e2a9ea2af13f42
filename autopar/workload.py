"""From a traced ``GraphIR`` to the cost model's ``Workload``.

Three analyses over the graph, each a small function:

* **Tensor-parallel classes** (``classify_tp``): a forward propagation of Megatron's sharding
  states over each layer. A linear fed a replicated activation is column-parallel (its output is
  sharded over heads / ffn / vocabulary); a linear fed a sharded one is row-parallel (its partial
  output is all-reduced back to replicated); other ops carry their inputs' state. A router (a
  linear whose output feeds a top-k) stays replicated. This is the fixed Megatron assignment the
  cost model prices for a given ``tp``; the search (a later stage) chooses per-op strategies.
* **Saved activations** (``saved_tensors``): which tensors each op keeps for its backward pass,
  by op (a GEMM keeps its activation inputs, softmax its output, dropout a one-byte mask, GELU
  its input...), deduplicated through views to the tensor that owns the storage. For a GPT
  block with eager attention this gives Korthikanti et al.'s 34*s*h + 5*a*s^2 bytes exactly.
  Each is marked with the policies that keep it: autograd without checkpointing, and the
  selective policy of ``passes/checkpointing.py``, which keeps the block input and the outputs
  of the linear layers and of fused attention and recomputes every other op. A fused kernel
  (``fusions``) keeps what its autograd saves instead of what its eager ops would; the loss
  also records what it holds only while it runs (``transient``).
* **Costs per op** (``op_costs``): FLOPs and bytes per sequence, and which roofline applies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from autopar.costmodel.workload import (
    LayerCost,
    OpCost,
    OpKind,
    Phase,
    SavedTensor,
    Shard,
    TPCollective,
    Workload,
)
from autopar.fusion_patterns import find_fusions, fused_bytes
from autopar.graph import GraphIR, NodeInfo

GEMM_OPS = frozenset({"linear", "matmul", "bmm", "baddbmm", "mm", "addmm", "einsum", "grouped_mm"})
ACTIVATIONS_SAVING_INPUT = frozenset({"gelu", "silu", "tanh", "sigmoid", "pow", "log", "sin",
                                      "cos"})
SAVING_OUTPUT = frozenset({"softmax", "log_softmax", "relu", "rsqrt", "exp", "sqrt"})
NOTHING_SAVED = frozenset({
    "add", "sub", "neg", "cat", "stack", "view", "contiguous", "masked_fill", "where", "mean",
    "sum", "cumsum", "one_hot", "zeros", "ones", "full", "arange", "eq", "lt", "gt", "le", "ge",
    "ne", "to", "type_as", "float", "argmax", "clone", "copy", "fill", "new_zeros", "zeros_like",
    "ones_like", "max", "min", "clamp", "floor", "ceil", "triu", "tril", "bool", "long", "cast",
    "sort", "argsort", "histc", "pad", "bincount",
})
INDEX_SAVING = frozenset({"topk", "scatter", "scatter_add", "index_add", "gather", "index",
                          "index_select", "index_put", "embedding"})
MUL_LIKE = frozenset({"mul", "div"})
NORMS = frozenset({"layer_norm", "rms_norm", "group_norm"})
KNOWN_OPS = (GEMM_OPS | ACTIVATIONS_SAVING_INPUT | SAVING_OUTPUT | NOTHING_SAVED | INDEX_SAVING
             | MUL_LIKE | NORMS | {"sdpa", "dropout", "cross_entropy"})

R, S = "replicated", "sharded"


@dataclass
class _TP:
    state: dict[str, str]
    column: set[str]
    row: set[str]
    router: set[str]
    expert: set[str]


def _base(graph: GraphIR, name: str, inside: frozenset[str] = frozenset()) -> str:
    """The node owning the storage of ``name``'s output (through views, and through the
    no-op dropouts (p = 0) among ``inside``, which return their input itself)."""
    while graph.has_node(name):
        node = graph.node(name)
        alias = node.op == "view" or (node.op == "dropout" and name in inside
                                      and _dropout_p(node) == 0.0)
        if not alias or not node.inputs:
            return name
        name = node.inputs[0]
    return name


def _consumers(nodes: list[NodeInfo]) -> dict[str, list[NodeInfo]]:
    out: dict[str, list[NodeInfo]] = {}
    for n in nodes:
        for i in n.inputs:
            out.setdefault(i, []).append(n)
    return out


def _feeds_topk(name: str, consumers: dict[str, list[NodeInfo]], depth: int = 3) -> bool:
    frontier = [name]
    for _ in range(depth):
        nxt = []
        for f in frontier:
            for c in consumers.get(f, []):
                if c.op == "topk":
                    return True
                nxt.append(c.name)
        frontier = nxt
    return False


def is_weight_gemm(node: NodeInfo, graph: GraphIR) -> bool:
    """A GEMM of one activation by parameters (a linear layer, or stacked expert weights)."""
    if node.op not in GEMM_OPS or not node.params:
        return False
    return len([i for i in node.inputs if graph.has_node(i)]) == 1


def classify_tp(graph: GraphIR, nodes: list[NodeInfo]) -> _TP:
    """Megatron sharding states over ``nodes`` (inputs from outside are replicated)."""
    tp = _TP({}, set(), set(), set(), set())
    consumers = _consumers(nodes)
    for n in nodes:
        ins = [tp.state.get(i, R) for i in n.inputs]
        sharded_in = S in ins
        expert = n.op in GEMM_OPS and any(len(graph.params[p].shape) == 3 for p in n.params
                                          if p in graph.params)
        if expert:
            tp.expert.add(n.name)
        if n.op == "embedding":
            tp.state[n.name] = R  # vocabulary-parallel: partial sums all-reduced
            tp.row.add(n.name)
        elif is_weight_gemm(n, graph) or expert:
            if sharded_in:
                tp.row.add(n.name)
                tp.state[n.name] = R
            elif _feeds_topk(n.name, consumers):
                tp.router.add(n.name)
                tp.state[n.name] = R
            else:
                tp.column.add(n.name)
                tp.state[n.name] = S
        elif n.op == "cross_entropy":
            tp.state[n.name] = R  # vocabulary-parallel loss
        else:
            tp.state[n.name] = S if sharded_in else R
    return tp


def _shard(tp: _TP, n: NodeInfo) -> Shard:
    if n.op not in KNOWN_OPS:
        return Shard.REPLICATED
    return Shard.TP if tp.state.get(n.name) == S else Shard.SEQ


def _op_shard(tp: _TP, n: NodeInfo) -> Shard:
    """How an op's work divides: a column- or row-parallel GEMM and any op reading a sharded
    activation run on 1/tp of the data; the vocabulary-parallel embedding does a full lookup."""
    if n.op == "embedding":
        return Shard.SEQ
    if n.name in tp.column or n.name in tp.row or n.name in tp.expert:
        return Shard.TP
    if any(tp.state.get(i) == S for i in n.inputs):
        return Shard.TP
    return _shard(tp, n)


def _dropout_p(n: NodeInfo) -> float:
    """The dropout probability of a dropout node (0 in eval mode or when p = 0)."""
    for a in n.scalar_args:
        if isinstance(a, tuple) and len(a) == 2 and a[0] in ("p", "train"):
            if a[0] == "train" and a[1] is False:
                return 0.0
            if a[0] == "p" and isinstance(a[1], float):
                return a[1]
        elif isinstance(a, float):
            return a
    return 0.0


def is_linear(node: NodeInfo, graph: GraphIR) -> bool:
    """A linear layer: a GEMM of one activation by a weight matrix, which PyTorch runs as
    ``aten.mm``/``addmm`` -- the ops whose outputs the selective policy keeps. Stacked expert
    weights (3-d) run as ``bmm`` and are recomputed."""
    return is_weight_gemm(node, graph) and all(
        len(graph.params[p].shape) <= 2 for p in node.params if p in graph.params)


def kept_by_selective(node: NodeInfo, graph: GraphIR) -> bool:
    """Whether the selective policy keeps ``node``'s output instead of recomputing it."""
    return node.op == "sdpa" or is_linear(node, graph)


def _kind(n: NodeInfo) -> OpKind:
    if n.op in GEMM_OPS:
        return OpKind.MATMUL
    if n.op == "sdpa":
        return OpKind.ATTENTION
    if n.op == "view" or (n.op == "dropout" and _dropout_p(n) == 0.0):
        return OpKind.FREE
    return OpKind.MEMORY


def saved_tensors(graph: GraphIR, nodes: list[NodeInfo], tp: _TP,
                  fusions: tuple[str, ...] = ()) -> tuple[SavedTensor, ...]:
    """The activations ``nodes`` keep for backward, per sequence, each storage counted once,
    marked with the policies that keep them (without checkpointing; selective); a match of a
    fused kernel's pattern keeps what the kernel saves (``_keep_fused``)."""
    seen: dict[str, SavedTensor] = {}
    per_seq = 1.0 / graph.batch
    inside = frozenset(n.name for n in nodes)
    fused = {c.name: (pattern, chain) for pattern, chain in find_fusions(graph, nodes, fusions)
             if pattern in KERNEL_FUSIONS for c in chain}

    def activation(name: str, shard: Shard | None = None) -> SavedTensor | None:
        if not graph.has_node(name):
            return None
        src = graph.node(name)
        if src.out is None or not src.out.dtype.is_floating_point:
            return None
        return SavedTensor(name, src.out.numel * per_seq, shard or _shard(tp, src))

    def keep(name: str) -> None:
        base = _base(graph, name, inside)
        if base not in seen and (t := activation(base)) is not None:
            seen[base] = t

    def extra(key: str, elements: float, size: float | None, shard: Shard,
              transient: bool = False) -> None:
        seen[key] = SavedTensor(key, elements * per_seq, shard, size,
                                without_checkpoint=not transient, transient=transient)

    for n in nodes:
        shard = _shard(tp, n)
        if n.name in fused:
            pattern, chain = fused[n.name]
            if n is chain[-1]:
                _keep_fused(graph, tp, pattern, chain, keep, extra, seen)
        elif n.op in GEMM_OPS:
            for i in n.inputs:
                keep(i)
        elif n.op == "sdpa":
            for i in n.inputs[:3]:
                keep(i)
            keep(n.name)
            q = graph.node(n.inputs[0]).out if n.inputs else None
            if q is not None and len(q.shape) == 4:
                extra(n.name + ".lse", q.shape[0] * q.shape[1] * q.shape[2], 4.0, shard)
        elif n.op in NORMS:
            for i in n.inputs[:1]:
                keep(i)
            if n.out is not None and len(n.out.shape) >= 1:
                stats = 1 if n.op == "rms_norm" else 2  # rstd; or mean and rstd
                extra(n.name + ".stats", stats * n.out.numel / n.out.shape[-1], 4.0, shard)
        elif n.op in ACTIVATIONS_SAVING_INPUT:
            for i in n.inputs[:1]:
                keep(i)
        elif n.op in SAVING_OUTPUT:
            keep(n.name)
        elif n.op == "dropout":
            if _dropout_p(n) > 0 and n.out is not None:
                extra(n.name + ".mask", n.out.numel, 1.0, shard)
        elif n.op in MUL_LIKE:
            if len(n.inputs) >= 2:
                for i in n.inputs:
                    keep(i)
            elif n.params:
                for i in n.inputs:
                    keep(i)
        elif n.op == "cross_entropy":
            if n.inputs:
                logits = graph.node(n.inputs[0]).out if graph.has_node(n.inputs[0]) else None
                if logits is not None:
                    # the program upcasts the logits and keeps log_softmax's fp32 output; its
                    # backward holds that, the fp32 gradient of the log-probabilities and the
                    # one of the logits at once: 8 bytes per logit beyond what is kept
                    logits_shard = _shard(tp, graph.node(n.inputs[0]))
                    extra(n.name + ".logprobs", logits.numel, 4.0, logits_shard)
                    extra(_base(graph, n.inputs[0]) + ".grad", logits.numel, 8.0, logits_shard,
                          transient=True)
        elif n.op in INDEX_SAVING:
            for out in n.outputs:
                if not out.dtype.is_floating_point:
                    extra(f"{n.name}.index{len(seen)}", out.numel, out.dtype.itemsize, shard)
        elif n.op not in NOTHING_SAVED and n.op not in KNOWN_OPS:
            for i in n.inputs:
                keep(i)
    _mark_selective(graph, nodes, tp, seen, activation)
    return tuple(seen.values())


KERNEL_FUSIONS = frozenset({"rms_norm", "layer_norm", "gelu", "swiglu", "rope",
                            "linear_cross_entropy"})
"""Fusions run by a kernel of ``autopar.kernels``, which keeps for the backward what its
``register_autograd`` saves; the Megatron patterns keep what their eager ops keep."""


def _keep_fused(graph: GraphIR, tp: _TP, pattern: str, chain: list[NodeInfo],
                keep: Callable[[str], None], extra: Callable[..., None],
                seen: dict[str, SavedTensor]) -> None:
    """What a fused kernel's autograd saves (``setup_context`` in ``kernels/*.py``): the norms
    and GELU their input x (the weight is a parameter; mean and rstd are recomputed from x);
    SwiGLU gate and up (silu(gate) is recomputed); RoPE cos and sin (buffers): no activation.
    The fused loss saves the two gradients it computed in the forward, of the hidden state
    (tokens x hidden, hidden's dtype) and of the head's weight (vocab x hidden, cast to
    hidden's dtype: one weight-sized buffer per micro-batch, ``per_token`` false), and holds
    a chunk of logits while it runs (c = tokens / ceil(vocab / hidden) rows, as
    ``kernels.linear_cross_entropy.chunk_tokens`` without its rounding up to a power of two)."""
    first, last = chain[0], chain[-1]
    if pattern in ("rms_norm", "layer_norm", "gelu"):
        keep(first.inputs[0])
    elif pattern == "swiglu":
        keep(first.inputs[0])
        for i in last.inputs:
            if i != first.name:
                keep(i)
    elif pattern == "linear_cross_entropy":
        hidden = graph.node(_base(graph, first.inputs[0]))
        weights = [graph.params[p] for p in first.params
                   if p in graph.params and len(graph.params[p].shape) == 2]
        if hidden.out is None or not weights:
            return
        vocab, width = weights[0].shape
        extra(first.name + ".grad_hidden", hidden.out.numel, None, _shard(tp, hidden))
        key = first.name + ".grad_weight"
        seen[key] = SavedTensor(key, float(vocab * width), _op_shard(tp, first), per_token=False)
        tokens = hidden.out.numel / width
        extra(first.name + ".chunk_logits", tokens / math.ceil(vocab / width) * vocab, None,
              _op_shard(tp, first), transient=True)


def _mark_selective(graph: GraphIR, nodes: list[NodeInfo], tp: _TP, seen: dict[str, SavedTensor],
                    activation: Callable[..., SavedTensor | None]) -> None:
    """Mark (or add) what the selective policy keeps: the block input, which checkpointing
    saves, and what the policy caches -- every linear layer's output and fused attention's
    output and log-sum-exp. A row-parallel linear's output is cached before its reduction, so
    it is a full-size partial sum on every tp rank, divided by neither tp nor SP."""
    def mark(key: str, shard: Shard | None = None) -> None:
        if key in seen:
            seen[key] = replace(seen[key], selective=True)
        elif (t := activation(key.partition(".")[0], shard)) is not None:
            seen[key] = replace(t, name=key, without_checkpoint=False, selective=True)

    names = {n.name for n in nodes}
    external = [i for n in nodes for i in n.inputs if i not in names]
    if external:
        mark(_base(graph, external[0]), Shard.SEQ)
    for n in nodes:
        if n.op == "sdpa":
            mark(n.name)
            if n.name + ".lse" in seen:
                mark(n.name + ".lse")
        elif is_linear(n, graph):
            if n.name in tp.row:
                mark(n.name + ".partial", Shard.REPLICATED)
            else:
                mark(n.name)


def op_costs(graph: GraphIR, nodes: list[NodeInfo], tp: _TP, act_bytes: float,
             fusions: tuple[str, ...] = ()) -> tuple[OpCost, ...]:
    """Per-op costs; each match of a named fusion pattern becomes one op with the fused bytes."""
    per_seq = 1.0 / graph.batch
    chains = {chain[0].name: (name, chain) for name, chain in find_fusions(graph, nodes, fusions)}
    inside = {n.name for _, chain in chains.values() for n in chain[1:]}
    costs = []
    for n in nodes:
        if n.name in inside:
            continue
        itemsize = n.out.dtype.itemsize if n.out is not None and n.out.dtype.is_floating_point \
            else act_bytes
        scale = act_bytes / itemsize
        if n.name in chains and chains[n.name][0] == "linear_cross_entropy":
            costs.extend(_fused_loss_costs(graph, chains[n.name][1], tp, act_bytes))
            continue
        if n.name in chains:
            pattern, chain = chains[n.name]
            costs.append(OpCost(
                name=f"{pattern}:{n.name}", op=pattern, kind=OpKind.MEMORY,
                flop=sum(c.fwd_flop for c in chain) * per_seq,
                bytes=fused_bytes(graph, chain) * per_seq * scale, shard=_op_shard(tp, n),
                kept_by_selective=any(kept_by_selective(c, graph) for c in chain),
            ))
            continue
        kv = 0.0
        if n.op == "sdpa" and len(n.inputs) >= 3:
            kv = sum(graph.node(i).out.numel for i in n.inputs[1:3]
                     if graph.has_node(i) and graph.node(i).out is not None)
        costs.append(OpCost(
            name=n.name, op=n.op, kind=_kind(n), flop=n.fwd_flop * per_seq,
            bytes=n.fwd_bytes * per_seq * scale, shard=_op_shard(tp, n),
            kept_by_selective=kept_by_selective(n, graph),
            expert=n.name in tp.expert, kv_elements=kv * per_seq,
        ))
    return tuple(costs)


def _fused_loss_costs(graph: GraphIR, chain: list[NodeInfo], tp: _TP, act_bytes: float
                      ) -> tuple[OpCost, OpCost]:
    """The fused head and loss as two ops: the head's GEMMs, as many FLOPs as eager (the logits'
    GEMM in the forward, and the two gradient GEMMs, which the kernel runs in the forward too,
    priced as the linear layer's backward), and the row kernel, which reads each logit twice and
    writes its gradient once (3 x tokens x vocab elements, none of the eager loss's fp32
    copies); its backward only scales the saved gradients (read and write hidden- and
    weight-sized tensors; the weight's is counted per sequence, exact at micro-batch 1 and
    over by the micro-batch above it, as ``OpCost`` has no per-micro-batch bytes)."""
    head, loss = chain
    per_seq = 1.0 / graph.batch
    logits = head.out
    scale = act_bytes / logits.dtype.itemsize
    hidden = graph.node(_base(graph, head.inputs[0])).out
    weight = sum(graph.params[p].numel for p in head.params if p in graph.params)
    gemm = OpCost(name=head.name, op=head.op, kind=OpKind.MATMUL, flop=head.fwd_flop * per_seq,
                  bytes=head.fwd_bytes * per_seq * scale, shard=_op_shard(tp, head),
                  kept_by_selective=True)
    rows = OpCost(name=f"linear_cross_entropy:{loss.name}", op="linear_cross_entropy",
                  kind=OpKind.MEMORY, flop=loss.fwd_flop * per_seq,
                  bytes=3 * logits.nbytes * per_seq * scale, shard=_op_shard(tp, head),
                  backward_bytes=2 * act_bytes * (hidden.numel * per_seq + weight * per_seq))
    return gemm, rows


def _tp_collectives(graph: GraphIR, nodes: list[NodeInfo], tp: _TP) -> tuple[TPCollective, ...]:
    per_seq = 1.0 / graph.batch
    out: list[TPCollective] = []
    seen_inputs: set[str] = set()
    for n in nodes:
        if n.name in tp.row and n.out is not None:
            out.append(TPCollective(n.name, n.out.numel * per_seq, Phase.FORWARD))
        if n.name in tp.column:
            for i in n.inputs:
                base = _base(graph, i)
                if base not in seen_inputs and graph.has_node(base) and graph.node(base).out:
                    seen_inputs.add(base)
                    out.append(TPCollective(n.name + ".dgrad",
                                            graph.node(base).out.numel * per_seq,
                                            Phase.BACKWARD_ACT))
    return tuple(out)


def _params(graph: GraphIR, nodes: Iterable[NodeInfo], tp: _TP) -> tuple[set[str], set[str], set[str]]:
    """(all, tp-sharded, expert) parameter names read by ``nodes``."""
    every, sharded, expert = set(), set(), set()
    for n in nodes:
        for p in n.params:
            if p not in graph.params:
                continue
            every.add(p)
            if n.name in tp.expert:
                expert.add(p)
            elif n.name in tp.column or (n.name in tp.row and len(graph.params[p].shape) >= 2):
                sharded.add(p)
    return every, sharded, expert


def _numel(graph: GraphIR, names: Iterable[str]) -> int:
    return sum(graph.params[p].numel for p in names)


def _elements(graph: GraphIR, name: str | None) -> float:
    if name is None or not graph.has_node(name) or graph.node(name).out is None:
        return 0.0
    return graph.node(name).out.numel / graph.batch


def build_layer(graph: GraphIR, name: str, nodes: list[NodeInfo], act_bytes: float,
                exclude_params: frozenset[str] = frozenset(),
                fusions: tuple[str, ...] = ()) -> LayerCost:
    # the strategy registry says which ops have no rule (it imports this module)
    from autopar.search.strategies import ops_without_rules

    tp = classify_tp(graph, nodes)
    names = {n.name for n in nodes}
    external = [i for n in nodes for i in n.inputs if i not in names]
    every, sharded, expert = _params(graph, nodes, tp)
    every -= exclude_params
    sharded -= exclude_params
    a2a = 0.0
    if tp.expert:
        first = next(n for n in nodes if n.name in tp.expert)
        for i in first.inputs:
            a2a = max(a2a, _elements(graph, i))
    return LayerCost(
        name=name,
        ops=op_costs(graph, nodes, tp, act_bytes, fusions),
        saved=saved_tensors(graph, nodes, tp, fusions),
        input_elements=_elements(graph, external[0] if external else None),
        output_elements=_elements(graph, nodes[-1].name if nodes else None),
        params=_numel(graph, every),
        params_tp=_numel(graph, sharded - expert),
        params_expert=_numel(graph, expert),
        tp_collectives=_tp_collectives(graph, nodes, tp),
        ep_alltoall_elements=a2a,
        no_rule_ops=ops_without_rules(graph, nodes),
    )


def layer_nodes(graph: GraphIR) -> tuple[list[NodeInfo], list[NodeInfo], list[NodeInfo]]:
    """(before the first block, block instance 0, after the blocks) of a graph with blocks."""
    first = next(i for i, n in enumerate(graph.nodes) if n.block is not None)
    pre = [n for n in graph.nodes[:first] if n.block is None]
    post = [n for n in graph.nodes[first:] if n.block is None]
    return pre, graph.block_nodes(0), post


def build_workload(graph: GraphIR, act_bytes: float = 2.0, name: str = "",
                   fusions: tuple[str, ...] = ()) -> Workload:
    """The cost model's tables for ``graph`` with ``act_bytes`` per activation element, the
    named fusion patterns priced as fused kernels."""
    if graph.blocks is None or graph.num_blocks == 0:
        raise ValueError("the graph has no repeated blocks")
    pre_nodes, _, post_nodes = layer_nodes(graph)
    pre_params = {p for n in pre_nodes for p in n.params}
    tied = pre_params & {p for n in post_nodes for p in n.params}
    pre = build_layer(graph, "pre", pre_nodes, act_bytes, fusions=fusions)
    post = build_layer(graph, "post", post_nodes, act_bytes, exclude_params=frozenset(tied),
                       fusions=fusions)
    block = build_layer(graph, "block", graph.block_nodes(0), act_bytes, fusions=fusions)
    notes = []
    if not graph.blocks.uniform:
        notes.append("block instances differ; the cost model prices instance 0 for all")
    return Workload(
        name=name or graph.model_name, pre=pre, block=block, num_blocks=graph.num_blocks,
        post=post, seq_len=graph.seq_len, tied_params=_numel(graph, tied), notes=tuple(notes),
    )
