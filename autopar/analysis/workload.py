"""From a traced ``GraphIR`` to the cost model's base ``Workload``.

Two analyses over each layer's nodes, each asking the op registry (``autopar.analysis.ops``) what it
knows of an op:

* **Saved activations** (``saved_tensors``): which tensors each op keeps for its backward pass
  (the family's ``saves``: a GEMM keeps its activation inputs, softmax its output, dropout a
  one-byte mask, GELU its input...), deduplicated through views to the tensor that owns the
  storage. For a GPT block with eager attention this gives Korthikanti et al.'s 34*s*h +
  5*a*s^2 bytes exactly. Each is marked with the policies that keep it: autograd without
  checkpointing; the ``matmuls`` policy of ``passes/checkpointing.py``, which keeps the block
  input and the outputs of the linear layers and of fused attention and recomputes every other
  op; and what the ``selective`` policy rebuilds instead of keeping: what an unfused attention
  core makes (``ops.attention_core``), the 5*a*s^2 term; and what the ``moe`` policy rebuilds:
  what a mixture-of-experts layer makes inside (``GraphIR.in_moe_layer``). A fused kernel (``FusionPattern.kernel_saves``) keeps what its autograd saves instead of
  what its eager ops would; the loss also records what it holds only while it runs
  (``transient``).
* **Costs per op** (``op_costs``): FLOPs and bytes per sequence, and which roofline applies.

The base workload prices the model unsplit over tensor parallelism (tp = 1): nothing in it
divides by tp and no tp collective runs. How each op runs over tp ranks is the per-op strategy
solve's decision (``autopar.search.tp_solve``), which re-prices this workload for a candidate's
tp; there is no other classification.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from autopar.costmodel.workload import (
    LayerCost,
    OpCost,
    OpKind,
    SavedTensor,
    Shard,
    Workload,
)
from autopar.analysis.graph import GraphIR, NodeInfo
from autopar.core.fp8 import fp8_gemm
from autopar.core.specs import MOE_PERMUTE
from autopar.models.routing import DROPLESS_MARK
from autopar.analysis.ops import (
    PATTERNS,
    attention_core,
    find_fusions,
    fused_bytes,
    is_expert_gemm,
    kept_by_matmuls,
    kind_of,
    ops_without_rules,
    WIDEN,
    save,
    storage_of,
)
from autopar.analysis.ops.attention import is_causal


@dataclass
class _Saver:
    """The ``autopar.analysis.ops.Saver`` of one layer: its saved tensors per sequence, each storage
    counted once, in the order first kept."""

    graph: GraphIR
    inside: frozenset[str]
    seen: dict[str, SavedTensor] = field(default_factory=dict)
    current: str = ""
    """The node whose saves are being recorded (``SavedTensor.savers``)."""

    def activation(self, name: str) -> SavedTensor | None:
        if not self.graph.has_node(name):
            return None
        src = self.graph.node(name)
        if src.out is None or not src.out.dtype.is_floating_point:
            return None
        if src.op == WIDEN and src.inputs:  # a 4-byte copy in bf16, its input in fp32
            return SavedTensor(name, src.out.numel / self.graph.batch, Shard.REPLICATED, 4.0,
                               widened_from=storage_of(self.graph, src.inputs[0], self.inside))
        return SavedTensor(name, src.out.numel / self.graph.batch, Shard.REPLICATED)

    def keep(self, name: str) -> None:
        base = storage_of(self.graph, name, self.inside)
        if base in self.seen:
            t = self.seen[base]
            if self.current not in t.savers:
                self.seen[base] = replace(t, savers=(*t.savers, self.current))
        elif (t := self.activation(base)) is not None:
            self.seen[base] = replace(t, savers=(self.current,))
            if t.widened_from is not None:
                # a cast to fp32 keeps its input too: the view it is in fp32, what a
                # checkpoint of the region keeps
                self.keep(self.graph.node(base).inputs[0])

    def extra(self, key: str, elements: float, size: float | None, *, transient: bool = False,
              per_token: bool = True) -> None:
        per = 1.0 / self.graph.batch if per_token else 1.0
        self.seen[key] = SavedTensor(key, elements * per, Shard.REPLICATED, size,
                                     without_checkpoint=not transient, transient=transient,
                                     per_token=per_token, savers=(self.current,))

    def base(self, name: str) -> str:
        return storage_of(self.graph, name)

    def __len__(self) -> int:
        return len(self.seen)


def saved_tensors(graph: GraphIR, nodes: list[NodeInfo], fusions: tuple[str, ...] = ()
                  ) -> tuple[SavedTensor, ...]:
    """The activations ``nodes`` keep for backward, per sequence, each storage counted once,
    marked with the policies that keep them (without checkpointing; ``matmuls``) and, where an
    unfused attention core makes them, as what ``selective`` rebuilds; a match of a fused
    kernel's pattern keeps what the kernel saves."""
    saver = _Saver(graph, frozenset(n.name for n in nodes))
    fused = {c.name: (pattern, chain) for pattern, chain in find_fusions(graph, nodes, fusions)
             if PATTERNS[pattern].kernel_saves is not None for c in chain}
    for n in nodes:
        saver.current = n.name
        if n.name in fused:
            pattern, chain = fused[n.name]
            kernel_saves = PATTERNS[pattern].kernel_saves
            if n is chain[-1] and kernel_saves is not None:
                kernel_saves(chain, saver)
        else:
            save(n, saver)
    _mark_matmuls(graph, nodes, saver)
    core = attention_core(graph, nodes)
    dropped = permuted_away(graph, nodes) if MOE_PERMUTE in fusions else frozenset()
    moe = frozenset(n.name for n in nodes if graph.in_moe_layer(n))
    # made inside a core (a MoE layer) and read by nothing outside it (the core's output is the
    # projection's input, kept; a MoE layer's input is made outside it)
    return tuple(_inside(_inside(t, core, attention_core=True), moe, moe_layer=True)
                 for t in saver.seen.values() if t.name.partition(".")[0] not in dropped)


