"""A pipeline stage's memory on one GPU: its blocks grouped by policy, the parameters it holds,
what one micro-batch keeps and works with, and its peak for the micro-batches it holds in
flight (``costmodel/memory.py``'s terms, ``costmodel/peak.py``'s peak). ``costmodel/step.py``
prices a step's time and sizes its stages through these; ``step.exceeds_memory`` sizes them
alone."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from .compute import Split
from .memo import ByLayer
from autopar.core.estimate import StageMemory
from .memory import (ModelStates, StateBytes, backward_peak, dtype_bytes, model_state_bytes,
                     recompute_working_bytes, saved_bytes, stage_output_bytes, transient_bytes)
from .peak import StageActivations, StageParams, stage_peak
from .pipeline import StagePartition, in_flight_microbatches, loss_in_flight_microbatches
from .schedule_slots import weighted_in_flight
from autopar.core.stages import stage_chunks
from autopar.core.fp8 import fp8_all_gather, fp8_params
from autopar.core.specs import FP8_FUSED_CASTS, Checkpoint, ParallelConfig, Schedule, TrainSpec
from .topology import MeshGroups
from .workload import LayerCost, Shard, Workload


def _stage_groups(
    workload: Workload, part: StagePartition, stage: int,
    policies: tuple[Checkpoint, ...] | None = None,
) -> list[tuple[LayerCost, Checkpoint, int]]:
    """(layer, policy, how many) of one stage: its blocks grouped by policy, since every block
    under one policy costs the same (a stage of 100 blocks is priced in two or three terms).
    Without ``policies`` the blocks are one group."""
    first, blocks = part.first_block(stage), part.blocks[stage]
    counts = (Counter(policies[first:first + blocks]) if policies is not None
              else {Checkpoint.NONE: blocks} if blocks else {})
    groups = [(workload.block, p, n) for p, n in counts.items()]
    if stage == 0:
        groups.insert(0, (workload.pre, Checkpoint.NONE, 1))
    if stage == part.num_stages - 1:
        groups.append((workload.post, Checkpoint.NONE, 1))
    return groups


LAYER_TIMES_KEPT = 4096
"""Entries the per-layer memos of this module and ``step.py`` keep."""
_LAYER_SIZES = ByLayer(LAYER_TIMES_KEPT)


def _layer_bytes(layer: LayerCost, split: Split, policy: Checkpoint, block_grad_bytes: float
                 ) -> tuple[float, float, tuple[float, float]]:
    """(saved, working, backward peak) bytes of one micro-batch of ``layer`` on one GPU
    (``costmodel/memory.py``), remembered across estimates (``_LAYER_SIZES``)."""
    def make() -> tuple[float, float, tuple[float, float]]:
        working = recompute_working_bytes(layer, split, policy) + transient_bytes(layer, split)
        return (saved_bytes(layer, split, policy), working,
                backward_peak(layer, split, policy, block_grad_bytes)
                or (working, block_grad_bytes))
    return _LAYER_SIZES.get(layer, (policy, split, block_grad_bytes), make)


def _layer_params(layer: LayerCost, config: ParallelConfig) -> tuple[float, float]:
    """(dense, expert) parameters of one ``layer`` on one GPU: the experts split over the
    experts' mesh only, ep ways by expert and etp ways within each
    (``passes/expert_parallel.py``) -- the strategy solve never splits an expert GEMM over tp
    (``ops/gemm.py`` splits ``nn.Linear`` layers), so without the fold every tp rank holds its
    ep rank's experts whole."""
    plain = layer.params - layer.params_tp - layer.params_expert
    return (plain + layer.params_tp / config.tp,
            layer.params_expert / (config.ep * config.etp))


def _stage_params(workload: Workload, part: StagePartition, stage: int, config: ParallelConfig
                  ) -> tuple[float, float]:
    """(dense, expert) parameters on one GPU of a stage."""
    dense = expert = 0.0
    for layer, _, n in _stage_groups(workload, part, stage):
        d, e = _layer_params(layer, config)
        dense, expert = dense + n * d, expert + n * e
    if config.pp > 1 and stage == part.num_stages - 1:
        dense += workload.tied_params / config.tp
    return dense, expert


def _fp8_gathered_params(workload: Workload, config: ParallelConfig, train: TrainSpec
                         ) -> float:
    """Parameters of one block on one GPU that FSDP gathers in FP8 (``core.fp8``: tensorwise),
    the tp split taken as the whole layer's; 0 where nothing is gathered in FP8 -- nor under
    Transformer Engine (``FP8_FUSED_CASTS``) with ZeRO-0: Megatron's ``--fp8-param-gather``
    needs the distributed optimizer, and without it gathers no parameters."""
    if not fp8_all_gather(train) or (FP8_FUSED_CASTS in config.fusions and config.zero == 0):
        return 0.0
    return fp8_params(workload.block.ops) / config.tp


