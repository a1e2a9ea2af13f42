"""One linear layer's forward+backward on a GPU in bf16 and in torchao's float8 (eager and under
torch.compile): what FP8 costs and saves per GEMM, the figures ``costmodel/compute.py:fp8_cast_s``
prices. Prints a markdown table; needs CUDA and torchao.

    python bench/fp8_linear.py [--tokens 8192]

Times are ``triton.testing.do_bench``'s medians, as ``bench/fused_kernels.py`` takes them.
"""

from __future__ import annotations

import argparse
import copy
import sys

import torch
from torch import nn

SHAPES = ((2048, 2048), (2048, 512), (2048, 8192), (8192, 2048), (4096, 4096), (8192, 28672))
"""(in, out) features: the 1B Llama's of ``bench/gpu_step.py`` (q/o, k/v, up/gate, down), and
two of a 70B-class model. About 45 s on an H200 with the compiles (``bench/gpu_check.py``'s
part 2 runs it)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/fp8_linear.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from triton.testing import do_bench

    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{args.tokens} tokens\n")
    print("| in x out | bf16 ms | fp8 eager ms | fp8 compiled ms | bf16 compiled ms | "
          "eager/bf16 | compiled/bf16 | rowwise eager ms | GEMM TFLOP/s bf16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fin, fout in SHAPES:
        x = torch.randn(args.tokens, fin, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        base = nn.Sequential(nn.Linear(fin, fout, bias=False)).cuda().bfloat16()
        variants = {"bf16": base}
        for recipe in ("tensorwise", "rowwise"):
            variants[recipe] = convert_to_float8_training(
                copy.deepcopy(base), config=Float8LinearConfig.from_recipe_name(recipe))
        row = {}
        for name, module in variants.items():
            def step(module=module):
                module(x).sum().backward()
            row[name] = do_bench(step, return_mode="median") / 1e3
        for name in ("bf16", "tensorwise"):
            torch._dynamo.reset()  # each shape compiled afresh: no recompile limit reached
            compiled = torch.compile(variants[name])
            def cstep(module=compiled):
                module(x).sum().backward()
            try:
                row[name + "_c"] = do_bench(cstep, return_mode="median") / 1e3
            except Exception as err:  # noqa: BLE001 - a result, printed
                print(f"compile {name} {fin}x{fout}: {type(err).__name__}: {err}"[:300])
                row[name + "_c"] = float("nan")
        tflops = 6 * args.tokens * fin * fout / row["bf16"] / 1e12
        print(f"| {fin}x{fout} | {row['bf16']*1e3:.3f} | {row['tensorwise']*1e3:.3f} | "
              f"{row['tensorwise_c']*1e3:.3f} | {row['bf16_c']*1e3:.3f} | "
              f"{row['tensorwise']/row['bf16']:.2f} | {row['tensorwise_c']/row['bf16']:.2f} | "
              f"{row['rowwise']*1e3:.3f} | {tflops:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
