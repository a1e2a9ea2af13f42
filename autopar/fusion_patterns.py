"""Named fusion patterns: chains of memory-bound ops that one kernel runs in a single pass.

A pattern is a chain of canonical op names in which each op reads the previous one's output
(the other inputs may come from anywhere: a mask, the residual stream). A fused chain reads its
outside inputs and writes its last output once: the intermediate tensors are neither written to
nor read back from HBM. ``ParallelConfig.fusions`` names the patterns the program applies; the
workload builder prices each match as one op with the fused bytes.

The Megatron-LM patterns (``scale_mask_softmax``, ``bias_dropout_add``) are the fused kernels of
Narayanan et al.'s runs; the kernels of ``autopar.kernels`` add their own.
"""

from __future__ import annotations

from autopar.costmodel.errors import AutoparError
from autopar.graph import GraphIR, NodeInfo

PATTERNS: dict[str, tuple[str, ...]] = {
    "scale_mask_softmax": ("mul", "masked_fill", "softmax"),
    "bias_dropout_add": ("dropout", "add"),
}


def find_fusions(graph: GraphIR, nodes: list[NodeInfo], names: tuple[str, ...]
                 ) -> list[tuple[str, list[NodeInfo]]]:
    """Non-overlapping matches of the named patterns among ``nodes``, in order."""
    unknown = [n for n in names if n not in PATTERNS]
    if unknown:
        raise AutoparError(f"unknown fusion {unknown[0]!r}", where="fusions",
                           fix=f"use names among {', '.join(sorted(PATTERNS))}")
    consumers: dict[str, list[NodeInfo]] = {}
    for n in nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n)
    taken: set[str] = set()
    found: list[tuple[str, list[NodeInfo]]] = []
    for n in nodes:
        for pname in names:
            chain = _match(n, PATTERNS[pname], consumers, taken)
            if chain:
                taken.update(c.name for c in chain)
                found.append((pname, chain))
                break
    return found


def _match(start: NodeInfo, ops: tuple[str, ...], consumers: dict[str, list[NodeInfo]],
           taken: set[str]) -> list[NodeInfo] | None:
    """The chain from ``start`` whose ops are ``ops``, each the sole reader of the previous."""
    if start.op != ops[0] or start.name in taken:
        return None
    chain = [start]
    for op in ops[1:]:
        readers = consumers.get(chain[-1].name, [])
        if len(readers) != 1 or readers[0].op != op or readers[0].name in taken:
            return None
        chain.append(readers[0])
    return chain


def fused_bytes(chain: list[NodeInfo]) -> float:
    """Bytes of the fused kernel: every op's bytes less each intermediate's write and read."""
    total = sum(n.fwd_bytes for n in chain)
    for n in chain[:-1]:
        if n.out is not None:
            total -= 2 * n.out.nbytes
    return max(total, 0.0)
