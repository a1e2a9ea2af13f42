"""Which weight GEMMs a plan with split weights must split (``split_weights``).

``plan_for`` (what ``verify`` and ``export`` run on a tp degree the user gave) leaves the solve
only split strategies for the linear layers it can split, so that the plan runs the sharded
program rather than a replicated one the solve may find as cheap for a small model. The engine
splits a module's linear layers together -- column splits closed by row splits inside one module
(attention, MLP), or the head alone by columns -- so a module is forced only when every one of
its linear layers can take its split over tp; elsewhere (a width tp does not divide) the solve
keeps its freedom, as a lone split could not run. Which of the two splits a layer would take
follows the module's dataflow: a layer reading another of the module's layers (through the ops
between them) closes the region, by rows; the others open it, by columns. The solve then picks
among the split strategies the rules offer; there is no other classification.

A router (a linear whose output feeds a top-k over every expert) is never forced: each rank
needs every expert's score. Nor is a module outside the repeated blocks whose split would need
a row split, which the engine runs inside the blocks only -- and in the layers it splits alike
(``GraphIR.outer_layers``: DeepSeek's dense first layers).
"""

from __future__ import annotations

from autopar.core.layout import Style, splittable
from autopar.analysis.graph import GraphIR, NodeInfo
from autopar.analysis.ops import is_weight_gemm, outer_regions

ROUTER_DEPTH = 3
"""How many ops after a linear a top-k makes it a router (the softmax and a view between)."""


def _consumers(nodes: list[NodeInfo]) -> dict[str, list[NodeInfo]]:
    out: dict[str, list[NodeInfo]] = {}
    for n in nodes:
        for i in n.inputs:
            out.setdefault(i, []).append(n)
    return out


def is_router(node: NodeInfo, consumers: dict[str, list[NodeInfo]]) -> bool:
    """Whether a top-k reads ``node``'s output within ``ROUTER_DEPTH`` ops."""
    frontier = [node.name]
    for _ in range(ROUTER_DEPTH):
        nxt = []
        for f in frontier:
            for c in consumers.get(f, []):
                if c.op == "topk":
                    return True
                nxt.append(c.name)
        frontier = nxt
    return False


def forced_splits(graph: GraphIR, nodes: list[NodeInfo], tp: int) -> frozenset[str]:
    """The linear layers of ``nodes`` that ``split_weights`` forces to split (see the module
    docstring)."""
    consumers = _consumers(nodes)
    linears = [n for n in nodes if is_weight_gemm(n, graph) and n.module_path in graph.layers
               and not is_router(n, consumers)]
    by_module: dict[str, list[NodeInfo]] = {}
    for n in linears:
        by_module.setdefault(n.module_path.rpartition(".")[0], []).append(n)
    upstream = _upstream_linears(nodes, {n.name for n in linears})
    outer = outer_regions(graph, nodes)
    forced: set[str] = set()
    for members in by_module.values():
        names = {n.name for n in members}
        kinds = [Style.ROW if upstream[n.name] & names else Style.COLUMN for n in members]
        # a row split runs inside the repeated blocks and the layers the engine splits alike
        # (ops/gemm.py: DeepSeek's dense first layers): a module elsewhere that needs one is
        # left to the solve, which keeps it whole
        if all(splittable(*graph.layers[n.module_path], kind, tp)
               and (kind is Style.COLUMN or n.block is not None or outer.get(n.name, (False, False))[0])
               for n, kind in zip(members, kinds)):
            forced.update(names)
    return frozenset(forced)


def _upstream_linears(nodes: list[NodeInfo], linears: set[str]) -> dict[str, frozenset[str]]:
    """For every node, the linear layers among ``linears`` its inputs are computed from."""
    upstream: dict[str, frozenset[str]] = {}
    for n in nodes:
        found: set[str] = set()
        for i in n.inputs:
            found |= upstream.get(i, frozenset())
            if i in linears:
                found.add(i)
        upstream[n.name] = frozenset(found)
    return upstream
