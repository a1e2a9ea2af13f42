"""What the execution passes run for a plan, in words, for the plan's report.

Kept beside the Plan (not in ``passes``) so the report can say it without importing the
engine; ``passes/data_parallel.py`` applies exactly these choices.
"""

from __future__ import annotations

from autopar.core.fp8 import fp8_all_gather
from autopar.core.estimate import checkpoint_text
from autopar.core.stages import TORCH_ACTIVE_STAGES
from autopar.core.specs import (ASYNC_TP, ENGINE_FUSIONS, MOE_FUSIONS, Checkpoint, ParallelConfig,
                                Precision, TrainSpec)
from autopar.costmodel.memory import dtype_bytes, grad_reduce_bytes

ENGINE_ZERO = {
    0: "FSDP2 hybrid mode with shard groups of one (DDP): parameters, gradients and optimizer "
       "states replicated; gradients all-reduced once per step",
    1: "FSDP2 fully_shard(reshard_after_forward=False): parameters gathered once per step and "
       "kept until the last backward; gradients accumulated whole and reduce-scattered once "
       "per step; fp32 master weights and optimizer states sharded (ZeRO-1 traffic and "
       "memory during the step; parameters also sharded between steps)",
    2: "FSDP2 fully_shard(reshard_after_forward=False): parameters gathered once per step; "
       "gradients reduce-scattered after every micro-batch, so only shards accumulate; master "
       "weights and optimizer states sharded (ZeRO-2)",
    3: "FSDP2 fully_shard per block: each block's parameters gathered before its forward and "
       "its backward and freed after each; gradients reduce-scattered every micro-batch; "
       "everything sharded (ZeRO-3)",
}
"""What runs for each ZeRO stage without pipelining, the caller accumulating the micro-batches
(``passes/data_parallel.py:set_microbatch``); ``passes/data_parallel.py`` has the details."""

ENGINE_ZERO_PIPELINED = {
    0: "FSDP2 hybrid mode with shard groups of one (DDP): parameters, gradients and optimizer "
       "states replicated; the pipeline schedule turns gradient sync off until the last "
       "micro-batch, so gradients are all-reduced once per step, after it",
    1: "FSDP2 fully_shard(reshard_after_forward=False): parameters gathered once per step and "
       "kept until the last backward; the pipeline schedule turns gradient sync off until the "
       "last micro-batch, so gradients accumulate whole and are reduce-scattered once per step, "
       "after it; fp32 master weights and optimizer states sharded (ZeRO-1 traffic and memory "
       "during the step; parameters also sharded between steps)",
    2: "FSDP2 fully_shard(reshard_after_forward=False): parameters gathered once per step; the "
       "pipeline schedule turns gradient sync off until the last micro-batch, so gradients "
       "accumulate whole and are reduce-scattered once per step, after it, as under ZeRO-1; "
       "master weights and optimizer states sharded",
    3: "FSDP2 fully_shard per block: each block's parameters gathered before a forward or "
       "backward that finds them freed, and freed after every forward; the pipeline schedule "
       "turns gradient sync and resharding after backward off until the last micro-batch, so "
       "a backward keeps them (until the block's next forward or the step's end), and "
       "gradients accumulate whole and are reduce-scattered once per step, after the last "
       "micro-batch; master weights and optimizer states sharded",
}
"""What runs for each ZeRO stage under ``torch.distributed.pipelining`` (pp > 1): before every
micro-batch's backward its stages call ``set_requires_gradient_sync(False)`` and
``set_reshard_after_backward(False)`` on every FSDP module of the stage, and they reduce once,
after the last (``PipelineStage.perform_reduce_grad``); ``reshard_after_forward`` is left as
``passes/data_parallel.py`` set it."""