def _inside(t: SavedTensor, region: frozenset[str] | set[str], **flag: bool) -> SavedTensor:
    """``t`` with ``flag`` set where ``region`` made it and only its nodes keep it."""
    made = t.name.partition(".")[0] in region and all(s in region for s in t.savers)
    return replace(t, **flag) if made else t


def permuted_away(graph: GraphIR, nodes: list[NodeInfo]) -> frozenset[str]:
    """The nodes of the mixture-of-experts layers among ``nodes`` whose outputs the fused
    permutation keeps no copy of (``moe_permute``, ``moe_permutes``): every op of a layer but
    its router's and expert GEMMs and the tensors the expert GEMMs read (the permuted rows, the
    activation's output): what Megatron-Core's fused permute, grouped GEMMs and fused SwiGLU
    save for their backward."""
    region = [n for n in nodes if graph.in_moe_layer(n)]
    kept = {n.name for n in region if kind_of(n) is OpKind.MATMUL}
    kept |= {storage_of(graph, i) for n in region if is_expert_gemm(n, graph)
             for i in n.inputs if graph.has_node(i)}
    return frozenset(n.name for n in region if n.name not in kept)


def _mark_matmuls(graph: GraphIR, nodes: list[NodeInfo], saver: _Saver) -> None:
    """Mark (or add) what the ``matmuls`` policy keeps: the block input, which checkpointing
    saves, and what the policy caches -- every linear layer's output and fused attention's
    output and log-sum-exp (``autopar.analysis.ops.kept_by_matmuls``). Where the solve splits a linear
    by rows, it caches the partial sums before their reduction instead
    (``search.block_tables.solved_layer``)."""
    seen = saver.seen

    def mark(key: str) -> None:
        if key in seen:
            seen[key] = replace(seen[key], matmuls=True)
        elif (t := saver.activation(key.partition(".")[0])) is not None:
            seen[key] = replace(t, name=key, without_checkpoint=False, matmuls=True)

    names = {n.name for n in nodes}
    external = [i for n in nodes for i in n.inputs if i not in names]
    if external:
        mark(storage_of(graph, external[0]))
    for n in nodes:
        if kept_by_matmuls(n, graph):
            mark(n.name)
            if n.name + ".lse" in seen:
                mark(n.name + ".lse")


