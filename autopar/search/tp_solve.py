"""Per-op strategies of a candidate: solve the block, then the layers around it.

For a candidate's tensor-parallel degree, sequence parallelism and micro-batch shape, the
repeated block is solved first (``ilp.solve`` over ``block_tables.block_problem``: one strategy
per op, tied across the blocks, the output of one block feeding the input of the next), then the
last layer (final norm, head, loss) receiving the block's output layout, then the first layer
(embedding) handing the block the layout its input wants. The result is the candidate's
``Workload`` with every op, saved tensor, parameter and tp collective priced as the solve
decided, and the (op, strategy) list for the plan.

Solves are memoised per tp split (tp, sequence parallel, expert parallel, tp group placement) and
priced at one micro-batch of one sequence; the search reuses them for every micro-batch size and
cp degree (see ``StrategySolver.solve``). Within those, a layer's ILP runs once for the tables it
is built from (a layer without expert ops is priced alike under any expert load), and solves
choosing the same strategies share one solved layer and one workload, so the cost model's
per-layer memos serve them all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from autopar.core.layout import Layout, Style
from autopar.costmodel.workload import Workload
from autopar.analysis.graph import GraphIR, NodeInfo
from autopar.analysis.workload import layer_nodes
from autopar.search.block_tables import (
    Pricing,
    SolvedLayer,
    block_problem,
    solved_layer,
    strategy_graph,
)
from autopar.search.ilp import solve

SOLVE_TIME_LIMIT_S = 5.0
"""Per layer; a hit limit is reported with its gap."""
_TIED_EMBEDDING = {Style.COLUMN: Style.VOCAB, Style.REPLICATED: Style.REPLICATED}
"""The embedding strategy holding a table the same way as the tied head's GEMM strategy."""


@dataclass(frozen=True)
class StrategyResult:
    workload: Workload
    block_strategies: tuple[tuple[str, str], ...]
    outer_strategies: tuple[tuple[str, str], ...]
    """(op, strategy) of the ops outside the blocks: embedding first, then head and loss."""
    gap: float
    """Largest relative optimality gap of the three solves (0 when all proved optimal)."""


