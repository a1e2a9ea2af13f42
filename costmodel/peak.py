"""The peak memory of one GPU of a pipeline stage: the largest of the moments where it occurs.

A sum of each kind's largest size is not the peak: FSDP2 (``passes/data_parallel.py``) frees
and re-gathers parameters, turns gradients into fp32 accumulators and reduced shards, at
different moments than the activations come and go. The dry run of the emitted program
(``autopar.dryrun.run``, ``bench/results/memory_grid.md``) shows where each rank peaks; these are
the moments priced here, each with what the engine holds then:

* ``backward start``: the backward of a micro-batch begins (on the last stage, the loss's
  backward, with its working set), the larger of two: the first micro-batch's, with every
  micro-batch in flight and no earlier gradient, and a later one's, with the earlier
  micro-batches' gradients and as many in flight as the schedule keeps once a backward ran
  (GPipe: one fewer; 1F1B: the same, its forwards refilling). The same two for the next
  moment. Parameters are held
  gathered where the engine keeps them (ZeRO 0-2) and are not yet re-gathered otherwise
  (ZeRO-3 resharded every unit after the forward just run, under pipelining too). Gradients are
  the accumulators (in the reduce dtype, ``TrainSpec.grad_dtype``: fp32 by default) where
  micro-batches accumulate unreduced, plus the compute-dtype
  gradient of the block whose backward runs (none yet on the last stage, where the loss's
  backward comes first); else the reduced fp32 shards of the earlier
  micro-batches; none in a step of one micro-batch.
* ``blocks' backward``: the backward of the stage's blocks, at the last of them (the stage's
  first block). Under pipelining every unit is gathered by then at every ZeRO stage (ZeRO-3's
  backward keeps what it gathers until the next forward). Without, the root unit (final norm,
  head, embedding) was gathered for the head's backward and stays gathered until its own
  post-backward, at the end of the whole backward, beside the block's own. The head's
  gradient, whole in the compute dtype (made in the forward by a fused loss, in the head's
  backward otherwise), lives as long; the block makes its gradient; every block's activations
  of the micro-batch are still kept, and the block's recomputation (where checkpointed) runs
  beside them.
* ``end of backward`` (a stage holding the embedding): the embedding's backward of a
  micro-batch. Under pipelining every micro-batch's end of backward but the last keeps the
  others in flight and every unit gathered; without, the units have been resharded after
  their backward but the stage's root unit (embedding, final norm, head). DTensor's backward
  of a vocabulary-sharded embedding (``RowwiseParallel``) makes the gradient of the whole
  table on every tensor-parallel rank, and FSDP2 accumulates it whole: the embedding's
  gradient is priced whole, not divided by tp. The last reduce-scatter's input (the last
  block's gradient in the reduce dtype) is alive until the next.
* ``optimizer``: the step, over the reduced fp32 gradient shards.

Model states are FSDP2's: fp32 master shards under mixed precision
(``MixedPrecisionPolicy(param_dtype=low)``), the gathered compute-dtype copies, fp32 moments,
fp32 reduced gradient shards (FSDP2 reduces in ``reduce_dtype``, then casts the shard to the
sharded parameter's dtype) -- sharded over ``dp`` from ZeRO-1 up;
ZeRO-0 runs FSDP2 with shard groups of one, so its shards are whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from autopar.core.specs import GradDtype, Optimizer, Precision
from .memory import dtype_bytes, grad_reduce_bytes


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a stage holds (after tensor and expert parallelism), by role."""

    whole: float
    """All of the stage's, gathered."""
    sharded: float
    """The master shard the optimizer steps on (``whole`` for ZeRO-0)."""
    block: float
    """One block's (an FSDP unit of its own)."""
    root: float
    """The stage root unit's: what is not in a block (embedding, final norm, head)."""
    head: float = 0.0
    """The head's (and final norm's), where the stage holds them: the gradient the loss's and
    head's backward make first."""
    embedding_extra: float = 0.0
    """How much larger the embedding's gradient is than its share: the table's other
    tensor-parallel rows (DTensor's backward makes the whole table's gradient)."""


@dataclass(frozen=True)
class StageActivations:
    """Activation bytes of one GPU of a stage."""

    in_flight: float
    """Micro-batches whose activations the stage holds at the backward start."""
    kept: float
    """Bytes one micro-batch keeps for its backward over all the stage's layers."""
    working: float
    """Bytes alive only while the first layer of a backward runs (the loss's working set on
    the last stage, a recomputed block's on the others)."""
    block_working: float = 0.0
    """Bytes alive only while a block's backward runs, at its largest moment: what its
    recomputation rebuilt and ops still to run hold, and the gradients of activations alive
    (``costmodel.memory.backward_peak``)."""
    block_grad_fraction: float = 1.0
    """Fraction of the block's parameters whose gradient exists at that moment."""
    loss_kept: float = 0.0
    """Of ``kept``: what the loss layer (final norm, head, loss) keeps for one micro-batch,
    on the stage that holds it; freed by the loss's backward, before the blocks' backward."""
    loss_in_flight: float = 1.0
    """Micro-batches holding ``loss_kept`` when the loss's first backward begins
    (``costmodel.pipeline.loss_in_flight_microbatches``): not ``in_flight``, which counts the
    stage's blocks (several chunks' under the interleaved schedule)."""
    stage_output: float = 0.0
    """What the loss reads (the logits), which a pipeline schedule holds as the last stage's
    output while the micro-batch's backward runs (``stage_backward``'s argument)."""


