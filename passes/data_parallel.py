"""Data parallelism by ZeRO stage, and mixed precision, on FSDP2 ``fully_shard``.

Every block is one FSDP unit, then the stage root (torchtitan's wrapping). What the engine runs
for each ZeRO stage (``autopar.report.execution.ENGINE_ZERO`` says it in the plan's report):

Under context parallelism the cp ranks join the dp ranks in every one of these (they hold the
same weights, other tokens of the sequences): ``passes/mesh.py:data_parallel_mesh``.

* ZeRO-0: ``fully_shard`` over (``dp_replicate`` = dp, ``dp_shard`` = 1), i.e. FSDP2's hybrid
  mode with shard groups of one -- parameters, gradients and optimizer states replicated,
  gradients all-reduced (averaged) once per step, on the last micro-batch: DDP.
* ZeRO-1: ``fully_shard(reshard_after_forward=False)`` over ``dp_shard``; parameters are
  gathered once per step (first micro-batch), kept through every micro-batch, gradients
  accumulate unsharded and are reduce-scattered once, on the last micro-batch; fp32 master
  weights and optimizer states stay sharded.
* ZeRO-2: the same, but gradients are reduce-scattered after every micro-batch's backward, so
  only sharded gradients accumulate.
* ZeRO-3: ``fully_shard`` (``reshard_after_forward=True``): each block's parameters are
  gathered before its forward and again before its backward, and freed after each.

One departure from the papers: at rest (between steps) the engine keeps the parameters sharded
for ZeRO-1/2 as well; ZeRO-1/2 hold them whole. The memory during the step, and the traffic, are
the papers' (and the cost model's; ``costmodel/dp_comm.py:dp_comm_s``).

Under pipelining, ``torch.distributed.pipelining`` drives the micro-batches itself: for every
ZeRO stage it turns gradient sync and resharding off until the last micro-batch, so gradients
are reduced once per step (ZeRO-1's traffic).

Mixed precision (``TrainSpec.precision``): ``bf16``/``fp16`` use ``MixedPrecisionPolicy`` --
fp32 master weights sharded or replicated as above, compute in the low precision, gradients
accumulated and reduced in ``TrainSpec.grad_dtype`` (fp32 by default; bf16 halves the
accumulators and the traffic), the reduced shards cast back to fp32 (``fp8`` too: its FP8
GEMMs are the float8 linears', ``passes/float8.py``);
``bf16-pure`` casts the model to bf16 (no fp32 copy); ``fp32`` runs as is.
fp16 plans also run with dynamic loss scaling (``passes/loss_scaling.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from autopar.core.specs import GradDtype, Precision, TrainSpec
from autopar.core.plan import Plan
from autopar.passes.mesh import data_parallel_mesh
from autopar.passes.tensor_parallel import is_sectioned

COMPUTE_DTYPE = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16,
                 Precision.FP8: torch.bfloat16}
"""The compute dtype of the mixed-precision policies (fp32 master weights); the one-process
reference of ``autopar verify`` computes in it too."""


REDUCE_DTYPE = {GradDtype.FP32: torch.float32, GradDtype.BF16: torch.bfloat16,
                GradDtype.FP16: torch.float16}
"""FSDP2's ``reduce_dtype`` for each ``TrainSpec.grad_dtype``."""


def mixed_precision(train: TrainSpec) -> MixedPrecisionPolicy | None:
    """FSDP2's policy for ``train``'s precision: compute in its low dtype on fp32 master
    weights, gradients accumulated and reduced in ``train.grad_dtype``; None where there is
    no mixed precision."""
    low = COMPUTE_DTYPE.get(train.precision)
    if low is None:
        return None
    return MixedPrecisionPolicy(param_dtype=low, reduce_dtype=REDUCE_DTYPE[train.grad_dtype])


def offload_policy(offload: bool) -> OffloadPolicy:
    """FSDP2's CPU offload for ``offload`` plans: the sharded parameters, their gradients and
    the optimizer step on the CPU. Host memory is pinned (page-locked, for asynchronous copies)
    only where there is an accelerator to copy to: pinning needs one, and on a CPU-only machine
    the "offloaded" tensors are already where they run."""
    if not offload:
        return OffloadPolicy()
    return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())


def wants_fsdp(plan: Plan) -> bool:
    return (plan.config.dp * plan.config.cp > 1 or plan.config.offload
            or plan.train.precision in COMPUTE_DTYPE)


