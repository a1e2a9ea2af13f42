"""Hold the cost model to published training runs (Megatron-LM, ZeRO).

Used by ``tests/unit/measure/test_published_runs.py`` (which asserts) and
``bench/validate_costmodel.py`` (which prints the table). A published run is re-created with its
published configuration: TP, PP, DP = GPUs / (TP * PP), full recomputation, mixed precision with
fp16 compute, and the micro-batch and model chunks per rank it ran with. The paper does not give
those two; its authors' scripts do (NVIDIA/Megatron-LM, ``examples/sc21/run_table_1.sh``:
``MBS`` and ``--num-layers-per-virtual-pipeline-stage``), and ``tests/data`` records them per
row as ``micro_batch_size`` and ``virtual_stages`` (1: the 1F1B schedule). A row without them is
priced at the fastest configuration that fits among micro-batches of 1, 2, 4 and 8 and every
chunk count that divides the stage's layers, under Megatron-LM's rules for the interleaved
schedule: more than two stages, and micro-batches in whole rounds of the pipeline (``m % pp ==
0``); ``megatron.core.parallel_state.initialize_model_parallel`` raises "pipeline-model-parallel
size should be greater than 2 with interleaved schedule", and the schedule asserts the rounds).
Each configuration is priced as ``autopar.estimate`` and the search price it: the per-op
strategies solved for its tp (``search.planner.config_estimate``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch.nn as nn

from autopar import models
from autopar.analysis.admissibility import facts_of
from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency
from autopar.core.errors import AutoparError
from autopar.core.estimate import Estimate
from autopar.costmodel.memory import model_state_bytes, state_bytes_per_param
from autopar.core.specs import (Optimizer, PRICED_FUSIONS, ParallelConfig, Precision, Schedule,
                                TrainSpec)
from autopar.costmodel.pipeline import StagePartition, even_partition
from autopar.search.planner import config_estimate, strategies_of
from autopar.analysis.graph import GraphIR
from autopar.analysis.tracing import trace

MICRO_BATCHES = (1, 2, 4, 8)
MEGATRON_FUSIONS = PRICED_FUSIONS
"""The fused kernels of the Megatron-LM runs (fused scale-mask-softmax, bias-dropout-add)."""


def load_published(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def published_step_s(row: dict) -> float:
    """The iteration time a Table 1 row implies: its FLOPs over its achieved rate."""
    return megatron_flops(row) / (row["achieved_teraflops_per_gpu"] * 1e12 * row["num_gpus"])


def megatron_flops(row: dict) -> float:
    """Eq. 3 of Narayanan et al.: FLOPs per iteration, recomputation included."""
    B, s, l, h, V = (row["global_batch_size"], row["seq_len"], row["num_layers"],
                     row["hidden_size"], row["vocab_size"])
    return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def megatron_configs(row: dict, dp: int) -> list[tuple[int, int]]:
    """(micro-batch, model chunks per rank) to price a Table 1 row at: the one its authors ran
    when the row records it, else every one Megatron-LM would run (module docstring)."""
    if "micro_batch_size" in row:
        return [(int(row["micro_batch_size"]), int(row.get("virtual_stages", 1)))]
    pp = row["pipeline_parallel_size"]
    per_stage = row["num_layers"] // pp
    configs = []
    for mb in MICRO_BATCHES:
        if row["global_batch_size"] % (dp * mb):
            continue
        microbatches = row["global_batch_size"] // (dp * mb)
        for v in [d for d in range(1, per_stage + 1) if per_stage % d == 0] if pp > 1 else [1]:
            if v == 1 or (pp > 2 and microbatches % pp == 0):
                configs.append((mb, v))
    return configs


@dataclass(frozen=True)
class RunCheck:
    row: dict
    estimate: Estimate
    predicted_tflops: float
    published_tflops: float

    @property
    def error(self) -> float:
        return self.predicted_tflops / self.published_tflops - 1.0


def megatron_inputs(row: dict, cluster_preset: str = "dgx-a100-80g"
                    ) -> tuple[nn.Module, ClusterSpec, TrainSpec]:
    """Model, cluster and training spec of a Megatron-LM Table 1 row, as the 2021 runs were:
    GPT with eager attention and dropout 0.1, fp16 with Adam, the gradients all-reduced in
    fp16 (Megatron-LM's default under ``--fp16``: ``--accumulate-allreduce-grads-in-fp32`` is
    off unless given, and forced on only under ``--bf16``)."""
    model = models.build("gpt", num_layers=row["num_layers"], hidden_size=row["hidden_size"],
                         num_heads=row["attention_heads"], vocab_size=row["vocab_size"],
                         seq_len=row["seq_len"], attention="eager", dropout=0.1, device="meta")
    cluster = ClusterSpec.preset(cluster_preset, nodes=max(1, row["num_gpus"] // 8))
    train = TrainSpec(global_batch=row["global_batch_size"], seq_len=row["seq_len"],
                      precision="fp16", optimizer="adam", grad_dtype="fp16")
    return model, cluster, train


def run_partition(config: ParallelConfig, graph: GraphIR) -> StagePartition | None:
    """The run's pipeline stages as Megatron-LM cuts them: the layers split evenly over the
    stages (it refuses a count the stages do not divide unless told how to cut it), the
    embedding and the loss a chunk each where the run counts them as layers
    (``core.stages.chunk_sizes``) -- ``costmodel.pipeline.even_partition``, not the search's
    stages balanced by cost, which a run does not get unless it gives a layout."""
    if config.pp == 1:
        return None
    v = config.virtual_stages if config.schedule is Schedule.INTERLEAVED else 1
    return even_partition(graph.num_blocks, config.pp, v)


def check_megatron_row(row: dict, cluster_preset: str = "dgx-a100-80g", *,
                       efficiency: Efficiency = DEFAULT_EFFICIENCY,
                       graph: GraphIR | None = None) -> RunCheck:
    """The row re-created and priced (see the module docstring); ``graph`` is the traced model
    of ``megatron_inputs`` when the caller has it already (``autopar calibrate`` prices each
    row many times)."""
    gpus, tp, pp = row["num_gpus"], row["tensor_parallel_size"], row["pipeline_parallel_size"]
    dp = gpus // (tp * pp)
    model, cluster, train = megatron_inputs(row, cluster_preset)
    graph = graph if graph is not None else trace(model, train)
    strategies = strategies_of(graph, facts_of(model), graph.model_name, cluster, train,
                               efficiency=efficiency, fusions=MEGATRON_FUSIONS)
    best: Estimate | None = None
    tried: list[str] = []
    for mb, v in megatron_configs(row, dp):
        try:
            config = ParallelConfig(dp=dp, tp=tp, pp=pp, micro_batch=mb,
                                    schedule="interleaved" if v > 1 else "1f1b",
                                    virtual_stages=v, checkpoint="full",
                                    fusions=MEGATRON_FUSIONS)
            est = config_estimate(strategies, config, run_partition(config, graph))
        except AutoparError as e:
            tried.append(f"micro-batch {mb}, {v} chunks: {e}")
            continue
        tried.append(f"micro-batch {mb}, {v} chunks: peak {est.peak_memory_bytes / 2**30:.1f} "
                     f"GiB of {est.usable_memory_bytes / 2**30:.1f}")
        if est.fits and (best is None or est.step_time_s < best.step_time_s):
            best = est
    if best is None:
        raise AutoparError(
            f"no configuration of the published {row['params_billion']}B run fits: "
            + "; ".join(tried), where="check_megatron_row",
            fix="a published run that ran must fit: look for what the memory model adds")
    achieved = megatron_flops(row) / (best.step_time_s * gpus) / 1e12
    return RunCheck(row, best, achieved, float(row["achieved_teraflops_per_gpu"]))


@dataclass(frozen=True)
class RecomputeCheck:
    """A Korthikanti et al. Table 5 row priced both ways: full recomputation (tensor and
    pipeline parallelism, no sequence parallelism) and the paper's present work (sequence
    parallelism with selective recomputation)."""

    row: dict
    full: Estimate
    selective: Estimate
    full_layer_bytes: float
    """Activations one block keeps per micro-batch on one GPU under ``full``."""
    selective_layer_bytes: float

    @property
    def time_ratio(self) -> float:
        """Predicted full / selective iteration time."""
        return self.full.step_time_s / self.selective.step_time_s

    @property
    def published_time_ratio(self) -> float:
        return self.row["iteration_s_full_recompute"] / self.row["iteration_s_present_work"]

    @property
    def memory_ratio(self) -> float:
        """Predicted selective / full activations per layer."""
        return self.selective_layer_bytes / self.full_layer_bytes


def check_recompute_row(row: dict, cluster_preset: str = "dgx-a100-80g", *,
                        efficiency: Efficiency = DEFAULT_EFFICIENCY,
                        graph: GraphIR | None = None) -> RecomputeCheck:
    """A row of ``tests/data/korthikanti_table5.json`` (the model, tp, pp and micro-batch of
    its Table 3; Megatron's fused kernels; the interleaved schedule with the row's
    ``virtual_stages`` model chunks where its section 6 names one, else 1F1B) priced under full
    recomputation and under selective recomputation with sequence parallelism; ``graph`` as
    for ``check_megatron_row``."""
    from autopar.costmodel.step import split_of
    from autopar.costmodel.memory import saved_bytes
    from autopar.core.specs import Checkpoint, Schedule

    gpus, tp, pp = row["num_gpus"], row["tensor_parallel_size"], row["pipeline_parallel_size"]
    chunks = row.get("virtual_stages", 1)
    schedule = Schedule.INTERLEAVED if chunks > 1 else Schedule.ONE_F_ONE_B
    model, cluster, train = megatron_inputs(row, cluster_preset)
    graph = graph if graph is not None else trace(model, train)
    strategies = strategies_of(graph, facts_of(model), graph.model_name, cluster, train,
                               efficiency=efficiency, fusions=MEGATRON_FUSIONS)
    priced = {}
    for policy, sp in ((Checkpoint.FULL, False), (Checkpoint.SELECTIVE, True)):
        config = ParallelConfig(dp=gpus // (tp * pp), tp=tp, pp=pp,
                                micro_batch=row["micro_batch_size"], sequence_parallel=sp,
                                checkpoint=policy, fusions=MEGATRON_FUSIONS,
                                schedule=schedule, virtual_stages=chunks)
        split = split_of(config, train, train.seq_len)
        block = strategies(config).block
        priced[policy] = (config_estimate(strategies, config),
                          saved_bytes(block, split, policy))
    (full, full_bytes), (sel, sel_bytes) = priced[Checkpoint.FULL], priced[Checkpoint.SELECTIVE]
    return RecomputeCheck(row, full, sel, full_bytes, sel_bytes)


def zero_model_states(example: dict) -> dict[str, float]:
    """Model-state bytes per GPU (decimal GB) for the ZeRO paper's example, per stage."""
    sb = state_bytes_per_param(Precision.FP16, Optimizer.ADAM)
    out = {}
    for key, zero in (("baseline", 0), ("zero1_os", 1), ("zero2_os_g", 2), ("zero3_os_g_p", 3)):
        st = model_state_bytes(example["params"], 0.0, sb, zero=zero, dp=example["dp"],
                               expert_dp=1, offload=False)
        out[key] = (st.params + st.grads + st.optimizer) / 1e9
    return out