def stage_peak(p: StageParams, a: StageActivations, precision: Precision,
               optimizer: Optimizer, *, zero: int, pipelined: bool, microbatches: int,
               holds_embedding: bool, holds_loss: bool,
               fp8_gathered: tuple[float, float] = (0.0, 0.0),
               grad_dtype: GradDtype = GradDtype.FP32) -> tuple[str, dict[str, float]]:
    """(moment, bytes by kind) at the largest of the stage's moments; the kinds are
    ``params``, ``grads``, ``optimizer``, ``activations`` and ``buffers``. ``fp8_gathered``:
    the parameters of the stage and of one block on this rank that FSDP gathers in FP8 (one
    byte each, ``core.fp8.fp8_all_gather``), which the gathered copies hold at that size.
    ``grad_dtype``: what the gradients accumulate and are reduced in (``TrainSpec.
    grad_dtype``); the reduced shards are in the master dtype (FSDP2 casts them to the sharded
    parameter's)."""
    master, low, moments = dtype_bytes(precision, optimizer)
    saved = low - 1.0
    whole = p.whole * low - fp8_gathered[0] * saved  # every unit gathered
    block = p.block * low - fp8_gathered[1] * saved  # one block's unit gathered
    reduce = grad_reduce_bytes(precision, grad_dtype)  # MixedPrecisionPolicy.reduce_dtype
    gathered_through = zero <= 2 or pipelined
    accumulates = pipelined or (zero <= 1 and microbatches > 1)
    grad_extra = p.embedding_extra if holds_embedding else 0.0
    accumulators = (p.whole + grad_extra) * reduce

    def moment(gathered: float, grads: float, activations: float, buffers: float = 0.0
               ) -> dict[str, float]:
        return {"params": p.sharded * master + gathered, "grads": grads,
                "optimizer": p.sharded * moments, "activations": activations,
                "buffers": buffers}

    # the gradients of the earlier micro-batches: accumulators, or reduced fp32 shards
    earlier = accumulators if accumulates else \
        (p.sharded * master if microbatches > 1 else 0.0)
    # micro-batches in flight at a backward once an earlier one's backward ran: the schedule's
    # steady count under 1F1B (its forwards refill), one fewer than all under GPipe; the first
    # micro-batch's backward holds every one in flight and no earlier gradient
    later = min(a.in_flight, microbatches - 1.0)

    later_loss = min(a.loss_in_flight, microbatches - 1.0)
    blocks_kept = a.kept - a.loss_kept

    def larger(gathered: float, own: float, working: float, *, loss_done: bool = False
               ) -> dict[str, float]:
        # ``loss_done``: the loss's backward of the micro-batch that runs has freed what the
        # loss kept; a pipeline schedule still holds the stage's output (the logits)
        done = (1.0, a.stage_output) if loss_done else (0.0, 0.0)

        def held(n: float, loss_n: float) -> float:
            return n * blocks_kept + max(loss_n - done[0], 0.0) * a.loss_kept + done[1] \
                + working
        first = moment(gathered, own, held(a.in_flight, a.loss_in_flight))
        if microbatches == 1:
            return first
        rest = moment(gathered, earlier + own, held(later, later_loss))
        return max(first, rest, key=lambda kinds: sum(kinds.values()))

    # a micro-batch's backward begins; ZeRO-3 freed every unit after the forward that came
    # just before (under pipelining too)
    found = {"backward start": larger(whole if zero <= 2 else 0.0,
                                      p.block * low if accumulates and not holds_loss else 0.0,
                                      a.working)}
    # the stage's last block's backward (its first block in the stage's order): every unit
    # gathered where the engine keeps them, else the root unit and the block; the head's
    # gradient made, where the stage has the head
    found["blocks' backward"] = larger(
        whole if gathered_through else p.root * low + block,
        (p.head + p.block * a.block_grad_fraction) * low, a.block_working,
        loss_done=holds_loss)
    if holds_embedding:
        # the embedding's backward: its gradient (whole over tp) made in the compute dtype
        # beside the other micro-batches in flight (under pipelining)
        embedding_grad = (p.root + grad_extra) * low
        if pipelined:
            # the first micro-batch's: the others in flight, and at the root's post-backward
            # its fp32 accumulators made while its compute-dtype gradient is alive (the dry run
            # of 70b-pp2-gpipe-sel: the whole table's 2004 MiB in bf16 beside its 4008 MiB
            # accumulator); an upper bound where the root has many parameters, which FSDP2
            # converts one by one
            found["end of backward"] = moment(
                whole, accumulators + embedding_grad,
                max(a.in_flight - 1.0, 0.0) * a.kept)
        else:
            # the blocks' gradients, reduced to their share of the shard
            reduced = accumulators if accumulates else \
                p.sharded * (1.0 - p.root / p.whole) * master
            found["end of backward"] = moment(p.root * low, reduced + embedding_grad, 0.0,
                                              buffers=p.block * reduce)
    found["optimizer"] = moment(0.0, p.sharded * master, 0.0)
    name = max(found, key=lambda k: sum(found[k].values()))
    return name, found[name]
