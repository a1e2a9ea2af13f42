"""The memory model against the dry run of the emitted program, per rank role, on a grid.

    python bench/memory_grid.py [--quick] [--markdown] [--only NAME]

Each case plans one configuration (``autopar.plan_for``) at real scale -- real hidden sizes,
sequence lengths, batch and cluster -- and runs every rank role of it for one step on fake
tensors (``autopar.dryrun.run``). Where a case trims the number of layers (``layers``), each
stage holds fewer blocks than the full model's; per-block memory, the schedule and the model
states per block are the full model's. Prints predicted and dry-run peak per role and the
error; ``--markdown`` prints the table for ``bench/results/memory_grid.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass, field

import autopar
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig, TrainSpec


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    cluster: str
    nodes: int
    global_batch: int
    seq_len: int
    config: dict
    layers: int | None = None
    precision: str = "bf16"
    fp8_recipe: str = "tensorwise"
    quick: bool = False
    overrides: dict = field(default_factory=dict)


GRID = [
    Case("8b-fsdp", "llama3-8b", "hgx-h100-80g", 1, 16, 8192,
         dict(dp=8, zero=3, micro_batch=1), layers=4, quick=True),
    Case("8b-fsdp-full", "llama3-8b", "hgx-h100-80g", 1, 16, 8192,
         dict(dp=8, zero=3, micro_batch=1, checkpoint="full"), layers=4),
    Case("8b-zero1-matmuls", "llama3-8b", "hgx-h100-80g", 1, 32, 4096,
         dict(dp=8, zero=1, micro_batch=2, checkpoint="matmuls"), layers=4),
    Case("8b-zero2", "llama3-8b", "hgx-h100-80g", 1, 32, 4096,
         dict(dp=8, zero=2, micro_batch=2), layers=4),
    Case("8b-ddp-fp32", "llama3-8b", "hgx-h100-80g", 1, 8, 2048,
         dict(dp=8, zero=0, micro_batch=1), layers=2, precision="fp32"),
    Case("8b-tp2-sp", "llama3-8b", "hgx-h100-80g", 1, 16, 8192,
         dict(dp=4, tp=2, zero=1, micro_batch=1, sequence_parallel=True), layers=4, quick=True),
    Case("8b-tp2-sp-sel", "llama3-8b", "hgx-h100-80g", 1, 16, 8192,
         dict(dp=4, tp=2, zero=1, micro_batch=1, sequence_parallel=True, checkpoint="selective"),
         layers=4),
    Case("8b-tp4-nosp-pure", "llama3-8b", "hgx-h100-80g", 1, 8, 4096,
         dict(dp=2, tp=4, zero=1, micro_batch=1), layers=4, precision="bf16-pure"),
    Case("70b-pp2-1f1b-full", "llama3-70b", "hgx-h100-80g", 2, 32, 8192,
         dict(dp=1, tp=8, pp=2, zero=0, micro_batch=1, sequence_parallel=True,
              schedule="1f1b", checkpoint="full"), layers=8, quick=True),
    Case("70b-pp2-zero3", "llama3-70b", "hgx-h100-80g", 4, 32, 8192,
         dict(dp=2, tp=8, pp=2, zero=3, micro_batch=1, sequence_parallel=True,
              schedule="1f1b", checkpoint="full"), layers=8),
    Case("70b-pp2-gpipe-sel", "llama3-70b", "hgx-h100-80g", 2, 8, 4096,
         dict(dp=1, tp=8, pp=2, zero=0, micro_batch=1, sequence_parallel=True,
              schedule="gpipe", checkpoint="selective"), layers=4),
    Case("405b-pp4-interleaved", "llama3-405b", "hgx-h100-80g", 8, 32, 8192,
         dict(dp=2, tp=8, pp=4, zero=1, micro_batch=1, sequence_parallel=True,
              schedule="interleaved", virtual_stages=2, checkpoint="full"), layers=16,
         quick=True),
    # one chunk per rank under the interleaved schedule (torch's warm-up: 2(pp-1-r)+1 in
    # flight), against its 1F1B twin (pp-r): issue 32's llama3-405b plan missed its first
    # stage by -13.4 % this way (bench/results/memory_grid.md, 2026-11-28)
    Case("405b-pp4-cp2-interleaved-v1", "llama3-405b", "hgx-h100-80g", 8, 32, 8192,
         dict(dp=1, tp=8, pp=4, cp=2, zero=1, micro_batch=1, sequence_parallel=True,
              schedule="interleaved", virtual_stages=1, checkpoint="selective"), layers=8),
    # 8 stages of 2 blocks, cp 4, tp 8 + SP, the interleaved schedule with one chunk a rank:
    # 13 micro-batches in flight on pp1, each holding its stage output (torch's schedule) and
    # its attention outputs' concatenation (cp), as llama3-405b's plan on 16384 GPUs does
    Case("405b-pp8-cp4-tp8-in-flight", "llama3-405b", "hgx-h100-80g", 32, 16, 8192,
         dict(dp=1, tp=8, pp=8, cp=4, zero=1, micro_batch=1, sequence_parallel=True,
              schedule="interleaved", checkpoint="selective"), layers=16),
    Case("405b-pp4-cp2-1f1b", "llama3-405b", "hgx-h100-80g", 8, 32, 8192,
         dict(dp=1, tp=8, pp=4, cp=2, zero=1, micro_batch=1, sequence_parallel=True,
              schedule="1f1b", checkpoint="selective"), layers=8),
    # two chunks more than blocks: the embedding alone first, the loss alone last
    Case("70b-pp2-ends-as-chunks", "llama3-70b", "hgx-h100-80g", 2, 16, 4096,
         dict(dp=1, tp=8, pp=2, zero=0, micro_batch=1, sequence_parallel=True,
              schedule="interleaved", virtual_stages=3, checkpoint="selective"), layers=4),
    Case("405b-pp4-zero3", "llama3-405b", "hgx-h100-80g", 8, 32, 8192,
         dict(dp=2, tp=8, pp=4, zero=3, micro_batch=1, sequence_parallel=True,
              schedule="1f1b", checkpoint="full"), layers=8),
    Case("175b-tp8-pp2", "gpt-175b", "dgx-a100-80g", 2, 16, 2048,
         dict(dp=1, tp=8, pp=2, zero=0, micro_batch=1, sequence_parallel=True,
              schedule="1f1b", checkpoint="selective"), layers=4),
    Case("gpt-1.7b-fsdp", "gpt-1.7b", "hgx-h100-80g", 1, 16, 2048,
         dict(dp=8, zero=3, micro_batch=1), layers=2),
    Case("8b-fused", "llama3-8b", "hgx-h100-80g", 1, 16, 8192,
         dict(dp=8, zero=3, micro_batch=1,
              fusions=("rms_norm", "swiglu", "rope", "linear_cross_entropy")), layers=4),
    # context parallelism: the gathered K/V, the query chunks' lower-right causal attention
    Case("8b-cp2", "llama3-8b", "hgx-h100-80g", 1, 8, 32768,
         dict(dp=4, cp=2, zero=3, micro_batch=1), layers=4, overrides=dict(seq_len=32768)),
    Case("8b-cp4-tp2-sp", "llama3-8b", "hgx-h100-80g", 1, 4, 65536,
         dict(dp=1, cp=4, tp=2, zero=1, micro_batch=1, sequence_parallel=True,
              checkpoint="selective"), layers=4, overrides=dict(seq_len=65536)),
    Case("8b-cp8-full", "llama3-8b", "hgx-h100-80g", 1, 4, 131072,
         dict(dp=1, cp=8, zero=3, micro_batch=1, checkpoint="full"), layers=4,
         overrides=dict(seq_len=131072)),
    Case("70b-cp4-pp2", "llama3-70b", "hgx-h100-80g", 8, 8, 32768,
         dict(dp=2, cp=4, tp=4, pp=2, zero=1, micro_batch=1, sequence_parallel=True,
              schedule="1f1b", checkpoint="selective"), layers=8, overrides=dict(seq_len=32768)),
    # mixtures of experts (issue 30): Qwen3-style 128 x top-8, the experts' mesh folded over
    # tp, DeepSeek-style shared experts and dense first layers with MLA, Mixtral-style 8 x top-2
    # with a capacity, pipelining, the moe checkpoint policy
    # one expert a rank (Mixtral at ep 8) over 2 expert-dp ranks: FSDP2 shards each expert
    # along its hidden dim (passes/data_parallel.py:expert_dp_placement)
    Case("mixtral-ep8-edp2-zero2", "mixtral-8x7b", "hgx-h100-80g", 2, 16, 4096,
         dict(dp=16, ep=8, zero=2, micro_batch=1), layers=2),
    Case("qwen3-30b-ep8", "qwen3-30b-a3b", "hgx-h100-80g", 1, 16, 4096,
         dict(dp=8, ep=8, zero=1, micro_batch=1), layers=4),
    Case("qwen3-30b-fold-tp2-ep8", "qwen3-30b-a3b", "hgx-h100-80g", 1, 16, 4096,
         dict(dp=4, tp=2, ep=8, zero=1, micro_batch=1, sequence_parallel=True), layers=4),
    Case("qwen3-30b-ep8-moe-ckpt", "qwen3-30b-a3b", "hgx-h100-80g", 1, 16, 4096,
         dict(dp=8, ep=8, zero=1, micro_batch=1, checkpoint="moe"), layers=4),
    # the moe policy under tp + SP keeps the column-parallel inputs as shards (regathered)
    Case("qwen3-30b-fold-tp2-ep8-moe-ckpt", "qwen3-30b-a3b", "hgx-h100-80g", 1, 16, 4096,
         dict(dp=4, tp=2, ep=8, zero=1, micro_batch=1, sequence_parallel=True,
              checkpoint="moe"), layers=4),
    Case("dsv3-pp2-ep8", "deepseek-v3", "hgx-h100-80g", 2, 16, 4096,
         dict(dp=8, pp=2, ep=8, zero=1, micro_batch=1), layers=5),
    # the interleaved schedule with the dense layers and the embedding in the first rank's first
    # chunk, which holds more micro-batches than its second (costmodel/schedule_slots.py:
    # weighted_in_flight)
    Case("dsv3-pp2-v2-ep8", "deepseek-v3", "hgx-h100-80g", 2, 64, 4096,
         dict(dp=8, pp=2, ep=8, zero=1, micro_batch=1, schedule="interleaved",
              virtual_stages=2), layers=7),
    # the dense first layers split over tp as the blocks' attention and MLP, on the whole
    # sequence under SP (GraphIR.outer_layers)
    Case("dsv3-tp2-sp-ep8", "deepseek-v3", "hgx-h100-80g", 2, 16, 4096,
         dict(dp=4, tp=2, pp=2, ep=8, zero=1, micro_batch=1, sequence_parallel=True),
         layers=5),
    Case("mixtral-ep8-etp2-zero1", "mixtral-8x7b", "hgx-h100-80g", 2, 32, 4096,
         dict(dp=8, tp=2, ep=8, etp=2, zero=1, micro_batch=1, sequence_parallel=True),
         layers=2),
    Case("mixtral-ep2-zero3", "mixtral-8x7b", "hgx-h100-80g", 1, 16, 4096,
         dict(dp=8, ep=2, zero=3, micro_batch=1), layers=2),
    # FP8 linears (torchao): the weights all-gathered in FP8 under ZeRO-3 (tensorwise), and
    # rowwise under tp + SP
    Case("8b-fp8-zero3", "llama3-8b", "hgx-h100-80g", 1, 16, 8192,
         dict(dp=8, zero=3, micro_batch=1), layers=4, precision="fp8"),
    Case("8b-fp8-rowwise-tp2-sp", "llama3-8b", "hgx-h100-80g", 1, 16, 8192,
         dict(dp=4, tp=2, zero=1, micro_batch=1, sequence_parallel=True), layers=4,
         precision="fp8", fp8_recipe="rowwise"),
    # under pipelining the gathered copies stay whole through the micro-batches: FP8 ones
    Case("70b-fp8-tp2-pp2-zero1", "llama3-70b", "hgx-h100-80g", 2, 16, 4096,
         dict(dp=4, tp=2, pp=2, zero=1, micro_batch=1, sequence_parallel=True), layers=4,
         precision="fp8"),
    Case("70b-fp8-pp2-zero3-full", "llama3-70b", "hgx-h100-80g", 2, 16, 4096,
         dict(dp=8, pp=2, zero=3, micro_batch=1, checkpoint="full"), layers=4,
         precision="fp8"),
]


def plan_of(case: Case):
    spec = ModelSpec.zoo(case.model)
    overrides = dict(case.overrides)
    if case.layers is not None:
        overrides["num_layers"] = case.layers
    if overrides:
        spec = dataclasses.replace(spec, overrides=overrides)
    train = TrainSpec(global_batch=case.global_batch, seq_len=case.seq_len,
                      precision=case.precision, fp8_recipe=case.fp8_recipe)
    cluster = autopar.ClusterSpec.preset(case.cluster, nodes=case.nodes)
    config = ParallelConfig(**case.config)
    return autopar.plan_for(spec.build("meta"), cluster, train, config, model_spec=spec)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="only the cases marked quick")
    p.add_argument("--only", action="append", default=[], help="run the named case(s)")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    cases = [c for c in GRID if (not args.quick or c.quick) and (not args.only or c.name in args.only)]
    gib = 2**30
    rows = []
    worst = 0.0
    for case in cases:
        began = time.perf_counter()
        plan = plan_of(case)
        run = autopar.dry_run(plan)
        for role in run.roles:
            err = role.error or 0.0
            worst = max(worst, abs(err))
            rows.append((case.name, plan.summary(), role, err, time.perf_counter() - began))
            pred = role.predicted.breakdown if role.predicted else {}
            print(f"{case.name:22} pp{role.pp_rank} predicted {role.predicted_bytes / gib:7.2f} GiB"
                  f"  dry run {role.peak_bytes / gib:7.2f} GiB  error {err:+6.1%}", flush=True)
            print("    predicted", {k: round(v / gib, 2) for k, v in pred.items()})
            print("    dry run  ", {k: round(v / gib, 2) for k, v in role.peak_breakdown.items()})
    if args.markdown:
        print("\n| case | plan | role | predicted GiB | dry run GiB | error | dry run s |")
        print("|---|---|---|---|---|---|---|")
        for name, summary, role, err, secs in rows:
            print(f"| {name} | {summary} | pp{role.pp_rank} | {role.predicted_bytes / gib:.2f} | "
                  f"{role.peak_bytes / gib:.2f} | {err:+.1%} | {role.seconds:.1f} |")
    print(f"\nworst |error|: {worst:.1%} over {len(rows)} rank roles")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
