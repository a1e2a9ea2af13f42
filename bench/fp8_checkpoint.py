"""The engine's matmuls checkpoint policy over torchao's eager float8 linears, on a GPU: an MLP
(2048 -> 8192 -> 2048, 8192 tokens) in bf16 and fp8 under no checkpointing, full, and the
matmuls policy (``passes/checkpointing.py:matmuls_context``, which saves ``aten.mm``'s outputs:
on torchao's subclass the GEMM's output, not its FP8 operands), forward+backward milliseconds
(``triton.testing.do_bench``'s median, as ``bench/fused_kernels.py``); ``--profile`` adds the GPU
kernels of none and matmuls in fp8 (torch.profiler). Results: bench/results/fp8_linear.md.

    python bench/fp8_checkpoint.py [--profile]
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from autopar.passes.checkpointing import matmuls_context

TOKENS, HIDDEN, FFN = 8192, 2048, 8192


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/fp8_checkpoint.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from triton.testing import do_bench

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {TOKENS} tokens\n")
    print("| precision | none ms | full ms | matmuls ms |\n|---|---|---|---|")
    for precision in ("bf16", "fp8"):
        mlp = nn.Sequential(nn.Linear(HIDDEN, FFN, bias=False), nn.SiLU(),
                            nn.Linear(FFN, HIDDEN, bias=False)).cuda().bfloat16()
        if precision == "fp8":
            mlp = convert_to_float8_training(
                mlp, config=Float8LinearConfig.from_recipe_name("tensorwise"))
        x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        runs = {"none": lambda: mlp(x).sum().backward(),
                "full": lambda: checkpoint(mlp, x, use_reentrant=False).sum().backward(),
                "matmuls": lambda: checkpoint(mlp, x, use_reentrant=False,
                                              context_fn=matmuls_context).sum().backward()}
        ms = {name: do_bench(run, return_mode="median") for name, run in runs.items()}
        print(f"| {precision} | {ms['none']:.3f} | {ms['full']:.3f} | {ms['matmuls']:.3f} |",
              flush=True)
        if args.profile and precision == "fp8":
            from torch.profiler import ProfilerActivity, profile

            for name in ("none", "matmuls"):
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    runs[name]()
                    torch.cuda.synchronize()
                print(f"\n{name}:\n" + prof.key_averages().table(
                    sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
