"""``autopar profile``: measure this machine's operators and collectives into a ``Profile``.

Starts ``nproc`` processes (``verify.start_ranks``: gloo on CPUs, NCCL on GPUs, the environment
torchrun gives) running ``autopar.measure.profiling_worker``, which measures, all ranks at once:

* GEMMs over the full grid ``gemm_sizes``^3 (rows x cols x depth) in the precision's dtype;
* grouped GEMMs -- ``grouped_groups`` experts' GEMMs in one kernel, ``grouped_rows`` rows each,
  by ``grouped_sizes``^2 (cols x depth) -- by ``torch._grouped_mm`` where this torch has it, a
  loop of ``mm`` otherwise (the profile's ``grouped_kernel`` says which);
* causal ``scaled_dot_product_attention`` forward and backward, ``attention_heads`` heads of
  ``attention_head_dim``, over the sequence lengths ``attention_seq``;
* memory-bound kernels (add, GELU, layer norm, softmax over rows of ``memory_width``), their
  mean time keyed by their mean bytes read and written;
* an AdamW step over ``optimizer_params`` fp32 parameters;
* all-reduce, all-gather, reduce-scatter and all-to-all over ``collective_bytes`` on the whole
  world and on pairs of ranks (both pairs at once), and send-recv between pairs -- with more than
  one process (one process has no collective to measure: its profile has no collective table,
  and the estimate prices collectives analytically).

Every number is the median of repetitions, the slowest rank's; the result is a
``costmodel.profile.Profile`` (versioned JSON with device, dtype, torch and CUDA versions and
date). One machine's processes are one node: group layouts across nodes are not measured here
(the estimate prices them analytically).
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from autopar.core.collectives import Collective
from autopar.core.errors import AutoparError
from autopar.costmodel.profile import Curve, GemmGrid, Profile, collective_key
from autopar.costmodel.step import COMPUTE_DTYPE
from autopar.core.specs import Precision
from autopar.measure.profiling_worker import DTYPES, KINDS, groups_of
from autopar.verify.launcher import check_device, start_ranks, wait_ranks

ProgressFn = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Grid:
    """The sizes measured. ``QUICK`` and ``FULL`` are the two of the command line."""

    gemm_sizes: tuple[int, ...]
    attention_seq: tuple[int, ...]
    memory_elements: tuple[int, ...]
    optimizer_params: tuple[int, ...]
    collective_bytes: tuple[int, ...]
    attention_heads: int = 8
    attention_head_dim: int = 64
    memory_width: int = 1024
    grouped_rows: tuple[int, ...] = (64, 256)
    """Rows each expert receives in a grouped GEMM (a MoE layer's tokens x top-k / experts)."""
    grouped_sizes: tuple[int, ...] = (64, 512)
    """An expert GEMM's width and reduction (hidden and expert FFN sizes)."""
    grouped_groups: int = 4
    """Experts in one grouped GEMM."""


QUICK = Grid(gemm_sizes=(64, 512, 2048), attention_seq=(32, 128, 512),
             memory_elements=(2**12, 2**16, 2**20, 2**23),
             optimizer_params=(2**14, 2**18, 2**22),
             collective_bytes=(2**12, 2**16, 2**20, 2**24))
"""About a minute with 4 gloo processes on 2 CPU cores."""
FULL = Grid(gemm_sizes=(32, 128, 512, 2048, 4096), attention_seq=(32, 64, 128, 256, 512, 1024),
            grouped_rows=(32, 128, 512), grouped_sizes=(128, 512, 2048),
            memory_elements=tuple(4**i for i in range(5, 13)),
            optimizer_params=tuple(4**i for i in range(6, 13)),
            collective_bytes=tuple(4**i for i in range(5, 14)))
"""GEMM sides 32-4096, attention to 1024 tokens, 4 KiB-64 MiB messages: the shapes of models
of hidden 256-4096 at micro-batches of a few thousand tokens."""
GPU = Grid(gemm_sizes=(128, 512, 2048, 8192, 32768), attention_seq=(128, 512, 2048, 8192),
           memory_elements=tuple(4**i for i in range(8, 15)),
           optimizer_params=tuple(4**i for i in range(8, 15)),
           collective_bytes=tuple(4**i for i in range(6, 15)),
           attention_heads=32, attention_head_dim=64, grouped_rows=(128, 512, 2048, 8192),
           grouped_sizes=(1024, 2048, 4096, 8192), grouped_groups=16)
"""``FULL`` at a GPU's scale, the default on CUDA: GEMM sides 128-32768 (a micro-batch of up
to 32768 tokens by hidden and FFN sizes to 32768; a vocabulary of 128K is past it and priced
analytically), causal attention of 32 heads of 64 (Llama 3.2 1B's) to 8192 tokens,
memory-bound kernels and AdamW up to 2^28 elements and parameters, 4 KiB-256 MiB messages.
The largest GEMM is 70 TFLOP (about 0.1 s on an H100), the largest tensors 2 GiB; the whole
grid takes well under a minute on one H100 (``bench/gpu_check.py`` gives it 90 s)."""


def grouped_kernel() -> str:
    """What runs the grouped GEMMs here (``profiling_worker.grouped``)."""
    return "torch._grouped_mm" if hasattr(torch, "_grouped_mm") else "a loop of mm"


def device_name(device: str, nproc: int) -> str:
    if device.startswith("cuda"):
        return f"cuda: {torch.cuda.get_device_name(0)}"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu} ({os.cpu_count()} cores, {nproc} processes)"