def zero_text(config: ParallelConfig) -> str:
    """What the engine runs for the data-parallel axis at ``config``'s ZeRO stage: without
    pipelining as the caller accumulates micro-batches, with it as the schedule drives FSDP."""
    if config.pp == 1:
        return ENGINE_ZERO[config.zero]
    text = ENGINE_ZERO_PIPELINED[config.zero]
    v = config.virtual_stages
    if config.zero < 3 and config.schedule.value == "interleaved" and v > TORCH_ACTIVE_STAGES:
        text += (f"; the interleaved schedule keeps all {v} of the rank's stages gathered "
                 f"through the step (torch's lowering would keep {TORCH_ACTIVE_STAGES} and "
                 "gather the others again at each use: passes/pipeline.py:InterleavedSchedule)")
    return text


_PRECISION = {
    Precision.BF16: "FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype={reduce}): bf16 "
                    "compute on fp32 master weights, gradients accumulated and reduced in "
                    "{reduce}",
    Precision.FP16: "FSDP2 MixedPrecisionPolicy(param_dtype=fp16, reduce_dtype={reduce}), with "
                    "dynamic loss scaling (torch's ShardedGradScaler: the loss scaled by 2^16 to "
                    "start, steps with inf/NaN gradients skipped on every rank and the scale "
                    "halved, doubled after 2000 clean steps)",
    Precision.BF16_PURE: "the model cast to bf16; no fp32 copy",
    Precision.FP32: "fp32 throughout",
    Precision.FP8: "as bf16, with the blocks' linear layers (weight dims multiples of 16, routers "
                   "excepted; the head and everything outside the blocks stay bf16) swapped for "
                   "torchao's Float8Linear: inputs, weights and output gradients cast to FP8 with "
                   "dynamic {recipe} scales, products accumulated in fp32{gather}; gradients "
                   "accumulated and reduced in {reduce}",
}

_CHECKPOINT = {
    Checkpoint.SELECTIVE: "non-reentrant checkpoint of the eager attention core only "
                          "(Korthikanti et al.; fused attention runs as is), and under sequence "
                          "parallelism the column-parallel inputs kept as shards and gathered "
                          "again in the backward",
    Checkpoint.MATMULS: "non-reentrant checkpoint saving matmul and fused attention outputs, "
                        "recomputing the rest",
    Checkpoint.FULL: "non-reentrant checkpoint of the block",
    Checkpoint.MOE: "non-reentrant checkpoint of each MoE layer (router, dispatch, experts, "
                    "combine; its all-to-alls issued again in the backward), the rest of the "
                    "block as is",
}
"""What each recomputing policy runs (``passes/checkpointing.py``); ``none`` keeps everything."""


def state_text(train: TrainSpec) -> str:
    """Bytes per parameter of the model states the memory model prices (``costmodel/peak.py``):
    this engine's, which need not be another framework's."""
    master, low, moments = dtype_bytes(train.precision, train.optimizer)
    mixed = train.precision.mixed
    reduce = grad_reduce_bytes(train.precision, train.grad_dtype)
    how = ("reduced and accumulated in the master dtype" if reduce == master else
           f"accumulated and reduced in {reduce:g} B, the reduced shard in the master dtype")
    parts = [f"{master:g} B master", f"{moments:g} B optimizer moments",
             f"{master:g} B gradient ({how})"]
    total = 2 * master + moments
    if mixed:
        parts.append(f"{low:g} B compute copy while gathered")
        total += low
    return (f"priced as this engine holds them: {', '.join(parts)} = {total:g} B per parameter "
            "before sharding (Megatron-LM's distributed optimizer also keeps an fp32 main "
            "gradient, 18 B with Adam in bf16; ZeRO's 16 B counts a 2 B gradient)")


