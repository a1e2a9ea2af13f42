"""GPU and link specifications, each number with its source.

Units are SI inside (seconds, bytes, bytes per second, FLOP per second) and named in the field
(``*_s``, ``*_bytes``, ``*_bytes_per_s``, ``*_flop_per_s``). Bandwidths use decimal prefixes
(1 GB/s = 1e9 B/s, as every datasheet does); memory capacities use binary prefixes
(1 GiB = 2**30 B) unless the vendor states a decimal figure, which is then said at the place.
Every number a person types is checked against the range real hardware has (``PLAUSIBLE``), so
that a value in the wrong unit (400 for 400 Gbit/s) is refused with the conversion it needs.

Compute figures are dense (no 2:4 sparsity) tensor-core peaks; datasheets print the sparse figure
with an asterisk and the dense one is half of it.

Sources:
  [A100] NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf),
         "SXM" column.
  [H100] NVIDIA H100 Tensor Core GPU datasheet (h100-datasheet-2287922), "H100 SXM" column.
  [H200] NVIDIA H200 Tensor Core GPU datasheet (h200-datasheet-2768943), "H200 SXM" column.
  [DGXA100] NVIDIA DGX A100 System Architecture whitepaper and DGX A100 User Guide: 8x single-port
         ConnectX-6 HDR 200 Gb/s for the compute fabric, one per GPU; PCIe Gen4 GPU<->CPU.
  [DGXH100] NVIDIA DGX H100 User Guide: 8x ConnectX-7 400 Gb/s (NDR) compute ports, one per GPU;
         PCIe Gen5 GPU<->CPU.
  [H800] NVIDIA H800 SXM5 (the export variant of H100 SXM5): the H100 SXM's compute and 80 GB
         HBM3, NVLink cut to 400 GB/s total (both directions). DeepSeek-V3 Technical Report
         (arXiv 2412.19437), section 3.1: 2048 H800, 8 per node over NVLink/NVSwitch, InfiniBand
         between nodes; section 3.2.2: "NVLink offers a bandwidth of 160 GB/s, roughly 3.2 times
         that of IB (50 GB/s)" -- the achieved figures in their all-to-all kernels.
  [DGXB200] NVIDIA DGX B200 datasheet: 8x NVIDIA Blackwell GPUs, 1,440 GB HBM3e total (180 GB
         each), 64 TB/s HBM3e bandwidth (8 TB/s each), FP8 training 72 PFLOPS and FP4 inference
         144 PFLOPS for the system (sparse: 9 / 18 PFLOPS a GPU, 4.5 / 9 dense), fifth-generation
         NVLink 1.8 TB/s per GPU (14.4 TB/s aggregate, two NVSwitch chips), 8x single-port
         ConnectX-7 VPI 400 Gb/s for the compute fabric, 2 TB system memory (up to 4 TB), two
         Intel Xeon Platinum 8570 (PCIe Gen5).
  [B200]  NVIDIA Blackwell datasheet, "HGX B200" column (per GPU, 1,000 W): FP4 Tensor Core 18
         PFLOPS sparse, FP8/FP6 9 PFLOPS sparse, FP16/BF16 4.5 PFLOPS sparse, TF32 2.2 PFLOPS
         sparse, FP64/FP64 Tensor Core 40 TFLOPS; 180 GB HBM3e, 8 TB/s; NVLink 1.8 TB/s.
  [GB200] NVIDIA GB200 NVL72 datasheet: 72 Blackwell GPUs and 36 Grace CPUs in one rack, one
         72-GPU NVLink domain (130 TB/s of NVLink: 1.8 TB/s a GPU) across 18 compute trays of 4
         GPUs and 2 Grace CPUs; per rack FP4 1,440 PFLOPS, FP8/FP6 720 PFLOPS, FP16/BF16 360
         PFLOPS, TF32 180 PFLOPS (sparse), FP64 3,240 TFLOPS; HBM3e up to 13.4 TB at 576 TB/s
         (186 GB and 8 TB/s a GPU); per GB200 superchip (1 Grace + 2 B200) up to 480 GB LPDDR5X
         and NVLink-C2C 900 GB/s between the Grace and its GPUs. Compute fabric per GPU: one
         ConnectX-7 400 Gb/s (DGX GB200 user guide).
  [A100-WP] NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020): SMs per product.
  [H100-WP] NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022): SMs per product.
  [PCIe] PCI-SIG base specifications 4.0 (16 GT/s) and 5.0 (32 GT/s) per lane, 128b/130b coding.
  [NCCL] NVIDIA/nccl src/graph/tuning.cc, ``hwLat``: NCCL's own per-step latency model, in us,
         per ring step: NVLink 0.47 (LL) / 1.9 (LL128) / 3.4 (Simple); PCI 1.0 / 2.5 / 5.7;
         network 2.7 / 4.0 / 9.6. Simple figures include the time of a 256 kB chunk, so the LL128
         figure is the one used here as the alpha of an alpha-beta model. These are typical
         measured values NCCL is tuned to, not datasheet values.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, TypeVar

from autopar.core.errors import AutoparError

DTYPES: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
"""Dtype names a ``GPUSpec`` may give a peak for."""

GiB = 2**30
"""Binary gibibyte, for memory capacities."""
TiB = 2**40
"""Binary tebibyte, for host memory."""
GB = 10**9
"""Decimal gigabyte, for bandwidths (and capacities a vendor states in decimal)."""
TB = 10**12
"""Decimal terabyte, for a capacity a vendor states in decimal (DGX B200's "2 TB")."""


def check_positive(value: object, name: str, *, integer: bool = False) -> None:
    """Raise ``AutoparError`` naming ``name`` unless ``value`` is a finite number > 0."""
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not 0 < value < math.inf:
        what = "a positive integer" if integer else "a positive number"
        raise AutoparError(f"{name} must be {what}, got {value!r}", where=name,
                           fix=f"write {what}, in the unit its name ends with")


# --- plausible ranges -------------------------------------------------------------------------

_B_PER_S = ("B/s", "bytes/s", "bytes per second")
_S = ("s", "s", "seconds")
_FLOP_PER_S = ("FLOP/s", "FLOP/s", "FLOP per second")
_B = ("B", "bytes", "bytes")
_IN_GIB, _IN_TIB = ("GiB", 2**30), ("TiB", 2**40)
_IN_GB, _IN_TB = ("GB", 1e9), ("TB", 1e12)


@dataclass(frozen=True)
class Plausible:
    """The values real hardware has for one kind of field, and the units a person may have
    typed instead of the SI unit the key names."""

    low: float
    """Smallest value accepted, in the key's SI unit: generous, nothing real lies below it."""
    high: float
    """Largest value accepted: generous, nothing real or announced lies above it."""
    typical: tuple[float, float]
    """The span of shipping hardware. A unit is offered when the value read in it lands here
    (failing every unit, in ``low..high``), at most two, in the order of ``units``: 400 B/s
    reads as 400 Gbit/s or 400 GB/s, not 400 MB/s."""
    units: tuple[tuple[str, float], ...]
    """Units a person may have meant, most likely first: (name, SI units in one of it)."""
    of: str
    """What the range is of, for the message: "any GPU interconnect"."""
    unit: tuple[str, str, str]
    """The key's unit: symbol, plural, in words, e.g. ("B/s", "bytes/s", "bytes per second")."""


PLAUSIBLE: dict[str, Plausible] = {
    # Per GPU per direction, for intra_node, inter_node and host_link alike. Accepted 1e8-1e14:
    # 1e8 B/s = 0.8 Gbit/s is below one 1 GbE port (1.25e8), and a 10 GbE NIC shared by 8 GPUs
    # still gives 1.56e8; 1e14 = 100 TB/s is 100x NVLink 5 (900 GB/s) and 50x NVLink 6. Guesses
    # land in 1 GB/s-4 TB/s, from 10 GbE (1.25e9) to NVLink 6 (1.8e12); networks are sold in
    # Gbit/s, NVLink and PCIe in GB/s, so both are offered when both fit.
    "bytes_per_s": Plausible(1e8, 1e14, (1e9, 4e12),
                             (("Gbit/s", 1e9 / 8), ("GB/s", 1e9), ("MB/s", 1e6)),
                             "any GPU interconnect", _B_PER_S),
    # Alpha of one hop. Accepted 10 ns-1 ms: light alone takes 10 ns through 2 m of fiber, with
    # no NIC or switch yet; 1 ms is 10x a kernel TCP stack on Ethernet (~100 us). Guesses land in
    # 100 ns-100 us: NVLink ~0.5-2 us, IB/RoCE 1-5 us, TCP 10-100 us.
    "latency_s": Plausible(1e-8, 1e-3, (1e-7, 1e-4), (("us", 1e-6), ("ns", 1e-9), ("ms", 1e-3)),
                           "any interconnect's latency", _S),
    # Dense peak, every dtype. Accepted 10 GFLOP/s-1 EFLOP/s: the slowest figure of a CUDA GPU of
    # the last decade is fp64 on a consumer card (GT 1030: 35 GFLOP/s; RTX 4090: 1.3 TFLOP/s);
    # 1e18 is 200x B200's dense fp8 (4.5 PFLOP/s). Guesses land in 1 TFLOP/s-10 PFLOP/s.
    "peak_flop_per_s": Plausible(1e10, 1e18, (1e12, 1e16),
                                 (("TFLOP/s", 1e12), ("PFLOP/s", 1e15), ("GFLOP/s", 1e9)),
                                 "any GPU's peak", _FLOP_PER_S),
    # Accepted 1 GiB-16 TiB: no CUDA GPU of the last decade has under 2 GiB (GT 1030); 16 TiB is
    # 16x the 1 TB of HBM announced for Rubin Ultra. Guesses land in 2 GiB-2 TiB (consumer cards
    # 8-32 GiB, B300 288 GB). GiB before GB: "80GB" on an A100/H100 datasheet is 80 GiB.
    "hbm_bytes": Plausible(2**30, 2**44, (2 * 2**30, 2 * 2**40),
                           (_IN_GIB, _IN_GB, ("MiB", 2**20), _IN_TIB), "any GPU's memory", _B),
    # Accepted 10 GB/s-1 PB/s: a 64-bit GDDR5 card has 48 GB/s (GT 1030); 1e15 is 100x B200's
    # 8 TB/s. Guesses land in 100 GB/s-100 TB/s (consumer ~200 GB/s to HBM4 ~20 TB/s).
    "hbm_bytes_per_s": Plausible(1e10, 1e15, (1e11, 1e14),
                                 (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)),
                                 "any GPU's memory bandwidth", _B_PER_S),
    # Per node. Accepted 1 GiB-64 TiB: no machine that drives a GPU has less than 1 GiB; 64 TiB is
    # beyond the largest single-system servers (48 TB). Guesses land in 8 GiB-64 TiB (desktops
    # 16-128 GiB, DGX/HGX 2 TiB).
    "host_memory_bytes": Plausible(2**30, 2**46, (8 * 2**30, 2**46),
                                   (_IN_GIB, _IN_TIB, _IN_GB, _IN_TB), "any GPU server's memory",
                                   _B),
    # Per GPU, checked only when not 0 (0 reserves nothing: an idealized GPU). Accepted from
    # 1 MiB: a CUDA context alone takes hundreds of MiB, so less is a size in GiB or MiB; the upper
    # limit that matters, below gpu.hbm_bytes, ClusterSpec checks. Guesses land in 64 MiB-64 GiB.
    "hbm_reserved_bytes": Plausible(2**20, 2**44, (2**26, 2**36),
                                    (_IN_GIB, ("MiB", 2**20), _IN_GB),
                                    "what a CUDA context, NCCL and fragmentation take", _B),
}
"""The one table of plausible ranges, keyed by field name (links share ``bytes_per_s`` and
``latency_s``; every dtype shares ``peak_flop_per_s``); ``check_plausible`` applies it."""