def _gathered_weight_bytes(workload: Workload, part: StagePartition, stage: int,
                           config: ParallelConfig, train: TrainSpec, dense: float,
                           weight_bytes: float) -> float:
    """Bytes per dense parameter FSDP all-gathers on one stage: ``weight_bytes``, but one byte
    for the FP8 linears' weights when they are gathered in FP8 (``_fp8_gathered_params``),
    their share of the stage's dense parameters."""
    fp8 = part.blocks[stage] * _fp8_gathered_params(workload, config, train)
    if fp8 <= 0 or dense <= 0:
        return weight_bytes
    share = min(1.0, fp8 / dense)
    return weight_bytes * (1.0 - share) + 1.0 * share


@dataclass(frozen=True)
class _StageSizes:
    """A stage's memory but for the micro-batches it holds in flight (``_stage_sizes``): the
    same for every stage of one signature (its groups, and whether it is the last), so an
    estimate sizes each signature once and each stage's peak from it (``_stage_memory``)."""

    stage: int
    """The first stage of the signature: the first (embedding) and the last (head, loss) are
    each a signature of their own."""
    blocks: int
    kept: float
    """Bytes one micro-batch keeps over all the stage's layers."""
    loss_kept: float
    working: float
    block_working: float
    block_grad_fraction: float
    held: StageParams | ModelStates
    """The parameters' roles ``stage_peak`` holds; under offload the model states by ZeRO's
    rule."""
    fp8_gathered: tuple[float, float]
    fp8_copies: float
    """Bytes of Transformer Engine's FP8 weight copies (0 without them)."""
    stage_output: float
    chunk_kept: tuple[float, ...] = ()
    """Under the interleaved schedule, what each of the stage's model chunks keeps for one
    micro-batch (first chunk first; the loss's part apart, ``loss_kept``), where the chunks
    differ: the first stage's first chunk holds the embedding and the layers before the blocks
    too (``_chunk_kept``); empty where they are alike."""


def _stage_sizes(
    workload: Workload, part: StagePartition, stage: int,
    groups: list[tuple[LayerCost, Checkpoint, int]], split: Split, config: ParallelConfig,
    dense: float, expert: float, train: TrainSpec, sb: StateBytes, g: MeshGroups,
) -> _StageSizes:
    """The sizes of stage ``stage`` of ``groups`` (``_stage_groups``) that do not depend on
    the micro-batches it holds in flight."""
    kept = 0.0
    working = 0.0
    chunk_output = outputs = 0.0  # a chunk's output of one micro-batch, and the stage's, cached
    block_grad_bytes = sum(_layer_params(workload.block, config)) * \
        dtype_bytes(train.precision, train.optimizer)[1]
    walked: tuple[float, float] | None = None  # (activations, gradients) of a block's backward
    loss_kept = 0.0  # of ``kept``: what the loss layer (final norm, head, loss) keeps
    pre_kept = 0.0  # of ``kept``: what the layers before the blocks keep (the first chunk's)
    for layer, policy, n in groups:
        saved, layer_working, peak = _layer_bytes(layer, split, policy, block_grad_bytes)
        kept += n * saved
        if layer is workload.post:
            loss_kept = n * saved
        elif layer is workload.pre:
            pre_kept = n * saved
        working = max(working, layer_working)
        if layer is workload.block and (walked is None or sum(peak) > sum(walked)):
            walked = peak
    block_working, block_grads = walked if walked is not None else (0.0, block_grad_bytes)
    fp8_block = _fp8_gathered_params(workload, config, train)
    last = stage == config.pp - 1
    if config.pp > 1 and not split.mcore_activations:
        # torch's schedules keep each chunk's output of a micro-batch until that micro-batch's
        # backward of the chunk (the stage's ``fwd_cache``): a block output per chunk and
        # micro-batch in flight, in the layout the last block makes it (sequence-split under
        # SP), which no op of the block saves; on the last stage not its last chunk's, the
        # loss (``stage_output`` holds what the loss reads). Megatron-Core frees them
        # (``core.specs.MCORE_ACTIVATIONS``)
        v = config.virtual_stages if config.schedule is Schedule.INTERLEAVED else 1
        chunk_output = workload.block.output_elements * split.act_bytes * split.scale(Shard.SEQ)
        outputs = (v - 1 if last else v) * chunk_output
        kept += outputs
    held: StageParams | ModelStates
    if config.offload:  # sized by ZeRO's rule: the dry run does not hold offload to it yet
        held = model_state_bytes(dense, expert, sb, zero=config.zero, dp=g.dp_cp.size,
                                 expert_dp=g.expert_dp.size, offload=True)
    else:
        held = StageParams(
            whole=dense + expert,
            sharded=dense + expert if config.zero == 0 else
            dense / g.dp_cp.size + expert / g.expert_dp.size,
            root=sum(sum(_layer_params(layer, config)) for layer, _, _ in groups
                     if layer is not workload.block),
            block=sum(_layer_params(workload.block, config)),
            head=sum(_layer_params(workload.post, config)) + workload.tied_params / config.tp
            if last else 0.0,
            embedding_extra=workload.pre.params_vocab * (1.0 - 1.0 / config.tp))
    copies = 0.0
    if split.fp8 and split.fp8_fused_casts:
        # Transformer Engine keeps each FP8 linear's weight transposed in FP8 (its GEMMs read
        # both layouts) across the step's micro-batches and, unless the weights are FP8
        # themselves (--fp8-param-gather: tensorwise under the distributed optimizer, the
        # gathered copies ``stage_peak`` already holds at one byte), an FP8 copy beside the
        # bf16 weight: 1 or 2 bytes per FP8 parameter on this rank, the tp split as the
        # layer's (torchao's casts, autopar's engine, are transient: the dry run finds bf16's
        # peak)
        fp8 = part.blocks[stage] * fp8_params(workload.block.ops) / config.tp
        copies = (1.0 if fp8_block > 0 else 2.0) * fp8
    return _StageSizes(
        stage, part.blocks[stage], kept, loss_kept, working, block_working,
        block_grads / block_grad_bytes if block_grad_bytes else 1.0, held,
        (part.blocks[stage] * fp8_block, fp8_block), copies,
        stage_output_bytes(workload.post, split) if last and config.pp > 1 else 0.0,
        _chunk_kept(part, stage, config, pre_kept, chunk_output,
                    kept - loss_kept - pre_kept - outputs))