def checkpoint_line(config: ParallelConfig, num_blocks: int) -> str:
    """Which blocks get which policy, in ``checkpoint_text``'s words (as the config row and
    ``Estimate.summary``), then what each recomputing policy runs."""
    policies = config.checkpoint_of(num_blocks) if num_blocks else ()
    kinds = list(dict.fromkeys(policies))  # first used first, as checkpoint_text
    where = checkpoint_text(config.checkpoint)
    if len(kinds) <= 1:
        where += f" on every block ({num_blocks})" if num_blocks else ""
    legend = "; ".join(f"{k} = {_CHECKPOINT[k]}" for k in kinds if k in _CHECKPOINT)
    return where + (f"\n{legend}" if legend else "")


def execution_lines(config: ParallelConfig, train: TrainSpec, num_blocks: int
                    ) -> list[tuple[str, str]]:
    """(aspect, what runs) for the report's execution table."""
    rows = [("data parallel", f"dp {config.dp}, ZeRO-{config.zero}: "
                              f"{zero_text(config)}")]
    if config.tp > 1:
        rows.append(("tensor parallel",
                     f"tp {config.tp}: DTensor ColwiseParallel/RowwiseParallel per the module "
                     "styles" + (", SequenceParallel norms" if config.sequence_parallel else "")))
    if config.pp > 1:
        name = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                "interleaved": "ScheduleInterleaved1F1B"}[config.schedule.value]
        rows.append(("pipeline", f"pp {config.pp}: torch.distributed.pipelining {name}, "
                                 f"{config.microbatches(train)} micro-batches, "
                                 f"{config.virtual_stages} stage(s) per rank"))
    rows.append(("checkpointing", checkpoint_line(config, num_blocks)))
    rows.append(("precision", _PRECISION[train.precision].format(
        recipe=train.fp8_recipe.value, reduce=train.grad_dtype.value,
        gather=("; FSDP all-gathers their weights in FP8" if fp8_all_gather(train)
                and (config.zero >= 1 or config.dp * config.cp > 1) else ""))))
    rows.append(("model states", state_text(train)))
    kernels = [f for f in config.fusions if f not in ENGINE_FUSIONS and f not in MOE_FUSIONS]
    if kernels:
        rows.append(("fused kernels", ", ".join(kernels) + " (Triton, autopar.kernels; "
                                      "swapped in by passes/fuse.py before the pipeline split)"))
    if ASYNC_TP in config.fusions:
        rows.append(("async tp", "PyTorch micro-pipeline TP (passes/async_tp.py): symmetric "
                                 "memory on the tp group, each block torch.compile'd so each "
                                 "sequence-parallel all-gather / reduce-scatter runs decomposed "
                                 "beside its GEMM; CUDA GPUs over NVLink only -- CPU ranks "
                                 "(autopar verify, the dry run) run the blocks eagerly, "
                                 "without the overlap"))
    if config.offload:
        rows.append(("offload", "FSDP2 CPUOffloadPolicy: sharded parameters, gradients and the "
                                "optimizer step on the CPU"))
    if config.cp > 1:
        rows.append(("context parallel",
                     f"cp {config.cp}: each rank two of {2 * config.cp} chunks of every "
                     "sequence (load-balanced); K/V all-gathered with autograd per attention "
                     "(passes/context_parallel.py); FSDP2 reduces gradients over dp x cp"))
    if config.ep > 1 or config.experts_fold_tp:
        over = ("dp x cp x tp: each tp rank routes its own sequence shard"
                if config.experts_fold_tp else "dp x cp")
        rows.append(("experts", f"ep {config.ep} x etp {config.etp} over {over}: each MoE "
                                f"layer's experts DTensor Shard(0) over the ep ranks, tokens sent "
                                f"with the autograd all-to-all, the experts' FSDP2 over their "
                                f"{config.edp} expert-data-parallel ranks "
                                "(passes/expert_parallel.py)"))
    priced = [f for f in config.fusions if f in MOE_FUSIONS]
    if priced:
        rows.append(("not run here", ", ".join(priced) + ": priced as the MoE engines run "
                                     "them (core.specs.MOE_FUSIONS); autopar's passes refuse "
                                     "to execute the plan, the Megatron export sets their "
                                     "flags"))
    return rows