def check_plausible(value: float, kind: str, name: str) -> None:
    """Raise ``AutoparError`` naming ``name`` unless ``value`` lies in ``PLAUSIBLE[kind]``; the
    message says the units the value would make sense in and converts it."""
    r = PLAUSIBLE[kind]
    if r.low <= value <= r.high:
        return
    symbol, plural, words = r.unit
    whole = symbol == "B"
    span = (f"{format_bytes(int(r.low))} to {format_bytes(int(r.high))}" if whole
            else f"{_sci(r.low)} to {_sci(r.high)} {symbol}")
    typed = str(value) if isinstance(value, int) else _sci(value, 6)
    readings = [(u, value * f) for u, f in r.units if r.typical[0] <= value * f <= r.typical[1]]
    readings = readings or [(u, value * f) for u, f in r.units if r.low <= value * f <= r.high]
    guesses = [f"{typed} {u} = {round(x) if whole else _sci(x)} {plural}" for u, x in readings]
    raise AutoparError(
        f"{name} = {typed} {symbol} is far {'below' if value < r.low else 'above'} {r.of} ({span})",
        where=name,
        fix=(f"did you mean {', or '.join(guesses[:2])}? the unit is in the key name: {words}"
             if guesses else f"write the value in {words}, the unit in the key name"))


