"""The cost model's view of a model: per-layer tables of work, saved activations and communication.

``autopar.analysis.workload.build_workload`` derives a ``Workload`` from a traced ``GraphIR``; the cost
model reads nothing else of the model. Every quantity is for ONE sequence at the traced sequence
length on ONE unsharded replica; the cost model scales by micro-batch and divides by the parallel
degrees according to each entry's ``Shard`` class. Bytes of activations are in the training
precision's activation dtype (``act_bytes`` per element), recorded here as element counts so that
the precision policy is applied in one place (``costmodel.memory``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from enum import Enum

from autopar.core.collectives import Collective
from autopar.core.layout import Shard
from autopar.core.roofline import OpKind

__all__ = ["BackwardMoment", "LayerCost", "OpCost", "OpKind", "Phase", "SavedTensor", "Shard",
           "TPCollective", "Workload"]


class Phase(Enum):
    """Where in the step work happens (calculon's layer phases)."""

    FORWARD = "forward"
    BACKWARD_ACT = "backward-activation"
    BACKWARD_WEIGHT = "backward-weight"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class OpCost:
    """One op of a layer, per sequence, forward, unsharded."""

    name: str
    op: str
    kind: OpKind
    flop: float
    bytes: float
    """Bytes read+written at the traced dtype's itemsize scaled to the activation dtype."""
    shard: Shard
    kept_by_matmuls: bool = False
    """The ``matmuls`` policy keeps this op's output (a linear layer's GEMM, fused attention), so
    its backward does not run it again; it reruns every other op of the block."""
    attention_core: bool = False
    """An op of an unfused attention core (q.k^T to probabilities.v, ``ops.attention_core``):
    the one work the ``selective`` policy reruns in the backward."""
    moe_layer: bool = False
    """An op inside a mixture-of-experts layer (router, dispatch, experts, combine:
    ``GraphIR.in_moe_layer``): the work the ``moe`` policy reruns in the backward."""
    expert: bool = False
    """Expert computation of an MoE layer (its weights are split by ep)."""
    kv_elements: float = 0.0
    """For attention: K and V elements per sequence (what ring attention passes around)."""
    causal: bool = False
    """A fused attention whose kernel skips the masked half of the causal score matrix: its
    ``flop`` counts the whole product (the MFU convention), it computes half."""
    backward_bytes: float | None = None
    """Bytes the backward moves, for a memory-bound op whose backward is not the usual twice
    the forward's bytes (a fused loss that computes its gradients in the forward); None: 2x."""
    weight_shape: tuple[int, int] | None = None
    """A linear layer's weight as ``nn.Linear`` holds it: (output features, input features),
    unsharded; None for other ops (``compute.linear_gemms`` prices the GEMMs at this shape)."""
    fp8: bool = False
    """A linear of the blocks that an ``fp8`` plan runs in FP8 (``autopar.core.fp8``'s rule;
    ``compute.estimate_op_s`` prices it so only when the plan's precision is fp8)."""
    expert_shape: tuple[int, int, int] | None = None
    """An expert GEMM's stacked weight: (experts, reduction, width), unsharded; None for other
    ops, or experts that are not one stacked weight (``compute.grouped_gemms`` prices the
    grouped GEMM at this shape)."""


@dataclass(frozen=True)
class SavedTensor:
    """An activation kept from the forward for the backward pass, per sequence, unsharded."""

    name: str
    elements: float
    shard: Shard
    bytes_per_element: float | None = None
    """Fixed element size (a bool mask: 1, an fp32 statistic: 4); None: the activation dtype."""
    without_checkpoint: bool = True
    """Kept when the block is not checkpointed: autograd saves it for some op's backward."""
    matmuls: bool = False
    """Kept under the ``matmuls`` policy: the block input, a linear layer's output, fused
    attention's output and statistics (``passes/checkpointing.py``)."""
    attention_core: bool = False
    """Made by an unfused attention core and saved only by its ops (scores, probabilities, the
    dropout's mask and output; not the core's output): the ``selective`` policy rebuilds it in the backward instead of keeping it; it
    keeps every other tensor ``without_checkpoint`` keeps."""
    moe_layer: bool = False
    """Made inside a mixture-of-experts layer and saved only by its ops (``GraphIR.
    in_moe_layer``; not the layer's input, made outside it): the ``moe`` policy rebuilds it in
    the backward instead of keeping it; it keeps every other tensor ``none`` keeps."""
    transient: bool = False
    """Not kept from forward to backward but live while the layer runs, on top of what it
    keeps: the eager loss's fp32 gradients of the logits, the fused loss's chunk of logits.
    Counted once, at the stage's peak, not per micro-batch in flight (``without_checkpoint``
    and ``matmuls`` are then false)."""
    per_token: bool = True
    """The size scales with the tokens on this GPU (an activation); False for a buffer the size
    of a weight (the fused loss's weight gradient): ``elements`` per micro-batch, whatever its
    size, divided by neither the micro-batch nor cp."""
    savers: tuple[str, ...] = ()
    """The nodes that keep it for their backward, in the forward's order (a fused kernel's
    saves: the last node of its chain); none for what only the ``matmuls`` policy caches."""
    widened_from: str | None = None
    """For a cast to fp32 (``WIDEN``) of the activation named here: a 4-byte copy where the
    activations are narrower (bf16, fp16), the same storage as that activation where they are
    fp32 -- counted then only where that activation is not kept as well
    (``costmodel.memory._sized``)."""
    stage_output: bool = False
    """The tensor the loss reads (the logits; the hidden state under the fused loss): a pipeline's
    last stage's output, which torch's schedule passes to ``stage_backward`` and so holds while
    the micro-batch's backward runs, after the loss's own backward freed what it saved. Not kept
    by any policy (``without_checkpoint`` and ``matmuls`` are false)."""


@dataclass(frozen=True)
class BackwardMoment:
    """What a layer holds while one of its ops runs its backward, beyond the activations the
    stage keeps for the layers' backward (``autopar.search.backward_walk`` walks the layer's
    ops in reverse and records one per op that allocates)."""

    op: str
    """The op whose backward runs."""
    grads: tuple[SavedTensor, ...]
    """Gradients of activations alive: one buffer per tensor whose producer's backward has not
    run yet (in the producer's layout), and the op's new gradients of its inputs (in the layout
    it reads them in: a column split's gradient of its gathered input is whole)."""
    saved: tuple[SavedTensor, ...]
    """The layer's saved tensors that ops whose backward has not run yet still hold, each in
    the layout its saver holds it in (``LayerCost.saved``'s flags: a policy that recomputes one
    has rebuilt it for this backward)."""
    weight_grad_fraction: float
    """Fraction of the layer's parameters whose gradient exists, this op's included."""


@dataclass(frozen=True)
class TPCollective:
    """A tensor-parallel collective over ``elements`` activations per sequence (the full tensor,
    before any split by tp).

    ``kind`` is a ``core.collectives.Collective`` value: the collective the resharding of
    the strategies chosen by the solve needs (all-reduce, all-gather, reduce-scatter,
    all-to-all; ``autopar.search.reshard``).
    """

    name: str
    elements: float
    phase: Phase
    kind: str = Collective.ALL_REDUCE


@dataclass(frozen=True)
class LayerCost:
    """One layer: a repeated block, or the parts before (embedding) and after (head, loss)."""

    name: str
    ops: tuple[OpCost, ...]
    saved: tuple[SavedTensor, ...]
    input_elements: float
    """Elements of the layer's input activation per sequence (kept under full recompute)."""
    output_elements: float
    """Elements of the layer's output per sequence (sent to the next pipeline stage)."""
    params: int
    """Parameters of the layer, all of them."""
    params_tp: int
    """Of which divided by tp."""
    params_vocab: int = 0
    """Of ``params_tp``, the embedding tables split by vocabulary rows, whose gradient DTensor's
    backward makes whole on every tp rank (``costmodel/peak.py``: ``embedding_extra``); the
    linears split with them (DeepSeek's dense first layers) have sharded gradients."""
    params_expert: int = 0
    """Of which expert weights (divided by ep)."""
    tp_collectives: tuple[TPCollective, ...] = ()
    ep_alltoall_elements: float = 0.0
    """Elements each dispatch (and each combine) all-to-all moves per sequence: the (E, C, h)
    slots of a capacity layer, the balanced ``top_k * T / E`` rows per expert of a dropless
    one (``models/moe/model.py``)."""
    ep_dropless: bool = False
    """The experts drop nothing: the all-to-alls and the expert GEMMs of the busiest rank
    grow with the load imbalance, and the per-expert counts are exchanged first."""
    route_groups: tuple[int, int] | None = None
    """(expert groups, groups a token may route to) of a group-limited router (DeepSeek-V3's
    node-limited routing); None: a token's experts may sit anywhere."""
    no_rule_ops: tuple[str, ...] = ()
    """Ops the sharding rules did not know, costed as replicated."""
    held: tuple[SavedTensor, ...] = ()
    """``saved`` as the ops hold it for the backward (``search.backward_walk.saved_as_held``):
    an activation once per layout its savers read it in, so a column-parallel linear under
    sequence parallelism keeps its all-gathered input whole, as DTensor's does. Made with
    ``backward`` (the repeated block's, after the solve); empty otherwise, and then ``saved``
    (each tensor in its producer's layout) is what a layer keeps."""
    backward: tuple[BackwardMoment, ...] = ()
    """The layer's backward, op by op, in the layouts the strategy solve chose: where the
    working set of a block's backward peaks (the repeated block's, after the solve; empty
    otherwise)."""

    @cached_property
    def matmul_flop(self) -> float:
        return sum(o.flop for o in self.ops if o.kind in (OpKind.MATMUL, OpKind.ATTENTION))


@dataclass(frozen=True)
class Workload:
    """A model as the cost model sees it."""

    name: str
    pre: LayerCost
    """Embedding and whatever runs before the first block: on the first pipeline stage."""
    block: LayerCost
    """One repeated block."""
    num_blocks: int
    post: LayerCost
    """Final norm, head and loss: on the last pipeline stage."""
    seq_len: int
    tied_params: int = 0
    """Parameters held by both the first and the last stage (a tied embedding/head)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    tp: int = 1
    """The tensor-parallel degree whose per-op strategies the entries record (their ``Shard``,
    ``params_tp``, ``tp_collectives``; ``autopar.search.tp_solve``). The base workload
    (``autopar.analysis.workload.build_workload``) has 1: nothing divides by tp and no tp collective
    runs. ``costmodel.step.estimate_step`` prices a workload only at its own degree."""

    @property
    def params(self) -> int:
        return self.pre.params + self.num_blocks * self.block.params + self.post.params