def host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def profile(nproc: int = 4, *, grid: Grid | None = None, precision: str | None = None,
            device: str | None = None, progress: ProgressFn | None = None,
            timeout_s: float = 600.0, min_s: float = 0.05, max_reps: int = 20) -> Profile:
    """Measure this machine with ``nproc`` processes (see the module docstring). ``device``
    defaults to ``cuda`` when there is a GPU per process, else ``cpu``; ``precision`` to bf16
    on GPUs and fp32 on CPUs; ``grid`` to ``GPU`` on GPUs and ``FULL`` on CPUs."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise AutoparError(f"nproc must be a positive integer, got {nproc!r}", where="--nproc",
                           fix="pass e.g. --nproc 4")
    if device is None:
        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc \
            else "cpu"
    have = torch.cuda.device_count()
    check_device(device, nproc, what="the profile's",
                 fix=f"profile with --device cpu (the default here), or --nproc {have} on this "
                     "machine" if have else "profile with --device cpu (the default here), or "
                                            "run it on a GPU machine")
    precision = precision or ("bf16" if device == "cuda" else "fp32")
    grid = grid or (GPU if device == "cuda" else FULL)
    if precision not in DTYPES:
        raise AutoparError(f"cannot profile precision {precision!r}", where="--precision",
                           fix=f"use one of {', '.join(DTYPES)}")
    folder = Path(tempfile.mkdtemp(prefix="autopar-profile-"))
    job = {**{k: list(v) if isinstance(v, tuple) else v for k, v in grid.__dict__.items()},
           "device": device, "precision": precision, "folder": str(folder), "min_s": min_s,
           "max_reps": max_reps, "backend": "nccl" if device == "cuda" else "gloo"}
    procs = start_ranks(job, nproc, folder, worker=("-m", "autopar.measure.profiling_worker"))
    deadline = time.monotonic() + timeout_s
    while progress is not None and not all(p.poll() is not None for p in procs) and \
            not (folder / "rank0.pt").exists() and time.monotonic() < deadline:
        _report(folder, progress)
        time.sleep(0.2)
    results = wait_ranks(procs, folder, max(1.0, deadline - time.monotonic()))  # logs kept
    shutil.rmtree(folder, ignore_errors=True)  # on failure
    return _assemble(results[0]["seconds"], grid, nproc, device, precision, job["backend"])


def _report(folder: Path, progress: ProgressFn) -> None:
    import json

    try:
        p = json.loads((folder / "progress.json").read_text())
    except (OSError, ValueError):
        progress(0, 0, "starting processes")
        return
    progress(p["done"], p["total"], p["what"])


def _assemble(seconds: list[float], grid: Grid, nproc: int, device: str, precision: str,
              backend: str) -> Profile:
    """The worker's flat list of seconds, in its order, as the profile's tables."""
    it = iter(seconds)

    def take(n: int) -> list[float]:
        return [next(it) for _ in range(n)]

    g = grid.gemm_sizes
    gemm = GemmGrid.of(g, g, g, take(len(g) ** 3))
    gs = grid.grouped_sizes
    grouped = GemmGrid.of(grid.grouped_rows, gs, gs,
                          [t / grid.grouped_groups
                           for t in take(len(grid.grouped_rows) * len(gs) ** 2)])
    fwd, bwd = [], []
    for _ in grid.attention_seq:
        fwd += take(1)
        bwd += take(1)
    flop = [4.0 * grid.attention_heads * s * s * grid.attention_head_dim
            for s in grid.attention_seq]
    elem = torch.tensor([], dtype=DTYPES[precision]).element_size()
    # add 3, GELU 2, layer norm 2, softmax 2 tensors read or written; the mean of the four
    mem_bytes = [n * elem * 9 / 4 for n in grid.memory_elements]
    mem_s = [t / 4 for t in take(len(grid.memory_elements))]
    opt_s = take(len(grid.optimizer_params))
    colls: dict[str, Curve] = {}
    for size in groups_of(nproc):
        got: dict[str, list[float]] = {k: [] for k in KINDS}
        for _ in grid.collective_bytes:
            for kind in KINDS:
                got[kind] += take(1)
        for kind in KINDS:
            colls[collective_key(kind, size, size)] = Curve.of(grid.collective_bytes, got[kind])
    if nproc >= 2:
        colls[collective_key(Collective.SEND_RECV, 2, 2)] = Curve.of(grid.collective_bytes,
                                                          take(len(grid.collective_bytes)))
    return Profile(
        device=device_name(device, nproc), compute_dtype=COMPUTE_DTYPE[Precision(precision)],
        torch_version=torch.__version__, cuda_version=torch.version.cuda,
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        backend=backend, nproc=nproc, gemm=gemm, grouped_gemm=grouped,
        grouped_groups=grid.grouped_groups, grouped_kernel=grouped_kernel(),
        attention_forward=Curve.of(flop, fwd), attention_backward=Curve.of(flop, bwd),
        memory=Curve.of(mem_bytes, mem_s), optimizer=Curve.of(grid.optimizer_params, opt_s),
        collectives=colls, host_memory_bytes=host_memory_bytes())
