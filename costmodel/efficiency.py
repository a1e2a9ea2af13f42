"""The handful of efficiency constants that turn peak figures into achieved ones.

No per-run knobs: the same constants price every model on every cluster. Each one states what it
stands for and why it has its value; ``bench/validate_costmodel.py`` and
``tests/unit/measure/test_published_runs.py`` hold the model to published runs with them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from autopar.core.errors import AutoparError, read_json


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of peak, and fixed per-kernel costs."""

    matmul: float = 0.66
    """Achieved fraction of the tensor-core peak on transformer GEMMs over a whole run. The one
    fitted constant: a single value for every row of Megatron-LM's Table 1 (Narayanan et al.,
    SC'21), where it lands all ten runs within 4 % (bench/results/costmodel.md). It is consistent
    with what GPUs sustain: the 312 TFLOP/s A100 peak assumes the 1410 MHz boost clock, which
    falls under the power cap with every tensor core busy, and cuBLAS reaches ~75-80 % of the
    remaining rate on these shapes (~210-250 TFLOP/s measured for large fp16 GEMMs on A100).
    Used for GEMMs whose shape the cost model does not know (batched attention GEMMs, expert
    GEMMs, any GEMM when ``Split.seq_len`` is not given); a linear layer of known shape is
    priced at ``matmul_mainloop`` times its shape's ``compute.gemm_efficiency`` instead."""
    matmul_mainloop: float = 0.71
    """Achieved fraction of the tensor-core peak in the main loop of a GEMM whose shape is known
    (a linear layer priced with ``Split.seq_len``): the rate before tile and wave quantisation
    and the epilogue, which ``compute.gemm_efficiency`` takes off by shape. Fitted, like
    ``matmul``, as one value for all ten rows of Megatron-LM's Table 1 with the shape model on
    (``autopar.measure.calibration.calibrate`` on the ten rows, least squares of the log step time,
    each row at the micro-batch and chunks its authors' script ran: 0.709, kept to two places;
    refitted 2026-11-24 when the GEMMs took their weights' own shapes and the rows their
    scripts' configurations; bench/results/costmodel.md: errors -5.4 % .. +4.7 %). 0.71 of
    312 TFLOP/s is 222 TFLOP/s on A100, within the ~210-250 measured for large cuBLAS GEMMs;
    the shape losses of Megatron's GEMMs (2-10 %) make up the difference to ``matmul``."""
    gemm_tiles: tuple[tuple[int, int], ...] = ((256, 128), (128, 256), (128, 128))
    """Output tiles (rows x cols) one thread block computes; the GEMM takes whichever tile wastes
    the least. These are the large tiles of cuBLAS's menu (NVIDIA, "Matrix Multiplication
    Background User's Guide", DU-09799-001, 2023, sec. 2.3: 256x128, 128x256, 128x128 down to
    64x64; larger tiles reuse more data and run more efficiently, smaller ones expose more
    parallelism). The smaller tiles are left out: their parallelism is bought here by split-K
    instead (``compute.gemm_efficiency``), which keeps the large tiles' per-FLOP rate."""
    attention_fwd: float = 0.50
    """Attention (QK^T, softmax, AV) forward: FlashAttention-2 reports 50-70 % of peak on A100;
    the unfused Megatron-2021 path (two batched GEMMs around a fused softmax) lands near the low
    end, so half of peak."""
    attention_bwd: float = 0.40
    """Attention backward runs below its forward (FlashAttention-2: 35-45 % on A100 backward);
    the backward also recomputes the probabilities."""
    memory: float = 0.75
    """Memory-bound kernels (norms, activations, dropout, residuals, softmax, loss, optimizer)
    stream at ~75 % of the HBM datasheet bandwidth (STREAM-like copy on A100/H100 reaches 80-90 %;
    real elementwise kernels with reductions fall below that)."""
    kernel_overhead_s: float = 4e-6
    """Launch and tail cost per kernel: CUDA launch latency is 2-5 us and the last partial wave of
    a GEMM idles part of the GPU; charged once per non-view op and phase."""
    nvlink: float = 0.80
    """NCCL bus bandwidth over NVLink/NVSwitch as a fraction of the per-direction link figure:
    nccl-tests all-reduce on 8x A100 SXM reaches ~230-240 GB/s of 300 GB/s."""
    network: float = 0.85
    """NCCL bus bandwidth over InfiniBand/RoCE per GPU as a fraction of the NIC line rate
    (HDR 200 Gb/s: ~21 GB/s of 25 GB/s in nccl-tests across DGX A100 nodes)."""
    host_link: float = 0.80
    """PCIe copy bandwidth with pinned memory: ~25 GB/s of 32 GB/s on Gen4 x16."""
    dp_overlap: float = 0.90
    """Fraction of the last micro-batch's backward under which the data-parallel gradient
    reduction can hide: bucketed reduction (DDP, FSDP) starts with the first ready bucket and
    the last bucket is always exposed."""
    async_tp_overlap: float = 0.39
    """Fraction of the tensor-parallel communication that ``async_tp`` could hide behind its
    GEMMs (``min(comm, (tp - 1) / tp * gemm)``, ``costmodel/step.py:tp_comm_s``) that it does
    hide. Basis: torchtitan's async TP benchmark (pytorch/torchtitan
    ``benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md``, commit c720cb87; 256 H100, Llama
    3 70B, FSDP 32 x TP 8, full AC, local batch 16, bf16: 597.3 -> 652.4 tokens/s per GPU,
    1.09x); the ideal overlap (1.0) predicts 1.27x there. Fitted on that row only; its other
    row (Llama 3 8B, 64 H100, FSDP 8 x TP 8, 1.10x) is predicted, in
    ``tests/unit/measure/test_published_runs.py``. The gap to the ideal: the decomposed GEMMs run
    slower than the whole one, and not every collective of a block finds a GEMM to fuse with."""
    moe_load_imbalance: float = 1.10
    """A dropless MoE layer's busiest expert-parallel rank receives this multiple of the mean
    rows, which sets its all-to-all bytes and expert GEMMs (``costmodel/step.py``; a capacity
    layer's slots are static and take no factor). Basis (the value this constant had before
    the engine ran ep): top-k routing with a load-balancing loss keeps it near 1.1 (Switch,
    GShard). Calibrate it per model from
    ``autopar verify``'s "expert load" line (the busiest ep rank's share times ep) or a
    cluster run's token counts; tiny-moe at random init measured 1.05 (dp 4, ep 2, capacity)
    and 1.07 (dp 2, ep 2, dropless)."""
    ep_overlap: float = 0.5
    """With the expert-parallel all-to-alls overlapped by another micro-batch's compute
    (fusion ``ep_a2a_overlap``: Megatron-Core's EP-overlapped 1F1B, DualPipe), the fraction of
    the overlappable time (the smaller of the layer's all-to-all and compute times,
    ``costmodel/moe.py``) that is hidden: the two micro-batches' sub-modules are interleaved on
    two streams, so a dispatch finds only the other micro-batch's segment beside it, and the
    communication kernels take SMs from the compute. Basis: one published pair, Qwen3-30B-A3B
    on 16 H100 with the all-to-all dispatcher, 41.25 s -> 31.31 s
    (``tests/data/moe_runs.json``: ``q30b-h100-a2a-noovl``/``-ovl``): 9.9 s hidden of the
    19.3 s the cost model prices as overlappable, 0.51. Held on the other pairs (HybridEP on
    the same model, Qwen3-235B with DeepEP on 256 H100) in
    ``tests/unit/measure/test_moe_runs.py``."""
    cpu_adam_params_per_s: float = 1.0e9
    """CPU Adam step throughput per GPU's share of the host (ZeRO-Offload's CPU-Adam: ~1 billion
    parameters per second per socket share with AVX-512), for optimizer offload."""


