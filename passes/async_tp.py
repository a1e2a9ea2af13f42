"""Asynchronous tensor parallelism: the plan's ``"async_tp"`` fusion (``core.specs.ASYNC_TP``).

Under sequence parallelism every column-split GEMM of a block is fed by an all-gather of the
sequence shards and every row-split GEMM drains into a reduce-scatter. PyTorch's
micro-pipeline TP decomposes each pair into the tp - 1 point-to-point transfers over the tp
group's symmetric memory and runs the GEMM on each chunk as it arrives
(``torch.ops.symm_mem.fused_all_gather_matmul`` / ``fused_matmul_reduce_scatter``): an inductor
pass (``torch._inductor.config._micro_pipeline_tp``) rewrites the compiled block's graph into
them. torchtitan's ``enable_async_tensor_parallel`` is the same three steps done here:

1. the tp group gets symmetric memory (``enable_symm_mem_for_group``),
2. inductor's micro-pipeline TP pass is turned on,
3. every block of the stage is compiled in place (``nn.Module.compile``: the parameter names,
   and so checkpoints, do not change), after the tensor-parallel styles and before FSDP2, as
   torchtitan orders them. Activation checkpointing stays the stage's (``passes/checkpointing``
   wraps the compiled block's call).

Symmetric memory needs CUDA GPUs that reach each other's memory (NVLink); elsewhere -- the CPU
ranks of ``autopar verify`` and the dry run -- the blocks run eagerly, the same math without
the overlap, and ``apply_async_tp`` says so by returning 0. The cost model prices the overlap
(``costmodel/step.py:tp_comm_s``). Not yet run on a GPU by this project (no GPU was lent when
it was written): the GPU path is torchtitan's, unmeasured here.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from autopar.core.plan import Plan
from autopar.core.specs import ASYNC_TP


def runs_async_tp(device: torch.device) -> bool:
    """Whether the overlap runs on ``device``: CUDA with symmetric memory."""
    if device.type != "cuda":
        return False
    import importlib.util

    return importlib.util.find_spec("torch.distributed._symmetric_memory") is not None


def apply_async_tp(blocks: list[nn.Module], plan: Plan, tp_mesh: DeviceMesh,
                   device: torch.device) -> int:
    """Compile ``blocks`` (a stage's, tensor-parallel already) with micro-pipeline TP on the
    tp group where the plan asks for ``async_tp`` and ``device`` runs it; returns how many
    were compiled (0: the blocks run eagerly, without the overlap)."""
    if ASYNC_TP not in plan.config.fusions or plan.config.tp == 1 or not runs_async_tp(device):
        return 0
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    inductor_config._micro_pipeline_tp = True
    for block in blocks:
        block.compile()
    return len(blocks)
