"""What the execution passes run for a plan, in words, for the plan's report.

Kept beside the Plan (not in ``passes``) so the report can say it without importing the
engine; ``passes/data_parallel.py`` applies exactly these choices.
"""

from __future__ import annotations

from autopar.costmodel.specs import Checkpoint, ParallelConfig, Precision, TrainSpec

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
"""What runs for each ZeRO stage; ``passes/data_parallel.py`` has the details."""

_PRECISION = {
    Precision.BF16: "FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): bf16 "
                    "compute on fp32 master weights, gradients reduced in fp32",
    Precision.FP16: "FSDP2 MixedPrecisionPolicy(param_dtype=fp16, reduce_dtype=fp32), "
                    "no loss scaling",
    Precision.BF16_PURE: "the model cast to bf16; no fp32 copy",
    Precision.FP32: "fp32 throughout",
}

_CHECKPOINT = {
    Checkpoint.NONE: "none",
    Checkpoint.SELECTIVE: "selective (non-reentrant checkpoint saving matmul and fused "
                          "attention outputs, recomputing the rest)",
    Checkpoint.FULL: "full (non-reentrant checkpoint of the block)",
}


def execution_lines(config: ParallelConfig, train: TrainSpec, num_blocks: int
                    ) -> list[tuple[str, str]]:
    """(aspect, what runs) for the report's execution table."""
    rows = [("data parallel", f"dp {config.dp}, ZeRO-{config.zero}: "
                              f"{ENGINE_ZERO[config.zero]}")]
    if config.tp > 1:
        rows.append(("tensor parallel",
                     f"tp {config.tp}: DTensor ColwiseParallel/RowwiseParallel per the module "
                     "styles" + (", SequenceParallel norms" if config.sequence_parallel else "")))
    if config.pp > 1:
        name = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
                "interleaved": "ScheduleInterleaved1F1B"}[config.schedule.value]
        rows.append(("pipeline", f"pp {config.pp}: torch.distributed.pipelining {name}, "
                                 f"{config.microbatches(train)} micro-batches, "
                                 f"{config.virtual_stages} stage(s) per rank; the schedule "
                                 "reduces gradients once per step, after the last "
                                 "micro-batch, whatever the ZeRO stage"))
    policies = config.checkpoint_of(num_blocks) if num_blocks else ()
    kinds = sorted(set(policies), key=list(Checkpoint).index)
    rows.append(("checkpointing", "; ".join(
        f"{sum(p is k for p in policies)} block(s) {_CHECKPOINT[k]}" for k in kinds) or "none"))
    rows.append(("precision", _PRECISION[train.precision]))
    if config.fusions:
        rows.append(("fused kernels", ", ".join(config.fusions) + " (Triton, autopar.kernels; "
                                      "swapped in by passes/fuse.py before the pipeline split)"))
    if config.offload:
        rows.append(("offload", "FSDP2 CPUOffloadPolicy: sharded parameters, gradients and the "
                                "optimizer step on the CPU"))
    if config.cp > 1 or config.ep > 1:
        rows.append(("not executable", "context and expert parallelism are planned but not "
                                       "applied by this version's passes"))
    return rows