DEFAULT_EFFICIENCY = Efficiency()



CALIBRATION_VERSION = 1
"""Version of the calibration file layout (``autopar calibrate --out``)."""
FITTABLE = ("matmul", "matmul_mainloop", "attention_fwd", "attention_bwd", "memory", "nvlink",
            "network", "host_link", "dp_overlap", "async_tp_overlap", "ep_overlap")
"""The constants ``autopar calibrate`` may fit: fractions of a peak, each bounded to (0, 1]."""


def calibration_dict(fitted: dict[str, float], source: str, date: str) -> dict[str, object]:
    """The calibration file's content: the fitted constants (the rest keep their defaults)."""
    return {"format_version": CALIBRATION_VERSION, "efficiency": dict(fitted), "fitted_on": source,
            "date": date}


def load_calibration(path: str | os.PathLike[str]) -> Efficiency:
    """The ``Efficiency`` of a calibration file: ``DEFAULT_EFFICIENCY`` with its fitted
    constants. Refuses (``AutoparError``) a file of another version, an unknown constant or a
    value outside (0, 1]."""
    p = Path(path)
    data = read_json(p, "calibration",
                     "write one with `autopar calibrate --runs RUNS --out FILE`")
    version = data.get("format_version") if isinstance(data, dict) else None
    if version != CALIBRATION_VERSION:
        raise AutoparError(f"calibration format_version {version!r} is not the one this autopar "
                           f"reads ({CALIBRATION_VERSION})", where=f"{p}: format_version",
                           fix="re-fit it with this version: autopar calibrate")
    values = data.get("efficiency")
    if not isinstance(values, dict):
        raise AutoparError("the calibration has no 'efficiency' map", where=f"{p}: efficiency",
                           fix="re-fit it with autopar calibrate")
    for name, value in values.items():
        if name not in FITTABLE:
            raise AutoparError(f"unknown efficiency constant {name!r}",
                               where=f"{p}: efficiency.{name}",
                               fix=f"use one of {', '.join(FITTABLE)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                not 0.0 < value <= 1.0:
            raise AutoparError(f"efficiency.{name} must be a fraction in (0, 1], got {value!r}",
                               where=f"{p}: efficiency.{name}", fix="re-fit it")
    return replace(DEFAULT_EFFICIENCY, **{k: float(v) for k, v in values.items()})
