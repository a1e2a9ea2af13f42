"""One rank of a training script that takes an autopar DeepSpeed export as its README says:
``deepspeed.initialize(model=model, config="ds_config.json", model_parameters=...)`` on gloo,
then one optimizer step of ``gradient_accumulation_steps`` micro-batches, and what the engine
derived from the config written to ``OUT/readback-RANK.json`` (``test_deepspeed_initialize.py``).

    torchrun --nproc-per-node N deepspeed_worker.py CONFIG MODEL SEQ_LEN OUT
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


HF_LLAMA = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "max_position_embeddings": 64}
"""A tiny transformers Llama: DeepSpeed's AutoTP finds the layers to split in transformers'
models (the zoo's it refuses: "Not able to determine model policy automatically")."""


def hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**HF_LLAMA))


def main(config: str, model_name: str, seq_len: int, out: Path) -> None:
    import deepspeed
    import deepspeed.ops

    import autopar

    # The one stand-in for the plan's GPUs: DeepSpeed's CPU accelerator would compile its
    # shared-memory collectives (about 70 s, a CPU-only path); on GPUs it runs NCCL's
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    model = hf_llama() if model_name == "hf-llama" else autopar.models.build(model_name,
                                                                           device="cpu")
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config,
                                                   model_parameters=model.parameters())
    # a tensor-parallel group's ranks read the same micro-batches (the export's README)
    tp = json.loads(Path(config).read_text()).get("tensor_parallel", {}).get("autotp_size", 1)
    g = torch.Generator().manual_seed(engine.global_rank // tp)
    vocab = model.config.vocab_size
    losses = []
    for _ in range(engine.gradient_accumulation_steps()):
        tokens = torch.randint(vocab, (engine.train_micro_batch_size_per_gpu(), seq_len + 1),
                               generator=g)
        logits = engine(tokens[:, :-1])
        logits = logits if isinstance(logits, torch.Tensor) else logits.logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    inner = getattr(optimizer, "optimizer", optimizer)
    q = next(w for n, w in engine.module.named_parameters() if n.endswith("q_proj.weight"))
    (out / f"readback-{engine.global_rank}.json").write_text(json.dumps({
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
        "q_proj_rows": q.shape[0]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
