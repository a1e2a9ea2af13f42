"""The matmuls checkpoint policy over torchao's eager float8 linears, on a GPU: a SwiGLU-less MLP
(2048 -> 8192 -> 2048, 8192 tokens) in bf16 and fp8 under no checkpointing, full, and selective
checkpointing that saves ``aten.mm``'s outputs (``passes/checkpointing.py``'s matmuls policy),
forward+backward milliseconds, and the GPU kernels of none and matmuls in fp8 (torch.profiler).
On a CPU machine it prints which ops the policy sees (``aten.mm`` on torchao's subclass: the
policy saves the GEMM's output, not its FP8 operands). Results: bench/results/fp8_linear.md.

    python bench/fp8_checkpoint.py
"""
import torch, functools
from torch import nn
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts, CheckpointPolicy
from torchao.float8 import convert_to_float8_training, Float8LinearConfig
aten=torch.ops.aten
seen=set()
def pol(ctx, op, *a, **k):
    seen.add(str(op))
    return CheckpointPolicy.MUST_SAVE if op in (aten.mm.default, aten.addmm.default) else CheckpointPolicy.PREFER_RECOMPUTE
def t(fn,n=10):
    for _ in range(3): fn()
    torch.cuda.synchronize(); s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e)/n
dev="cuda" if torch.cuda.is_available() else "cpu"
M=8192 if dev=="cuda" else 64
for fp8 in (False, True):
    m=nn.Sequential(nn.Linear(2048,8192,bias=False),nn.SiLU(),nn.Linear(8192,2048,bias=False)).to(dev).bfloat16()
    if fp8: m=convert_to_float8_training(m, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    x=torch.randn(M,2048,device=dev,dtype=torch.bfloat16,requires_grad=True)
    runs={"none":lambda: m(x).sum().backward(),
          "full":lambda: checkpoint(m,x,use_reentrant=False).sum().backward(),
          "matmuls":lambda: checkpoint(m,x,use_reentrant=False,context_fn=functools.partial(create_selective_checkpoint_contexts,pol)).sum().backward()}
    if dev=="cpu":
        for k,f in runs.items(): f()
        print(fp8, sorted(seen)); continue
    print("fp8" if fp8 else "bf16", {k: round(t(f),3) for k,f in runs.items()}, "ms")
    if fp8:
        from torch.profiler import profile, ProfilerActivity
        for name in ("none","matmuls"):
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                runs[name](); torch.cuda.synchronize()
            print(name); print(p.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
print(sorted(seen))
