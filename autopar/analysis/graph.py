"""``GraphIR``: a traced training model with shapes, FLOPs and bytes per node, and its repeated blocks.

``autopar.trace`` builds it (see ``autopar/analysis/tracing.py``); the workload builder
(``autopar/analysis/workload.py``) turns it into the cost model's per-block tables. This module holds
only the data types, so that everything else can depend on it.

Conventions
-----------
* One ``NodeInfo`` per fx node that computes something (placeholders, ``get_attr`` and the
  output node are not listed; parameters are referenced by name in ``NodeInfo.params``).
* ``op`` is a canonical name shared by the torch.fx and torch.export paths (the op
  registry's ``autopar.analysis.ops.OP_NAMES``): ``linear``, ``matmul``, ``bmm``, ``baddbmm``, ``sdpa``,
  ``embedding``, ``layer_norm``, ``rms_norm``, ``softmax``, ``dropout``, ``gelu``, ``silu``,
  ``relu``, ``add``, ``mul``, ``sub``, ``div``, ``neg``, ``pow``, ``mean``, ``rsqrt``, ``cat``,
  ``masked_fill``, ``where``, ``topk``, ``cross_entropy``, ``view`` (every op that moves no data:
  view/reshape/transpose/permute/split/chunk/unsqueeze/expand/getitem/getattr/size/contiguous of an
  already contiguous tensor), ``contiguous`` (a copy), ``index``, ``scatter``, ``grouped_mm``
  (MoE experts as one grouped GEMM), ``cast`` (a dtype change), ``other``...
* FLOPs and bytes are for the traced shapes (micro-batch ``GraphIR.batch``, sequence
  ``GraphIR.seq_len``), forward only, unfused: ``fwd_bytes`` = bytes of every tensor input read
  plus every output written (parameters included), 0 for ``view``; ``embedding``/``index`` read
  only the gathered rows of their table, not all of it.
* ``inputs`` lists the names of the nodes whose outputs this node reads, in argument order
  (activations only: not parameters, not buffers, not constants).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from autopar.models.blocks import BlockGroup

__all__ = ["GraphIR", "NodeInfo", "TensorMeta"]


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of one tensor value."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass
class NodeInfo:
    """One computing node of the traced graph."""

    name: str
    """fx node name, unique in the graph."""
    op: str
    """Canonical op name (see the module docstring)."""
    target: str
    """The raw fx target, for messages (``layers.0.attn.qkv``, ``aten.mm.default``...)."""
    inputs: tuple[str, ...]
    """Producer node names of the activation inputs, in argument order."""
    outputs: tuple[TensorMeta, ...]
    """Tensor outputs (one for most ops; several for split/topk...; empty for non-tensor values)."""
    fwd_flop: float = 0.0
    """Forward floating-point operations (a multiply-add counts 2)."""
    fwd_bytes: float = 0.0
    """Forward bytes read and written, unfused."""
    params: tuple[str, ...] = ()
    """Qualified names of the parameters this node reads (``layers.0.attn.qkv.weight``)."""
    param_bytes: int = 0
    """Bytes of those parameters, in the traced dtype."""
    module_path: str = ""
    """Innermost owning module's qualified name ("" for the root)."""
    block: int | None = None
    """Index of the repeated-block instance the node belongs to, or None (embedding, head...)."""
    scalar_args: tuple[object, ...] = ()
    """Non-tensor arguments (dims, eps, p of dropout, ...), for rules that need them."""

    @property
    def out(self) -> TensorMeta | None:
        return self.outputs[0] if self.outputs else None