@dataclass
class StrategySolver:
    """Memoised strategy solves for one traced model."""

    graph: GraphIR
    base: Workload
    """The base workload (tp = 1, ``autopar.analysis.workload.build_workload``): its costs per op and
    saved tensors are re-priced under each solve's strategies."""
    act_bytes: float
    split_weights: bool = False
    """Offer the linear layers only their split strategies (``search.forced``)."""
    cache: dict[tuple, StrategyResult] = field(default_factory=dict)
    _whole: Workload | None = None
    _solves: dict[tuple, tuple[SolvedLayer, float, str | None]] = field(default_factory=dict)
    """Each layer's solve by what its tables are built from: a layer without expert ops is
    priced alike under any expert load, so solved once for both."""
    _layers: dict[tuple, SolvedLayer] = field(default_factory=dict)
    """Each solved layer by its strategy graph and the strategies chosen: solves that choose
    the same give the same ``LayerCost`` object, so the cost model's per-layer memos
    (``costmodel/memo.py``) serve every split it was solved for."""
    _results: dict[tuple, StrategyResult] = field(default_factory=dict)
    """Each result by its layers: solves that choose the same give the same workload."""

    def whole(self) -> Workload:
        """The base workload (tp = 1: every op whole on its GPU, no solve to run) with its
        block's backward walked op by op (``LayerCost.held`` and ``backward``, as a solve
        records them at tp > 1): what the memory model reads for the working set of a
        block's backward (``costmodel.memory.backward_peak``), which it otherwise prices as
        the whole weight gradient and no gradient of an activation."""
        if self._whole is None:
            _, block_nodes, _ = layer_nodes(self.graph)
            sg = strategy_graph(self.graph, block_nodes, False, tp=1)
            choice = tuple(next(i for i, s in enumerate(op.strategies)
                                if not s.divides and s.output is Layout.R
                                and all(x is Layout.R for x in s.inputs))
                           for op in sg.ops)
            block = solved_layer(self.graph, sg, self.base.block, choice, self.act_bytes, 1,
                                 walk_backward=True).layer
            self._whole = replace(self.base, block=block)
        return self._whole

    def _solve(self, nodes: list[NodeInfo], layer, pricing: Pricing, sp: bool, *,
               repeat: int = 1, boundary: bool = False, input_layout: Layout | None = None,
               output_layout: Layout | None = None, output_tensor: str | None = None,
               fixed: dict[str, str] | None = None, walk_backward: bool = False
               ) -> tuple[SolvedLayer, float, str | None]:
        """The solved layer, its gap, and the tensor it reads from the layer before."""
        if pricing.expert_scale != 1.0 and not any(op.expert for op in layer.ops):
            pricing = replace(pricing, expert_scale=1.0)  # it prices expert ops only
        fixed_items = tuple(sorted((fixed or {}).items()))
        inputs = (id(layer), sp, repeat, boundary, input_layout, output_layout, output_tensor,
                  fixed_items, walk_backward, pricing)
        if inputs in self._solves:
            return self._solves[inputs]
        sg = strategy_graph(self.graph, nodes, sp, input_layout=input_layout,
                            output_layout=output_layout, split_weights=self.split_weights,
                            output_tensor=output_tensor, fixed=fixed, tp=pricing.split.tp)
        problem = block_problem(self.graph, sg, layer, pricing, repeat=repeat,
                                boundary=boundary)
        sol = solve(problem, time_limit_s=SOLVE_TIME_LIMIT_S, num_workers=1)
        gap = sol.gap if math.isfinite(sol.gap) else 1.0
        # what ``strategy_graph`` and ``solved_layer`` read, and the choice
        key = (id(layer), sp, input_layout, output_layout, output_tensor, fixed_items,
               pricing.split.tp, sol.strategy, walk_backward)
        if key not in self._layers:
            self._layers[key] = solved_layer(self.graph, sg, layer, sol.strategy, self.act_bytes,
                                             pricing.split.tp, walk_backward=walk_backward)
        self._solves[inputs] = (self._layers[key], gap, sg.stream_tensor)
        return self._solves[inputs]

    def _tied_tables(self, pre_nodes: list[NodeInfo], post_nodes: list[NodeInfo],
                     post_strategies: tuple[tuple[str, str], ...]) -> dict[str, str]:
        """An embedding whose table is a solved head's weight (a tied head) is one parameter
        with one layout: it takes the head's row split (``column`` -> ``vocab``) or stays
        whole, priced as such in the embedding's own solve."""
        chosen = dict(post_strategies)
        gemm_of = {p: n.name for n in post_nodes if n.name in chosen for p in n.params}
        fixed = {}
        for n in pre_nodes:
            heads = [gemm_of[p] for p in n.params if n.op == "embedding" and p in gemm_of]
            if heads and chosen[heads[0]] in _TIED_EMBEDDING:
                fixed[n.name] = _TIED_EMBEDDING[chosen[heads[0]]]
        return fixed

    def solve(self, pricing: Pricing, sp: bool) -> StrategyResult:
        # The strategies are solved at one micro-batch of one sequence (no cp split) and reused
        # for every micro-batch size and cp degree: the solved layer records which ops divide
        # and which collectives run, not their times, and compute and communication both
        # scale with the tokens, so only latency terms could move the optimum.
        s = replace(pricing.split, micro_batch=1, cp=1)
        pricing = replace(pricing, split=s)
        key = (s, pricing.tp_group, pricing.expert_scale, sp)
        if key in self.cache:
            return self.cache[key]
        pre_nodes, block_nodes, post_nodes = layer_nodes(self.graph)
        block, g1, block_input = self._solve(block_nodes, self.base.block, pricing, sp,
                                             repeat=self.base.num_blocks, boundary=True,
                                             walk_backward=True)
        post, g2, _ = self._solve(post_nodes, self.base.post, pricing, sp,
                                  input_layout=block.output_layout)
        pre, g3, _ = self._solve(pre_nodes, self.base.pre, pricing, sp,
                                 output_layout=block.input_layout, output_tensor=block_input,
                                 fixed=self._tied_tables(pre_nodes, post_nodes, post.strategies))
        gap = max(g1, g2, g3)
        same = (id(pre), id(block), id(post), s.tp, gap)
        if same not in self._results:
            work = replace(self.base, pre=pre.layer, block=block.layer, post=post.layer,
                           tp=s.tp)
            self._results[same] = StrategyResult(work, block.strategies,
                                                 pre.strategies + post.strategies, gap)
        self.cache[key] = self._results[same]
        return self.cache[key]
