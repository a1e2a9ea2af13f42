"""FP8 training of the chosen linear layers, on torchao's float8 training (``precision="fp8"``).

``apply_float8`` swaps each chosen ``nn.Linear`` for torchao's ``Float8Linear``
(``convert_to_float8_training``): its forward casts the input and the weight to FP8 e4m3 with a
dynamic scale (one per tensor, or per row under ``rowwise``), multiplies them with
``torch._scaled_mm`` accumulating in fp32, and its backward casts the output gradient (e5m2
under ``tensorwise``) for the two gradient GEMMs. It saves the high-precision input and weight
for the backward, as a bf16 linear does, so the activations kept are unchanged; the FP8 copies
are transient. Everything else runs as under ``bf16`` (``passes/data_parallel.py``'s
``MixedPrecisionPolicy``: bf16 compute, fp32 master weights, gradients reduced in fp32).

Which linears: ``autopar.core.fp8``'s rule (the blocks' linears with dims multiples of 16,
routers excepted), the one the workload marks for the cost model (``OpCost.fp8``). torchao's own
auto-filter also drops GEMMs it measured slower in FP8 on an H100 (below about 2048 x 1024);
here that is the cost model's call, and the layers are kept by rule so that the planner, the
engine and the one-process reference of ``autopar verify`` convert the same ones.

Under FSDP with ``tensorwise`` the weights are all-gathered in FP8 (torchao's
``enable_fsdp_float8_all_gather``: each shard is cast with the scale of the whole weight's
amax, an all-reduce, and one byte per element crosses the network instead of two). gloo has no
float8 dtype ("Invalid scalar type"), so on gloo the all-gather moves the same bytes as uint8
(``BytesAllGather``, set through FSDP2's ``set_custom_all_gather``); NCCL moves float8 as is.

Order (``passes/program.py``): after the fusions, whose rewritten modules keep their
``nn.Linear`` children, and before the pipeline split and tensor parallelism, whose styles
shard the ``Float8Linear`` weights as any linear's (torchao's tests run tp with the plain
styles; its ``Float8ColwiseParallel``, which all-gathers the sequence-parallel input in FP8,
is not used: the gathered input is bf16 here, as the cost model prices it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

from autopar.core.errors import AutoparError
from autopar.core.fp8 import fp8_all_gather, fp8_gemm
from autopar.core.specs import Precision, TrainSpec

def _torchao_float8():
    """torchao's float8 package, imported quietly (it logs that its CUDA extensions do not
    load on a CPU machine; float8 training does not use them), or a clear error."""
    logs = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [log.level for log in logs]
    for log in logs:  # and torch that an enum torchao registers needs no registering now
        log.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    except ImportError as err:
        raise AutoparError(
            f"precision fp8 runs on torchao's float8 training, which is not installed ({err})",
            where="precision=fp8",
            fix="pip install 'torchao>=0.18' (or pip install 'autopar[fp8]')") from err
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)
    return float8


def fp8_linear(module: nn.Module, name: str) -> bool:
    """Whether ``module``, at ``name`` inside a block, runs its GEMMs in FP8
    (``autopar.core.fp8.fp8_gemm``)."""
    return type(module) is nn.Linear and fp8_gemm(name, tuple(module.weight.shape))


def float8_config(train: TrainSpec, *, fsdp: bool):
    """torchao's ``Float8LinearConfig`` for ``train``'s recipe; ``fsdp``: the weights are
    all-gathered by FSDP2 (FP8 all-gather under ``tensorwise``)."""
    float8 = _torchao_float8()
    config = float8.Float8LinearConfig.from_recipe_name(train.fp8_recipe.value)
    if fsdp and fp8_all_gather(train):
        from dataclasses import replace

        config = replace(config, enable_fsdp_float8_all_gather=True)
    return config


def apply_float8(blocks: Iterable[nn.Module], train: TrainSpec, *, fsdp: bool) -> list[str]:
    """Swap the chosen linears of each of ``blocks`` (``fp8_linear``) for ``Float8Linear`` in
    place; the converted names, relative to their block, in order. Nothing under any other
    precision."""
    if train.precision is not Precision.FP8:
        return []
    chosen: list[str] = []
    convert, config = None, None  # torchao imported and configured once, where needed
    for block in blocks:
        names = [n for n, m in block.named_modules() if fp8_linear(m, n)]
        if not names:
            continue
        if convert is None:
            convert = _torchao_float8().convert_to_float8_training
            config = float8_config(train, fsdp=fsdp)
        keep = frozenset(names)
        convert(block, config=config,
                module_filter_fn=lambda module, name, keep=keep: name in keep)
        chosen += names
    return chosen


class BytesAllGather(DefaultAllGather):
    """FSDP2's all-gather with float8 buffers moved as uint8 (the same bytes): gloo has no
    float8 dtype. Every other dtype goes as FSDP2's default sends it."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                 group: dist.ProcessGroup, async_op: bool = False) -> dist.Work | None:
        if output_tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            output_tensor = output_tensor.view(torch.uint8)
            input_tensor = input_tensor.view(torch.uint8)
        return super().__call__(output_tensor=output_tensor, input_tensor=input_tensor,
                                group=group, async_op=async_op)


def apply_fp8_transport(modules: Iterable[nn.Module], train: TrainSpec) -> None:
    """On gloo, the FSDP2 modules among ``modules`` all-gather float8 as bytes
    (``BytesAllGather``); nothing where the weights are not gathered in FP8, or on NCCL."""
    if not fp8_all_gather(train) or dist.get_backend() != "gloo":
        return
    for module in modules:
        if isinstance(module, FSDPModule):
            module.set_custom_all_gather(BytesAllGather())