def dp_placement(param: nn.Parameter) -> Shard | None:
    """FSDP2's shard of ``param`` along dp: dim 1 for a fused projection's weight whose sections
    are each split over the tp ranks along dim 0 (``passes/tensor_parallel.
    SectionedColwiseParallel``), so that the two placements are on different dims and DTensor
    reads the pair back right (its ``full_tensor``, a checkpoint); FSDP2's default (dim 0)
    for every other parameter."""
    return Shard(1) if param.ndim == 2 and is_sectioned(param) else None


def expert_dp_placement(edp: int) -> Callable[[nn.Parameter], Shard | None]:
    """FSDP2's shard of an expert's parameter over the ``edp`` expert data-parallel ranks: dim 0
    (``dp_placement``) where the rank's experts divide evenly among them, else the first dim
    that does. After ep a rank holds ``E / ep`` experts along dim 0 of the stacked weights --
    one for Mixtral-8x7B at ep 8 -- which FSDP2 would cut into ``edp`` uneven parts: the
    first edp rank holding every expert whole (weights, gradients, optimizer states), the
    others none (Mixtral-8x7B at dp 64, ep 8, ZeRO-2: 223 GiB on that rank where the plan
    priced 74, each expert's states divided by edp)."""
    def place(param: nn.Parameter) -> Shard | None:
        local = param.to_local() if isinstance(param, DTensor) else param
        if local.ndim == 0 or local.size(0) % edp == 0:
            return dp_placement(param)
        return next((Shard(d) for d in range(1, local.ndim) if local.size(d) % edp == 0),
                    dp_placement(param))
    return place


def apply_data_parallel(stage: nn.Module, blocks: Iterable[nn.Module], plan: Plan,
                        mesh: DeviceMesh, experts: Iterable[nn.Module] = (),
                        expert_dp_mesh: DeviceMesh | None = None) -> None:
    """Wrap ``blocks`` and then ``stage`` with ``fully_shard`` as the plan's ZeRO stage says.

    Runs after tensor parallelism (FSDP2 then shards the tp DTensors along dp, a 2-D layout)
    and after the pipeline split (each stage is its own FSDP root). Under expert parallelism
    each of ``experts`` is its own unit over the expert data-parallel ranks
    (``expert_dp_mesh``, ``passes/expert_parallel.py``), wrapped first -- and alone where
    those are the only ranks holding the same weights (the fold with dp x cp = 1)."""
    c = plan.config
    experts_only = (not wants_fsdp(plan) and expert_dp_mesh is not None
                    and expert_dp_mesh.size() > 1)
    if not (wants_fsdp(plan) or experts_only):
        return
    policy = mixed_precision(plan.train) or MixedPrecisionPolicy()
    kwargs = dict(mesh=data_parallel_mesh(mesh, c.zero), reshard_after_forward=c.zero == 3,
                  mp_policy=policy, offload_policy=offload_policy(c.offload),
                  shard_placement_fn=dp_placement,
                  ignored_params=_zero_size(stage, policy.param_dtype))
    for module in experts:
        fully_shard(module, **{**kwargs, "mesh": expert_dp_mesh,
                               "shard_placement_fn": expert_dp_placement(expert_dp_mesh.size())})
    if experts_only:
        # one dense replica (dp x cp = 1) whose tp ranks hold the same experts under the fold
        # (ep < tp): only the experts' gradients reduce, over those ranks
        return
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(stage, **kwargs)


def _zero_size(stage: nn.Module, compute_dtype: torch.dtype | None) -> set[nn.Parameter]:
    """The stage's parameters of no elements (Qwen2-MoE's shared expert of intermediate size 0),
    which FSDP2 is told to leave alone: it cannot reduce-scatter an empty gradient
    (``_chunk_cat expects non-empty tensor``). With nothing in them to shard or reduce, they
    stay plain on every rank, in the compute dtype the others are gathered in (an empty
    weight still meets its input's dtype in a matmul)."""
    empty = {p for p in stage.parameters() if p.numel() == 0}
    for p in empty:
        if compute_dtype is not None and p.is_floating_point():
            p.data = p.data.to(compute_dtype)
    return empty


def set_microbatch(modules: Iterable[nn.Module], zero: int, last: bool) -> None:
    """Before a micro-batch's forward when the caller accumulates micro-batches itself (no
    pipelining): gradients are reduced on the last micro-batch only (ZeRO 0 and 1) or on every
    one (2 and 3), and ZeRO 0-2 keep the parameters gathered until the last backward."""
    for m in modules:
        if isinstance(m, FSDPModule):
            m.set_requires_gradient_sync(last or zero >= 2)
            m.set_reshard_after_backward(last or zero == 3)