def op_costs(graph: GraphIR, nodes: list[NodeInfo], act_bytes: float,
             fusions: tuple[str, ...] = (), *, block: bool = False) -> tuple[OpCost, ...]:
    """Per-op costs; each match of a named fusion pattern becomes one op with the fused bytes.
    ``block``: the nodes are a repeated block's, whose linears an fp8 plan may run in FP8
    (``OpCost.fp8``)."""
    per_seq = 1.0 / graph.batch
    chains = {chain[0].name: (name, chain) for name, chain in find_fusions(graph, nodes, fusions)}
    inside = {n.name for _, chain in chains.values() for n in chain[1:]}
    permutes = moe_permutes(graph, nodes) if MOE_PERMUTE in fusions else {}
    inside |= {n.name for _, rest in permutes.values() for n in rest}
    core = attention_core(graph, nodes)
    costs = []
    for n in nodes:
        if n.name in inside:
            continue
        if n.name in permutes:
            fused_bytes_, _ = permutes[n.name]
            costs.append(OpCost(name=f"{MOE_PERMUTE}:{n.name}", op=MOE_PERMUTE,
                                kind=OpKind.MEMORY, flop=0.0,
                                bytes=fused_bytes_ * per_seq * act_bytes, shard=Shard.REPLICATED,
                                moe_layer=True))
            continue
        itemsize = n.out.dtype.itemsize if n.out is not None and n.out.dtype.is_floating_point \
            else act_bytes
        scale = act_bytes / itemsize
        if n.name in chains and chains[n.name][0] == "linear_cross_entropy":
            costs.extend(_fused_loss_costs(graph, chains[n.name][1], act_bytes))
            continue
        if n.name in chains:
            pattern, chain = chains[n.name]
            costs.append(OpCost(
                name=f"{pattern}:{n.name}", op=pattern, kind=OpKind.MEMORY,
                flop=sum(c.fwd_flop for c in chain) * per_seq,
                bytes=fused_bytes(graph, chain) * per_seq * scale, shard=Shard.REPLICATED,
                kept_by_matmuls=any(kept_by_matmuls(c, graph) for c in chain),
                attention_core=any(c.name in core for c in chain),
                moe_layer=any(graph.in_moe_layer(c) for c in chain),
            ))
            continue
        kv = 0.0
        if kind_of(n) is OpKind.ATTENTION and len(n.inputs) >= 3:
            kv = sum(graph.node(i).out.numel for i in n.inputs[1:3]
                     if graph.has_node(i) and graph.node(i).out is not None)
        costs.append(OpCost(
            name=n.name, op=n.op, kind=kind_of(n), flop=n.fwd_flop * per_seq,
            bytes=n.fwd_bytes * per_seq * scale, shard=Shard.REPLICATED,
            kept_by_matmuls=kept_by_matmuls(n, graph), attention_core=n.name in core,
            moe_layer=graph.in_moe_layer(n), expert=is_expert_gemm(n, graph), kv_elements=kv * per_seq,
            causal=kind_of(n) is OpKind.ATTENTION and is_causal(n),
            weight_shape=linear_weight_shape(graph, n), expert_shape=expert_weight_shape(graph, n),
            fp8=block and fp8_gemm(linear_module(graph, n), linear_weight_shape(graph, n)),
        ))
    return tuple(costs)