def _sci(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits, exponents written short: 5e10, 5e-6, 3.35."""
    text = f"{x:.{digits}g}"
    mantissa, _, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else text


def format_bytes(n: int) -> str:
    """Memory in binary units (GiB); a whole number of decimal GB that is no whole GiB says so."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", 2**20)):
        if n >= size:
            text = f"{n / size:.4g} {unit}"
            return f"{text} = {n // GB} GB" if n % size and n % GB == 0 else text
    return f"{n} B"


def format_bytes_per_s(bytes_per_s: float) -> str:
    """Bandwidth in decimal units (GB/s, TB/s)."""
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:.4g} TB/s"
    return f"{bytes_per_s / 1e9:.4g} GB/s"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` (difflib), or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class GPUSpec:
    """One GPU: peak compute per dtype, HBM capacity and bandwidth."""

    name: str
    """Marketing name, e.g. ``H100-SXM5-80GB``."""
    peak_flop_per_s: Mapping[str, float] = field(hash=False)
    """Dense peak FLOP/s per dtype name (see ``DTYPES``); tensor-core figures where there are."""
    hbm_bytes: int
    """HBM capacity in bytes."""
    hbm_bytes_per_s: float
    """HBM bandwidth in bytes per second (decimal)."""
    source: str = ""
    """Where the numbers come from."""
    sm_count: int | None = None
    """Streaming multiprocessors: the thread blocks one wave of a GEMM runs
    (``costmodel.compute.gemm_efficiency``); ``None`` prices no wave quantisation."""

    def __post_init__(self) -> None:
        if self.sm_count is not None:
            check_positive(self.sm_count, "sm_count", integer=True)
        if not isinstance(self.peak_flop_per_s, Mapping) or not self.peak_flop_per_s:
            raise AutoparError("peak_flop_per_s must map dtype names to FLOP/s, and not be empty",
                               where="peak_flop_per_s", fix="write e.g. {bf16: 989e12}")
        for dtype, value in self.peak_flop_per_s.items():
            if dtype not in DTYPES:
                raise AutoparError(f"unknown dtype {dtype!r}", where=f"peak_flop_per_s.{dtype}",
                                   fix=f"use one of {', '.join(DTYPES)}"
                                       + did_you_mean(dtype, DTYPES))
            check_positive(value, f"peak_flop_per_s.{dtype}")
        check_positive(self.hbm_bytes, "hbm_bytes", integer=True)
        check_positive(self.hbm_bytes_per_s, "hbm_bytes_per_s")
        for dtype, value in self.peak_flop_per_s.items():
            check_plausible(value, "peak_flop_per_s", f"peak_flop_per_s.{dtype}")
        check_plausible(self.hbm_bytes, "hbm_bytes", "hbm_bytes")
        check_plausible(self.hbm_bytes_per_s, "hbm_bytes_per_s", "hbm_bytes_per_s")
        ordered = {d: float(self.peak_flop_per_s[d]) for d in DTYPES if d in self.peak_flop_per_s}
        object.__setattr__(self, "peak_flop_per_s", ordered)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s of one GPU for ``dtype``."""
        try:
            return self.peak_flop_per_s[dtype]
        except KeyError:
            have = ", ".join(self.peak_flop_per_s)
            raise AutoparError(f"{self.name} has no peak FLOP/s figure for {dtype!r}",
                               where=f"gpu.peak_flop_per_s.{dtype}",
                               fix=f"use one of {have}, or add the figure to the GPU spec"
                               ) from None


@dataclass(frozen=True)
class LinkSpec:
    """One kind of link, seen from one GPU."""

    name: str
    """Short name, e.g. ``NVLink4``."""
    bytes_per_s: float
    """Bandwidth per GPU, per direction, in bytes per second (decimal)."""
    latency_s: float
    """Latency of one hop of a small message (the alpha of an alpha-beta model), in seconds."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        check_positive(self.bytes_per_s, "bytes_per_s")
        check_positive(self.latency_s, "latency_s")
        check_plausible(self.bytes_per_s, "bytes_per_s", "bytes_per_s")
        check_plausible(self.latency_s, "latency_s", "latency_s")


# --- GPUs -------------------------------------------------------------------------------------

_A100_PEAK = {
    "fp64": 19.5e12,  # [A100] FP64 Tensor Core 19.5 TFLOPS (FP64 vector: 9.7 TFLOPS)
    "fp32": 19.5e12,  # [A100] FP32 19.5 TFLOPS (no tensor core)
    "tf32": 156e12,  # [A100] TF32 Tensor Core 156 TFLOPS (312 with sparsity)
    "bf16": 312e12,  # [A100] BF16 Tensor Core 312 TFLOPS (624 with sparsity)
    "fp16": 312e12,  # [A100] FP16 Tensor Core 312 TFLOPS (624 with sparsity)
}
# H100 SXM and H200 SXM have the same compute [H100], [H200]; sparse figures are twice these.
_HOPPER_PEAK = {
    "fp64": 67e12,  # FP64 Tensor Core 67 TFLOPS (FP64 vector: 34 TFLOPS)
    "fp32": 67e12,  # FP32 67 TFLOPS
    "tf32": 494e12,  # TF32 Tensor Core 989 TFLOPS sparse -> 494 dense
    "bf16": 989e12,  # BF16 Tensor Core 1,979 TFLOPS sparse -> 989 dense
    "fp16": 989e12,  # FP16 Tensor Core 1,979 TFLOPS sparse -> 989 dense
    "fp8": 1979e12,  # FP8 Tensor Core 3,958 TFLOPS sparse -> 1,979 dense
}

A100_SXM4_80GB = GPUSpec(
    "A100-SXM4-80GB", _A100_PEAK,
    hbm_bytes=80 * GiB,  # [A100] 80GB HBM2e: 5 stacks of 16 GiB; nvidia-smi shows 81920 MiB
    hbm_bytes_per_s=2.039e12,  # [A100] 2,039 GB/s
    source="NVIDIA A100 datasheet, SXM 80GB: dense TC peaks, 80 GiB HBM2e at 2,039 GB/s",
    sm_count=108,  # [A100-WP] 108 SMs in the A100 product (128 in the full GA100)
)
A100_SXM4_40GB = GPUSpec(
    "A100-SXM4-40GB", _A100_PEAK,
    hbm_bytes=40 * GiB,  # [A100] 40GB HBM2
    hbm_bytes_per_s=1.555e12,  # [A100] 1,555 GB/s
    source="NVIDIA A100 datasheet, SXM 40GB: dense TC peaks, 40 GiB HBM2 at 1,555 GB/s",
    sm_count=108,  # [A100-WP]
)
H100_SXM5_80GB = GPUSpec(
    "H100-SXM5-80GB", _HOPPER_PEAK,
    hbm_bytes=80 * GiB,  # [H100] 80GB HBM3 (80 GiB physical; nvidia-smi shows 81559 MiB)
    hbm_bytes_per_s=3.35e12,  # [H100] 3.35 TB/s
    source="NVIDIA H100 datasheet, H100 SXM: dense TC peaks (half the sparse), "
    "80 GiB HBM3 at 3.35 TB/s",
    sm_count=132,  # [H100-WP] 132 SMs in H100 SXM5 (144 in the full GH100)
)
H200_SXM_141GB = GPUSpec(
    "H200-SXM-141GB", _HOPPER_PEAK,
    # [H200] "141GB HBM3e", taken as decimal GB: 141e9 B (131.3 GiB). This is conservative:
    # nvidia-smi reports 143771 MiB (140.4 GiB) visible; override hbm_bytes if you rely on it.
    hbm_bytes=141 * GB,
    hbm_bytes_per_s=4.8e12,  # [H200] 4.8 TB/s
    source="NVIDIA H200 datasheet, H200 SXM: compute as H100 SXM, 141 GB (decimal) HBM3e "
    "at 4.8 TB/s",
    sm_count=132,  # [H200]: the H100 SXM5's GH100 configuration with HBM3e
)

H800_SXM5_80GB = GPUSpec(
    "H800-SXM5-80GB", _HOPPER_PEAK,
    hbm_bytes=80 * GiB,  # [H800] the H100 SXM's 80GB HBM3
    hbm_bytes_per_s=3.35e12,  # [H800] as [H100]
    source="NVIDIA H100 datasheet (H100 SXM compute and 80 GiB HBM3 at 3.35 TB/s; the H800 "
    "SXM5 is its export variant with NVLink cut to 400 GB/s total)",
    sm_count=132,  # [H800]: the H100 SXM5's GH100 configuration
)

# Blackwell, dense (half the datasheet's sparse figures); the GB200's GPU runs at 1,200 W and
# its peaks are the rack's / 72 [GB200], the HGX/DGX B200's at 1,000 W [B200]. The SM count is
# not in the datasheets: no wave quantisation is priced for these (sm_count None).
B200_180GB = GPUSpec(
    "B200-180GB",
    {"fp64": 40e12,  # [B200] FP64 Tensor Core 40 TFLOPS
     "tf32": 1.1e15,  # [B200] TF32 2.2 PFLOPS sparse -> 1.1 dense
     "bf16": 2.25e15,  # [B200] BF16 4.5 PFLOPS sparse -> 2.25 dense
     "fp16": 2.25e15,  # [B200] FP16 4.5 PFLOPS sparse -> 2.25 dense
     "fp8": 4.5e15,  # [B200] FP8 9 PFLOPS sparse -> 4.5 dense; [DGXB200] 72 PFLOPS / 8 sparse
     "fp4": 9e15},  # [B200] FP4 18 PFLOPS sparse -> 9 dense
    hbm_bytes=180 * GB,  # [DGXB200] 1,440 GB / 8, decimal
    hbm_bytes_per_s=8e12,  # [DGXB200] 64 TB/s / 8
    source="NVIDIA Blackwell (HGX B200, 1,000 W) and DGX B200 datasheets: dense TC peaks (half "
    "the sparse), 180 GB (decimal) HBM3e at 8 TB/s",
)
B200_GB200_186GB = GPUSpec(
    "B200-GB200-186GB",
    {"fp64": 45e12,  # [GB200] FP64 3,240 TFLOPS / 72
     "tf32": 1.25e15,  # [GB200] TF32 180 PFLOPS sparse / 72 -> 1.25 dense
     "bf16": 2.5e15,  # [GB200] BF16 360 PFLOPS sparse / 72 -> 2.5 dense
     "fp16": 2.5e15,  # [GB200] FP16 360 PFLOPS sparse / 72 -> 2.5 dense
     "fp8": 5e15,  # [GB200] FP8 720 PFLOPS sparse / 72 -> 5 dense
     "fp4": 10e15},  # [GB200] FP4 1,440 PFLOPS sparse / 72 -> 10 dense
    hbm_bytes=186 * GB,  # [GB200] 13.4 TB / 72 (186 GB a GPU, decimal)
    hbm_bytes_per_s=8e12,  # [GB200] 576 TB/s / 72
    source="NVIDIA GB200 NVL72 datasheet: the rack's dense TC peaks (half the sparse) / 72, "
    "186 GB (decimal) HBM3e at 8 TB/s a GPU",
)

GPUS: dict[str, GPUSpec] = {g.name: g for g in (A100_SXM4_80GB, A100_SXM4_40GB,
                                                H100_SXM5_80GB, H200_SXM_141GB,
                                                H800_SXM5_80GB, B200_180GB, B200_GB200_186GB)}

# --- Links ------------------------------------------------------------------------------------

_NVLINK_LAT = 1.9e-6  # [NCCL] NVLink per-step latency, LL128 (typical measured, not datasheet)
_NET_LAT = 4.0e-6  # [NCCL] network per-step latency, LL128; NCCL has one figure for IB and RoCE
_PCIE_LAT = 2.5e-6  # [NCCL] PCI per-step latency, LL128; excludes a cudaMemcpy launch (~us)

NVLINK3 = LinkSpec("NVLink3", 300e9, _NVLINK_LAT,
                   "[A100] NVLink 600 GB/s total (12 links x 50 GB/s, both directions) -> "
                   "300 GB/s per direction; latency: NCCL tuning model (typical, LL128)")
NVLINK4 = LinkSpec("NVLink4", 450e9, _NVLINK_LAT,
                   "[H100]/[H200] NVLink 900 GB/s total (18 links x 50 GB/s, both directions) -> "
                   "450 GB/s per direction; latency: NCCL tuning model (typical, LL128)")
NVLINK4_H800 = LinkSpec("NVLink4-H800", 200e9, _NVLINK_LAT,
                        "[H800] NVLink 400 GB/s total (both directions) -> 200 GB/s per "
                        "direction (DeepSeek-V3 measured 160 GB/s in its all-to-all); latency: "
                        "NCCL tuning model (typical, LL128)")  # no datasheet in the sources
NVLINK5 = LinkSpec("NVLink5", 900e9, _NVLINK_LAT,
                   "[DGXB200]/[GB200] fifth-generation NVLink 1.8 TB/s per GPU (both directions) "
                   "-> 900 GB/s per direction, inside a DGX B200 and across a GB200 NVL72's "
                   "72-GPU domain alike; latency: NCCL tuning model (typical, LL128)")
NVLINK_C2C = LinkSpec("NVLink-C2C", 225e9, _PCIE_LAT,
                      "[GB200] NVLink-C2C 900 GB/s (both directions) between a Grace CPU and its "
                      "two GPUs -> 450 GB/s a GPU, 225 GB/s per direction (an even share); "
                      "latency: NCCL's PCI figure (LL128), for want of a C2C one")
IB_HDR = LinkSpec("IB-HDR-200G", 25e9, _NET_LAT,
                  "[DGXA100] one ConnectX-6 HDR 200 Gb/s per GPU = 25 GB/s per direction; "
                  "latency: NCCL tuning model (typical, LL128)")
IB_NDR = LinkSpec("IB-NDR-400G", 50e9, _NET_LAT,
                  "[DGXH100]/[DGXB200]/[GB200] one ConnectX-7 NDR 400 Gb/s per GPU = 50 GB/s per "
                  "direction; "
                  "latency: NCCL tuning model (typical, LL128)")
ROCE_400G = LinkSpec("RoCE-400GbE", 50e9, _NET_LAT,
                     "one ConnectX-7 400GbE port per GPU (RoCE v2) = 50 GB/s per direction; "
                     "latency: NCCL tuning model, same network figure as IB (typical, LL128)")
PCIE4_X16 = LinkSpec("PCIe-Gen4-x16", 32e9, _PCIE_LAT,
                     "[PCIe] 16 GT/s x 16 lanes = 32 GB/s per direction nominal (31.5 after "
                     "128b/130b); [A100] lists 64 GB/s both directions; latency: NCCL PCI (LL128)")
PCIE5_X16 = LinkSpec("PCIe-Gen5-x16", 64e9, _PCIE_LAT,
                     "[PCIe] 32 GT/s x 16 lanes = 64 GB/s per direction nominal (63 after "
                     "128b/130b); [H100] lists 128 GB/s both directions; latency: NCCL PCI (LL128)")

LINKS: dict[str, LinkSpec] = {lk.name: lk for lk in (NVLINK3, NVLINK4, NVLINK4_H800, NVLINK5,
                                                     NVLINK_C2C, IB_HDR, IB_NDR, ROCE_400G,
                                                     PCIE4_X16, PCIE5_X16)}


def gpu_preset(name: str) -> GPUSpec:
    """The ``GPUSpec`` preset called ``name`` (case-insensitive)."""
    return _lookup(GPUS, name, "GPU")


def link_preset(name: str) -> LinkSpec:
    """The ``LinkSpec`` preset called ``name`` (case-insensitive)."""
    return _lookup(LINKS, name, "link")


_T = TypeVar("_T")


def _lookup(table: Mapping[str, _T], name: str, kind: str) -> _T:
    by_lower = {k.lower(): v for k, v in table.items()}
    if name.lower() in by_lower:
        return by_lower[name.lower()]
    raise AutoparError(f"no {kind} preset called {name!r}", where=name,
                       fix=f"use one of {', '.join(table)}{did_you_mean(name, table)}")
