"""Finding fusion patterns in a layer: chains of memory-bound ops that one kernel runs in a single
pass.

A pattern (``registry.FusionPattern``, declared by the op family it belongs to; all of them in
``PATTERNS``) is a chain of canonical op names in which each op reads the previous one's output
(the other inputs may come from anywhere: a mask, the residual stream). A fused chain reads its
outside inputs and writes its last output once: the intermediate tensors are neither written to
nor read back from HBM. ``ParallelConfig.fusions`` names the patterns the program applies; the
workload builder prices each match as one op with the fused bytes (``fused_bytes``).

Two things the traced graphs need: a ``view`` between two ops of a chain moves no data and is
stepped over (the head's logits are reshaped before the cross-entropy), and a reader that yields
no tensor (``size()``) does not count as a reader; and a pattern may take in side ops: an op
whose output only the chain's last op reads (RoPE's ``x * cos`` meets ``rotate_half(x) * sin``
at the add, a diamond no chain spans).

The Megatron-LM patterns (``scale_mask_softmax``, ``bias_dropout_add``) are the fused kernels of
Narayanan et al.'s runs; the others are the kernels of ``autopar.kernels`` (named as them), which
``passes/fuse.py`` swaps into the program.
"""

from __future__ import annotations

from autopar.core.specs import ENGINE_FUSIONS, MOE_FUSIONS, check_fusions
from autopar.analysis.graph import GraphIR, NodeInfo
from autopar.analysis.ops.registry import PATTERNS, VIEW, storage_of


def find_fusions(graph: GraphIR, nodes: list[NodeInfo], names: tuple[str, ...]
                 ) -> list[tuple[str, list[NodeInfo]]]:
    """Non-overlapping matches of the named patterns among ``nodes``, in order; the engine's
    fusions of collectives and GEMMs (``core.specs.ENGINE_FUSIONS``) and the MoE engines'
    (``MOE_FUSIONS``, priced by the workload's and the cost model's MoE terms) match no op
    pattern."""
    check_fusions(names)
    names = tuple(n for n in names if n not in ENGINE_FUSIONS and n not in MOE_FUSIONS)
    consumers: dict[str, list[NodeInfo]] = {}
    for n in nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n)
    taken: set[str] = set()
    found: list[tuple[str, list[NodeInfo]]] = []
    for n in nodes:
        for pname in names:
            chain = _match(n, PATTERNS[pname].ops, consumers, taken)
            if chain:
                chain[-1:-1] = _side_inputs(chain, PATTERNS[pname].side_ops, consumers, taken,
                                            {x.name: x for x in nodes})
                taken.update(c.name for c in chain)
                found.append((pname, chain))
                break
    return found


def _sole_reader(node: NodeInfo, consumers: dict[str, list[NodeInfo]]) -> NodeInfo | None:
    """The one node reading ``node``'s data, through views; None for none or several."""
    while True:
        readers = [r for r in consumers.get(node.name, []) if r.op != VIEW or r.outputs]
        if len(readers) != 1:
            return None
        if readers[0].op != VIEW:
            return readers[0]
        node = readers[0]


def _match(start: NodeInfo, ops: tuple[str, ...], consumers: dict[str, list[NodeInfo]],
           taken: set[str]) -> list[NodeInfo] | None:
    """The chain from ``start`` whose ops are ``ops``, each the sole reader of the previous
    (views stepped over, not part of the chain)."""
    if start.op != ops[0] or start.name in taken:
        return None
    chain = [start]
    for op in ops[1:]:
        reader = _sole_reader(chain[-1], consumers)
        if reader is None or reader.op != op or reader.name in taken:
            return None
        chain.append(reader)
    return chain


def _side_inputs(chain: list[NodeInfo], ops: tuple[str, ...],
                 consumers: dict[str, list[NodeInfo]], taken: set[str],
                 by_name: dict[str, NodeInfo]) -> list[NodeInfo]:
    """Producers of the last op's other inputs whose op is in ``ops`` and that only it reads."""
    inside = {c.name for c in chain}
    out = []
    for name in chain[-1].inputs:
        node = by_name.get(name)
        if (node is not None and node.op in ops and name not in inside and name not in taken
                and _sole_reader(node, consumers) is chain[-1]):
            out.append(node)
    return out


def fused_bytes(graph: GraphIR, chain: list[NodeInfo]) -> float:
    """Bytes of the fused kernel: every op's bytes less each intermediate's write and read, and
    less the second reads of an outside tensor that several ops read through views (RoPE's ops
    read both halves of x and x itself; the kernel reads x once)."""
    inside = {n.name for n in chain}
    total = sum(n.fwd_bytes for n in chain)
    for n in chain[:-1]:
        if n.out is not None:
            total -= 2 * n.out.nbytes
    reads: dict[str, float] = {}
    for n in chain:
        for name in n.inputs:
            if name in inside or not graph.has_node(name) or graph.node(name).out is None:
                continue
            base = storage_of(graph, name)
            reads[base] = reads.get(base, 0.0) + graph.node(name).out.nbytes
    for base, read in reads.items():
        whole = graph.node(base).out if graph.has_node(base) else None
        if whole is not None:
            total -= max(0.0, read - whole.nbytes)
    return max(total, 0.0)