@dataclass
class GraphIR:
    """A traced model: nodes in execution order, parameters, and the repeated blocks."""

    nodes: list[NodeInfo]
    """Computing nodes in topological (execution) order."""
    params: dict[str, TensorMeta]
    """Every parameter by qualified name (tied parameters appear once, under their first name)."""
    blocks: BlockGroup | None
    """The repeated block group, or None if the model has none."""
    batch: int
    """Micro-batch size the graph was traced at."""
    seq_len: int
    """Sequence length the graph was traced at."""
    method: str
    """``"fx"`` (torch.fx.symbolic_trace) or ``"export"`` (torch.export)."""
    fx: tuple[torch.nn.Module, torch.fx.Graph] | None = field(default=None, repr=False,
                                                               compare=False)
    """The traced fx graph and the module its ``get_attr`` and ``call_module`` nodes name (on
    the meta device); None where the graph was read from the trace cache."""
    model_name: str = ""
    """Class name of the traced model, for reports."""
    layers: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    """Module path -> (``linear`` | ``embedding``, weight shape) of the model's ``nn.Linear``
    and ``nn.Embedding`` layers: what a tensor-parallel style can split
    (``autopar.analysis.admissibility.layers_of``)."""
    expert_params: frozenset[str] = frozenset()
    """Parameters of experts held as a list of modules (a generic decoder's hand-written
    mixture of experts, ``models/generic/experts.py``), which ep divides as it does stacked
    (3-d) expert weights; each expert reads its rows as a slice of one dispatch buffer."""
    moe_modules: frozenset[str] = frozenset()
    """Module paths of the mixture-of-experts layers (the module holding a layer's router and
    experts, ``Family.expert_layers``): under sequence parallelism each tp rank runs one on its
    own sequence shard (the experts' mesh folds over tp, ``ParallelConfig.experts_fold_tp``)."""
    moe_groups: dict[str, tuple[int, int]] = field(default_factory=dict)
    """MoE module path -> (expert groups, groups a token may route to) of the layers whose
    routing is group-limited (a module's ``router_groups``/``router_group_topk``:
    ``models.routing.limit_groups``): how many nodes a token's rows cross to
    (``costmodel/moe.py``)."""
    outer_layers: frozenset[str] = frozenset()
    """Module paths of whole layers outside the repeated blocks that the engine splits over the
    tp ranks as it splits a block's modules: the layers of a built-in model's other block lists
    (``stacks()``: DeepSeek-V3's dense first layers, run with the embedding). Their attention
    and MLP take column and row splits (``ops.gemm.weight_gemm_rule``); a model read by the
    generic family has none (its code outside the blocks is not rewritten for local heads)."""

    @property
    def gm(self) -> torch.fx.GraphModule | None:
        """The traced graph as a ``GraphModule`` (None where the graph was read from the trace
        cache): made on first use, since making one generates its Python code, which the
        analysis never runs (an export trace is one already)."""
        if self.fx is None:
            return None
        root, graph = self.fx
        if not (isinstance(root, torch.fx.GraphModule) and root.graph is graph):
            root = torch.fx.GraphModule(root, graph, self.model_name or "Traced")
            self.fx = (root, graph)
        return root

    def __post_init__(self) -> None:
        self._by_name = {n.name: n for n in self.nodes}
        self._users: dict[str, tuple[NodeInfo, ...]] | None = None

    def node(self, name: str) -> NodeInfo:
        return self._by_name[name]

    def users(self, name: str) -> tuple[NodeInfo, ...]:
        """The nodes that read node ``name``'s output, in execution order (the map is made
        once, on the first call)."""
        if self._users is None:
            users: dict[str, list[NodeInfo]] = {}
            for n in self.nodes:
                for i in dict.fromkeys(n.inputs):
                    users.setdefault(i, []).append(n)
            self._users = {k: tuple(v) for k, v in users.items()}
        return self._users.get(name, ())

    def in_moe_layer(self, node: NodeInfo) -> bool:
        """Whether ``node`` runs inside one of the ``moe_modules``."""
        path = node.module_path
        return any(path == m or path.startswith(m + ".") for m in self.moe_modules)

    def has_node(self, name: str) -> bool:
        return name in self._by_name

    def block_nodes(self, instance: int = 0) -> list[NodeInfo]:
        """The nodes of one block instance, in order."""
        return [n for n in self.nodes if n.block == instance]

    def outside_nodes(self) -> list[NodeInfo]:
        """Nodes not in any block (embedding, final norm, head, loss)."""
        return [n for n in self.nodes if n.block is None]

    @property
    def num_blocks(self) -> int:
        return self.blocks.count if self.blocks else 0

    @property
    def num_params(self) -> int:
        return sum(t.numel for t in self.params.values())

    @property
    def fwd_flop(self) -> float:
        return sum(n.fwd_flop for n in self.nodes)