def _chunk_kept(part: StagePartition, stage: int, config: ParallelConfig, pre_kept: float,
                chunk_output: float, blocks_kept: float) -> tuple[float, ...]:
    """What each of the stage's model chunks keeps for one micro-batch under the interleaved
    schedule (``_StageSizes.chunk_kept``): the blocks' ``blocks_kept`` shared by the chunk's
    blocks (the engine's cut, ``core.stages.stage_chunks``; evenly where a stated layout cuts
    otherwise), the layers before the blocks' ``pre_kept`` in the first stage's first chunk,
    and each chunk's ``chunk_output``, which torch's schedule caches (not the last stage's
    last chunk's, whose output is the loss's). Empty where every chunk keeps the same, or
    without interleaving.
    Middle stages of one signature share their first's split (``_StageSizes``): where the
    engine's cut gives them chunks of different sizes, the others are priced with its."""
    v = config.virtual_stages
    if config.schedule is not Schedule.INTERLEAVED or v == 1:
        return ()
    try:
        chunks = stage_chunks(part.blocks, v)[stage::config.pp]
    except ValueError:
        chunks = [part.blocks[stage] / v] * v
    blocks = sum(chunks)
    kept = [blocks_kept * (c / blocks if blocks else 1.0 / v) + chunk_output for c in chunks]
    kept[0] += pre_kept
    if stage == config.pp - 1:
        kept[-1] -= chunk_output
    return () if max(kept) - min(kept) <= 1e-9 * max(kept) else tuple(kept)


def _stage_memory(sizes: _StageSizes, stage: int, config: ParallelConfig, m: int, v: int,
                  train: TrainSpec) -> StageMemory:
    """The memory of stage ``stage`` of ``sizes`` (its signature's), with the micro-batches it
    holds in flight."""
    in_flight = in_flight_microbatches(config.schedule, stage, config.pp, m, v)
    if sizes.chunk_kept:
        # chunks that keep different amounts: the largest backward start's bytes by chunk, where
        # a heavy first chunk (the embedding, DeepSeek's dense layers) is held by more
        # micro-batches than the even count gives; never less than the even count, which
        # bounds the stage's other moments (the embedding's backward, a block's), whose chunk
        # states are not followed one by one
        in_flight = max(in_flight, weighted_in_flight(config.schedule, stage, config.pp, m, v,
                                                      sizes.chunk_kept))
    if isinstance(sizes.held, ModelStates):
        states = sizes.held
        breakdown = {"params": states.params, "grads": states.grads,
                     "optimizer": states.optimizer,
                     "activations": in_flight * sizes.kept + sizes.working, "buffers": 0.0}
        moment = ""
    else:
        acts = StageActivations(
            in_flight, sizes.kept, sizes.working, sizes.block_working,
            sizes.block_grad_fraction,
            loss_kept=sizes.loss_kept,
            loss_in_flight=min(in_flight, loss_in_flight_microbatches(config.schedule,
                                                                      config.pp, m)),
            stage_output=sizes.stage_output)
        moment, breakdown = stage_peak(sizes.held, acts,
                                       train.precision, train.optimizer, zero=config.zero,
                                       pipelined=config.pp > 1, microbatches=m,
                                       holds_embedding=stage == 0,
                                       holds_loss=stage == config.pp - 1,
                                       fp8_gathered=sizes.fp8_gathered,
                                       grad_dtype=train.grad_dtype)
    if sizes.fp8_copies:
        breakdown = {**breakdown, "params": breakdown["params"] + sizes.fp8_copies}
    return StageMemory(stage=stage, blocks=sizes.blocks, breakdown=breakdown,
                       moment=moment)