def moe_permutes(graph: GraphIR, nodes: list[NodeInfo]
                 ) -> dict[str, tuple[float, list[NodeInfo]]]:
    """Each mixture-of-experts layer's memory-bound ops among ``nodes`` as the engines' fused
    kernels run them (Megatron-Core's ``--moe-permute-fusion`` with its fused SwiGLU,
    torchtitan's permute indices): first node -> (elements moved, the other nodes it
    absorbs). The fused permutation reads the layer's T x h tokens and writes the R x h routed
    rows (R = top-k x T dropless, the E x C slots with a capacity), the activation reads the
    rows' gate and up projections and writes their product (R x f each), and the
    un-permutation reads the expert outputs back and writes T x h; the router's scores (T x E)
    are read and written once. Where the traced layer is not the pattern (no stacked expert
    GEMM), nothing is fused."""
    out: dict[str, tuple[float, list[NodeInfo]]] = {}
    by_module: dict[str, list[NodeInfo]] = {}
    for n in nodes:
        if graph.in_moe_layer(n):
            root = next(m for m in graph.moe_modules
                        if n.module_path == m or n.module_path.startswith(m + "."))
            by_module.setdefault(root, []).append(n)
    for region in by_module.values():
        gemms = [n for n in region if is_expert_gemm(n, graph)]
        shapes = [s for s in (expert_weight_shape(graph, g) for g in gemms) if s is not None]
        memory = [n for n in region if kind_of(n) is OpKind.MEMORY]
        names = {n.name for n in region}
        outside = next((i for n in region for i in n.inputs
                        if i not in names and graph.has_node(i)), None)
        if not shapes or not memory or outside is None:
            continue
        tokens = _elements(graph, outside) * graph.batch  # T x h of the traced batch
        rows = max(_elements(graph, storage_of(graph, i)) * graph.batch  # the dispatch buffer
                   for i in gemms[0].inputs if graph.has_node(i))
        e, k, width = shapes[0]
        routed = rows / k  # R
        activation = (3.0 if len(gemms) >= 3 else 2.0) * routed * width
        router = 2.0 * tokens / k * e
        out[memory[0].name] = (2.0 * (tokens + rows) + activation + router, memory[1:])
    return out


def expert_weight_shape(graph: GraphIR, node: NodeInfo) -> tuple[int, int, int] | None:
    """(experts, reduction, width) of an expert GEMM's stacked weight: its one 3-d parameter,
    the reduction the dimension it shares with the rows' width (the traced input's last
    dimension). None for another op, or experts kept as a list of modules."""
    if not is_expert_gemm(node, graph):
        return None
    shapes = [graph.params[p].shape for p in node.params
              if p in graph.params and len(graph.params[p].shape) == 3]
    if len(shapes) != 1:
        return None
    e, a, b = (int(x) for x in shapes[0])
    rows = next((graph.node(i).out for i in node.inputs if graph.has_node(i)
                 and graph.node(i).out is not None), None)
    width = int(rows.shape[-1]) if rows is not None and rows.shape else a
    return (e, a, b) if width == a or width != b else (e, b, a)


def linear_weight_shape(graph: GraphIR, node: NodeInfo) -> tuple[int, int] | None:
    """(output, input) features of a linear layer's weight: its one 2-d parameter. None for
    another op, or a linear whose weight is not a traced parameter."""
    if node.op != "linear":
        return None
    shapes = [graph.params[p].shape for p in node.params
              if p in graph.params and len(graph.params[p].shape) == 2]
    return (int(shapes[0][0]), int(shapes[0][1])) if len(shapes) == 1 else None


def linear_module(graph: GraphIR, node: NodeInfo) -> str:
    """The module path of a linear layer, read off its weight's name (``q_proj.weight`` ->
    ``q_proj``); ``""`` for another op."""
    weights = [p for p in node.params if p in graph.params and len(graph.params[p].shape) == 2]
    return weights[0].rsplit(".", 1)[0] if node.op == "linear" and len(weights) == 1 else ""


