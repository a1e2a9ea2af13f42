"""The ranks of training scripts that take autopar's DeepSpeed exports as their README says:
``deepspeed.initialize(model=model, config="ds_config.json", model_parameters=...)`` on gloo,
then one optimizer step of ``gradient_accumulation_steps`` micro-batches, and what the engine
derived from the config written to ``OUT/CASE/readback-RANK.json`` (a failure's traceback to
``OUT/CASE/error-RANK.txt``, and the rank exits: torchrun stops the others, which may wait on
it). Every case runs in the same processes, one after the other, each with its own model
(``test_deepspeed_initialize.py``).

    torchrun --nproc-per-node N deepspeed_worker.py OUT SEQ_LEN CASE=CONFIG:MODEL ...
"""

from __future__ import annotations

import json
import math
import os
import sys
import traceback
from pathlib import Path

import torch


HF_LLAMA = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 64}
"""A tiny transformers Llama: DeepSpeed's AutoTP finds the layers to split in transformers'
models (the zoo's it refuses: "Not able to determine model policy automatically")."""


def hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**HF_LLAMA))


class _Layer(torch.nn.Module):
    """A piece of the decoder as one pipeline layer, run as its family's ``ModelParts`` says
    (``run(root, x)``); the whole model is held outside the module tree, so a stage holds its
    own pieces' parameters only."""

    def __init__(self, root: torch.nn.Module, pieces: list[torch.nn.Module], run) -> None:
        super().__init__()
        self.pieces = torch.nn.ModuleList(pieces)
        self.root, self.run = [root], run

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(self.root[0], x)


class _Block(_Layer):
    """A decoder block: the layers ``checkpointable_layers`` names."""


def pipeline_module(model: torch.nn.Module, stages: int):
    """The decoder as the export's README says to build it: a ``PipelineModule`` of its
    embedding, blocks and head (``family_of(model).parts_of``), the blocks' class its
    ``checkpointable_layers`` (the recompute interval is the config's, which DeepSpeed's
    pipeline engine sets on the module)."""
    from deepspeed.pipe import PipelineModule

    from autopar.models.family import family_of
    from autopar.models.training import loss_of

    parts = family_of(model).parts_of(model)
    blocks = model.get_submodule(parts.blocks)
    layers = [
        _Layer(model, [model.get_submodule(n) for n in parts.first], parts.embed),
        *(_Block(model, [b], lambda root, x, b=b: b(x, *parts.block_args(root, x, x.size(1))))
          for b in blocks),
        _Layer(model, [model.get_submodule(n) for n in parts.last], parts.finish)]
    return PipelineModule(layers=layers, num_stages=stages, partition_method="uniform",
                          loss_fn=lambda logits, targets: loss_of(logits.float(), targets),
                          checkpointable_layers=["_Block"])


def run_case(config: str, model_name: str, seq_len: int) -> dict:
    """One script's run of ``config`` on ``model_name`` (``NAME@ppN``: as a ``PipelineModule``
    of N stages): what the engine derived."""
    import deepspeed

    import autopar
    from autopar.models.training import loss_of

    raw = json.loads(Path(config).read_text())
    model_name, _, stages = model_name.partition("@pp")
    model = hf_llama() if model_name == "hf-llama" else autopar.models.build(model_name,
                                                                           device="cpu")
    vocab = model.config.vocab_size
    module = pipeline_module(model, int(stages)) if stages else model
    engine, optimizer, _, _ = deepspeed.initialize(
        model=module, config=config, model_parameters=list(module.parameters()))
    # a tensor-parallel group's ranks read the same micro-batches (the export's README)
    tp = raw.get("tensor_parallel", {}).get("autotp_size", 1)
    g = torch.Generator().manual_seed(engine.global_rank // tp if not stages else 0)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(vocab, (engine.train_micro_batch_size_per_gpu(), seq_len + 1),
                               generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    losses = []
    if stages:  # the pipeline engine runs the step's micro-batches itself
        losses.append(float(engine.train_batch(iter(batch, None))))
    for _ in range(0 if stages else engine.gradient_accumulation_steps()):
        inputs, targets = batch()
        logits = engine(inputs)
        logits = logits if isinstance(logits, torch.Tensor) else logits.logits
        loss = loss_of(logits.float(), targets)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    inner = getattr(optimizer, "optimizer", optimizer)
    q = next(w for n, w in engine.module.named_parameters() if n.endswith("q_proj.weight"))
    return {
        "rank": engine.global_rank, "zero": engine.zero_optimization_stage(),
        "train_batch_size": engine.train_batch_size(),
        "micro_batch": engine.train_micro_batch_size_per_gpu(),
        "accumulation": engine.gradient_accumulation_steps(),
        "bf16": engine.bfloat16_enabled(), "fp16": engine.fp16_enabled(),
        "reduce_dtype": str(engine.communication_data_type).removeprefix("torch."),
        "dp": engine.dp_world_size, "optimizer": type(inner).__name__,
        "offload": engine.zero_cpu_offload(), "steps": engine.global_steps,
        "losses_finite": all(math.isfinite(x) for x in losses),
        "param_dtype": str(next(engine.module.parameters()).dtype).removeprefix("torch."),
        "q_proj_rows": q.shape[0], "stages": getattr(engine, "num_stages", 1),
        "checkpoint_interval": getattr(engine.module, "activation_checkpoint_interval", None)}


def main(out: Path, seq_len: int, cases: list[str]) -> None:
    import deepspeed
    import deepspeed.ops
    import torch.distributed as dist

    # The one stand-in for the plan's GPUs: DeepSpeed's CPU accelerator would compile its
    # shared-memory collectives (about 70 s, a CPU-only path); on GPUs it runs NCCL's
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    for case in cases:
        name, _, rest = case.partition("=")
        config, _, model_name = rest.rpartition(":")
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        try:
            got = run_case(config, model_name, seq_len)
            (folder / f"readback-{rank}.json").write_text(json.dumps(got))
        except Exception:  # noqa: BLE001 -- the test reports it
            (folder / f"error-{rank}.txt").write_text(traceback.format_exc())
            os._exit(1)  # the other ranks may wait on this one: torchrun stops them all
        dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:])