def _fused_loss_costs(graph: GraphIR, chain: list[NodeInfo], act_bytes: float
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
    hidden = graph.node(storage_of(graph, head.inputs[0])).out
    weight = sum(graph.params[p].numel for p in head.params if p in graph.params)
    gemm = OpCost(name=head.name, op=head.op, kind=OpKind.MATMUL, flop=head.fwd_flop * per_seq,
                  bytes=head.fwd_bytes * per_seq * scale, shard=Shard.REPLICATED,
                  kept_by_matmuls=True, weight_shape=linear_weight_shape(graph, head))
    rows = OpCost(name=f"linear_cross_entropy:{loss.name}", op="linear_cross_entropy",
                  kind=OpKind.MEMORY, flop=loss.fwd_flop * per_seq,
                  bytes=3 * logits.nbytes * per_seq * scale, shard=Shard.REPLICATED,
                  backward_bytes=2 * act_bytes * (hidden.numel * per_seq + weight * per_seq))
    return gemm, rows


def _params(graph: GraphIR, nodes: Iterable[NodeInfo]) -> tuple[set[str], set[str]]:
    """(all, expert) parameter names read by ``nodes``."""
    every, expert = set(), set()
    for n in nodes:
        for p in n.params:
            if p not in graph.params:
                continue
            every.add(p)
            if is_expert_gemm(n, graph):
                expert.add(p)
    return every, expert


def _numel(graph: GraphIR, names: Iterable[str]) -> int:
    return sum(graph.params[p].numel for p in names)


def _elements(graph: GraphIR, name: str | None) -> float:
    if name is None or not graph.has_node(name) or graph.node(name).out is None:
        return 0.0
    return graph.node(name).out.numel / graph.batch


def build_layer(graph: GraphIR, name: str, nodes: list[NodeInfo], act_bytes: float,
                exclude_params: frozenset[str] = frozenset(),
                fusions: tuple[str, ...] = (), *, block: bool = False) -> LayerCost:
    """One layer of the base workload (tp = 1): its ops, saved tensors and parameters."""
    names = {n.name for n in nodes}
    external = [i for n in nodes for i in n.inputs if i not in names]
    every, expert = _params(graph, nodes)
    every -= exclude_params
    a2a = 0.0
    first = next((n for n in nodes if is_expert_gemm(n, graph)), None)
    if first is not None:  # listed experts each read a slice of the one dispatch buffer
        for i in first.inputs:
            a2a = max(a2a, _elements(graph, storage_of(graph, i) if graph.expert_params
                                     else i))
    return LayerCost(
        name=name,
        ops=op_costs(graph, nodes, act_bytes, fusions, block=block),
        saved=saved_tensors(graph, nodes, fusions),
        input_elements=_elements(graph, external[0] if external else None),
        output_elements=_elements(graph, nodes[-1].name if nodes else None),
        params=_numel(graph, every),
        params_tp=0,
        params_expert=_numel(graph, expert),
        ep_alltoall_elements=a2a,
        ep_dropless=any(_dropless(n, graph) for n in nodes),
        route_groups=next((graph.moe_groups[m] for m in graph.moe_groups
                           for n in nodes if n.module_path.startswith(m + ".")), None),
        no_rule_ops=ops_without_rules(nodes),
    )


def _dropless(node: NodeInfo, graph: GraphIR) -> bool:
    """Whether ``node`` marks a dropless MoE layer: the zoo's traced ``dropless_rows`` call, or
    an expert GEMM run as one grouped GEMM over every (token, choice) row (transformers' stacked
    experts, traced as ``grouped_mm``: no capacity, nothing dropped)."""
    return node.target.endswith(DROPLESS_MARK) or (
        node.op == "grouped_mm" and is_expert_gemm(node, graph))


def loss_input(graph: GraphIR, post_nodes: list[NodeInfo], fusions: tuple[str, ...] = ()
               ) -> tuple[SavedTensor, ...]:
    """What the loss reads, as a ``SavedTensor`` marked ``stage_output`` (``<node>.output``):
    the last stage's output under pipelining (``passes/stage.py``: ``finish`` returns the
    logits, or the hidden state the fused loss's head reads, ``passes/fuse.py``). The loss is
    the layer's last node; none where it reads no floating-point activation."""
    if not post_nodes:
        return ()
    loss = post_nodes[-1]
    for pattern, chain in find_fusions(graph, post_nodes, fusions):
        if pattern == "linear_cross_entropy" and loss in chain:
            loss = chain[0]  # the fused head and loss read the head's input
    if not loss.inputs:
        return ()
    name = storage_of(graph, loss.inputs[0])
    if not graph.has_node(name) or graph.node(name).out is None or \
            not graph.node(name).out.dtype.is_floating_point:
        return ()
    return (SavedTensor(f"{name}.output", graph.node(name).out.numel / graph.batch,
                        Shard.REPLICATED, without_checkpoint=False, stage_output=True),)


def without_attention_core(work: Workload) -> Workload:
    """``work`` with no op or tensor marked as an attention core's: what ``selective`` runs
    for a model whose attention takes no core runner (``ModelFacts.attention_core_hook``):
    the cores whole, as ``none``."""
    def plain(layer: LayerCost) -> LayerCost:
        return replace(layer, ops=tuple(replace(o, attention_core=False) for o in layer.ops),
                       saved=tuple(replace(t, attention_core=False) for t in layer.saved))
    return replace(work, pre=plain(work.pre), block=plain(work.block), post=plain(work.post))


def layer_nodes(graph: GraphIR) -> tuple[list[NodeInfo], list[NodeInfo], list[NodeInfo]]:
    """(before the first block, block instance 0, after the blocks) of a graph with blocks."""
    first = next(i for i, n in enumerate(graph.nodes) if n.block is not None)
    pre = [n for n in graph.nodes[:first] if n.block is None]
    post = [n for n in graph.nodes[first:] if n.block is None]
    return pre, graph.block_nodes(0), post


def mean_block_flops(graph: GraphIR, block: LayerCost) -> LayerCost:
    """``block`` (instance 0's costs) with each op's FLOPs the mean over the instances, where
    instances run the same ops but not the same FLOPs: GPT-OSS's sliding-window layers between
    full ones (``models/moe/attention.py``). The blocks then cost together what the model's
    layers do; a pipeline stage holding more of one kind than the mean is off by half the two
    kinds' difference per extra layer of that kind (one layer's attention core in a 9-layer
    stage of GPT-OSS-120B at pp 4)."""
    first = graph.block_nodes(0)
    totals = [n.fwd_flop for n in first]
    for i in range(1, graph.num_blocks):
        for j, n in enumerate(graph.block_nodes(i)):
            totals[j] += n.fwd_flop
    ratio = {n.name: t / graph.num_blocks / n.fwd_flop for n, t in zip(first, totals)
             if n.fwd_flop and t != n.fwd_flop * graph.num_blocks}
    if not ratio:
        return block
    return replace(block, ops=tuple(replace(o, flop=o.flop * ratio.get(o.name, 1.0))
                                    for o in block.ops))


def build_workload(graph: GraphIR, act_bytes: float = 2.0, name: str = "",
                   fusions: tuple[str, ...] = ()) -> Workload:
    """The base workload of ``graph`` (tp = 1, see the module docstring) with ``act_bytes`` per
    activation element, the named fusion patterns priced as fused kernels."""
    if graph.blocks is None or graph.num_blocks == 0:
        raise ValueError("the graph has no repeated blocks")
    pre_nodes, _, post_nodes = layer_nodes(graph)
    pre_params = {p for n in pre_nodes for p in n.params}
    tied = pre_params & {p for n in post_nodes for p in n.params}
    pre = build_layer(graph, "pre", pre_nodes, act_bytes, fusions=fusions)
    post = build_layer(graph, "post", post_nodes, act_bytes, exclude_params=frozenset(tied),
                       fusions=fusions)
    post = replace(post, saved=post.saved + loss_input(graph, post_nodes, fusions))
    block = build_layer(graph, "block", graph.block_nodes(0), act_bytes, fusions=fusions,
                        block=True)
    notes = []
    if not graph.blocks.uniform:
        notes.append("block instances differ; the cost model prices instance 0 for all")
    elif (mean := mean_block_flops(graph, block)) is not block:
        block = mean
        notes.append("block instances differ in FLOPs (sliding-window and full attention "
                     "layers); each op is priced at its mean over the instances")
    return Workload(
        name=name or graph.model_name, pre=pre, block=block, num_blocks=graph.num_blocks,
        post=post, seq_len=graph.seq_len, tied_params=_numel(graph, tied), notes=tuple(notes),
    )
