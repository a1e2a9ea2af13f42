"""``ClusterSpec``: the machines a plan runs on, from a preset or a YAML/JSON file.

Units are SI and named in the keys (``*_bytes``, ``*_bytes_per_s``, ``*_s``, ``*_flop_per_s``);
a file holds plain numbers (``989e12``, ``85899345920``; quoted or not). Every GPU and link number
of a preset cites its datasheet in ``autopar.costmodel.hardware``. Every number but the counts
(``nodes``, ``gpus_per_node``) must lie in the range real hardware has (``hardware.PLAUSIBLE``),
whether it comes from a file or from Python: a number in the wrong unit (``bytes_per_s: 400`` for
400 Gbit/s) is refused with the conversion it needs.

A node is a host (what ``torchrun --nproc-per-node`` and a scheduler count); the GPUs joined by
``intra_node`` (NVLink through NVSwitch) are its NVLink domain, one node by default or
``nvlink_domain`` GPUs across several hosts (GB200 NVL72: 72 GPUs over 18 hosts of 4). The cost
model places the communication groups by the domain (``costmodel/topology.py``).

Presets, 8 GPUs per node each unless said; host memory from NVIDIA's DGX user guides ("2TB" is
32 x 64 GB DIMMs, i.e. 2 TiB binary):
  dgx-a100-80g   A100-SXM4-80GB, NVLink3, IB HDR 200G per GPU, PCIe Gen4, 2 TiB (DGX A100 640GB)
  dgx-a100-40g   A100-SXM4-40GB, as above with 1 TiB host (DGX A100 320GB)
  hgx-h100-80g   H100-SXM5-80GB, NVLink4, IB NDR 400G per GPU, PCIe Gen5, 2 TiB host (DGX H100)
  hgx-h100-roce  hgx-h100-80g with 400GbE RoCE v2 (ConnectX-7) between the nodes
  hgx-h200       H200-SXM-141GB, NVLink4, IB NDR 400G per GPU, PCIe Gen5, 2 TiB host (DGX H200)
  hgx-h800       H800-SXM5-80GB, NVLink 400 GB/s total, IB 50 GB/s per GPU, PCIe Gen5 (DeepSeek-V3's
                 cluster, arXiv 2412.19437 section 3.1: 2048 GPUs = ``--nodes 256``); host
                 memory not published, taken as DGX H100's 2 TiB
  dgx-b200       B200-180GB, NVLink5, IB NDR 400G per GPU, PCIe Gen5, 2 TB host (DGX B200)
  gb200-nvl72    B200-GB200-186GB, 4 GPUs a host (compute tray) in a 72-GPU NVLink5 domain (one
                 rack: ``--nodes 18``), IB NDR 400G per GPU between racks, NVLink-C2C to the
                 Grace CPUs, 2 x 480 GB LPDDR5X a host (GB200 NVL72 datasheet)
"""

from __future__ import annotations

import json
import math
import os
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

from autopar.core.collectives import Collective
from autopar.core.errors import AutoparError
from .hardware import (A100_SXM4_40GB, A100_SXM4_80GB, B200_180GB, B200_GB200_186GB,
                       H100_SXM5_80GB, H200_SXM_141GB, H800_SXM5_80GB, IB_HDR, IB_NDR, NVLINK3,
                       NVLINK4, NVLINK4_H800, NVLINK5, NVLINK_C2C, PCIE4_X16, PCIE5_X16,
                       PLAUSIBLE, ROCE_400G, GB, TB, GiB, GPUSpec, LinkSpec, TiB,
                       check_plausible, check_positive, did_you_mean,
                       format_bytes, format_bytes_per_s, gpu_preset, link_preset)
from .profile import Profile, collective_key

DEFAULT_HBM_RESERVED_BYTES = 4 * GiB
"""HBM per GPU that a training program cannot use: 4 GiB (binary), a fixed amount because none of
its parts grows with the HBM size. It holds the CUDA context with the cuBLAS/cuDNN workspaces
(about 0.5-1 GiB on A100/H100, not counted by ``torch.cuda.memory_allocated``: PyTorch "CUDA
semantics"), NCCL buffers (NCCL_BUFFSIZE is 4 MiB per channel and peer, a few hundred MiB over the
dp/tp/pp communicators), memory the driver keeps (nvidia-smi shows 81559 of 81920 MiB on an H100
80GB) and caching-allocator fragmentation (1-2 GiB)."""

DEFAULT_MEMORY_HEADROOM = 0.05
"""Fraction of the usable HBM the planner keeps free for what its memory model can miss,
against the dry run of the emitted program on the grid of real-scale plans
(``bench/results/memory_grid.md``, 2026-11-23): without pipelining the worst under-prediction
is 1.5 % (5 % keeps three times that). Two known gaps are larger and named there, not hidden
in this margin: torch's pipeline receive buffers (middle pipeline ranks up to 13 % under) and
the fused loss's forward (26 % under). What the dry run itself misses on a GPU (the caching
allocator's fragmentation) is measured when a GPU is lent; until then it is in
``hbm_reserved_bytes``."""

DEFAULT_FAILURE_RATE_PER_GPU_HOUR = 419 / (54 * 24 * 16384)
"""Unexpected interruptions per GPU-hour: Llama 3 405B's pre-training, 419 in a 54-day snapshot
on 16,384 H100s (Grattafiori et al., "The Llama 3 Herd of Models", 2024, section 3.3.4,
table 5): 1.97e-5. ``costmodel/goodput.py`` prices the whole run with it."""

DEFAULT_CHECKPOINT_BYTES_PER_S = 2e12
"""Aggregate checkpoint write and read bandwidth: Meta's Tectonic for Llama 3, "a sustained
throughput of 2 TB/s and a peak throughput of 7 TB/s" (Grattafiori et al. 2024, 3.3.1)."""

DEFAULT_RELAUNCH_S = 600.0
"""Detecting an interruption, rescheduling and restarting every rank, before the checkpoint is
read. An assumption (no cited figure): a cluster file sets its own."""

CLUSTER_FILE_SUFFIXES = (".yaml", ".yml", ".json")
"""The extensions of a cluster file (YAML or JSON)."""
_LINKS = ("intra_node", "inter_node", "host_link")
_RUN_KEYS = ("failure_rate_per_gpu_hour", "checkpoint_bytes_per_s", "relaunch_s")
_RUN_DEFAULTS = {"failure_rate_per_gpu_hour": DEFAULT_FAILURE_RATE_PER_GPU_HOUR,
                 "checkpoint_bytes_per_s": DEFAULT_CHECKPOINT_BYTES_PER_S,
                 "relaunch_s": DEFAULT_RELAUNCH_S}
_TOP_KEYS = ("name", "base", "nodes", "gpus_per_node", "nvlink_domain", "gpu", *_LINKS,
             "host_memory_bytes", "hbm_reserved_bytes", "memory_headroom", *_RUN_KEYS)
_SECTION_KEYS = {"gpu": ("name", "peak_flop_per_s", "hbm_bytes", "hbm_bytes_per_s", "source",
                         "sm_count"),
                 **{k: ("name", "bytes_per_s", "latency_s", "source") for k in _LINKS}}
_HINT = {"nodes": "an integer, e.g. 4", "gpus_per_node": "an integer, e.g. 8", "name": "a name",
         "nvlink_domain": "GPUs in one NVLink domain, a multiple of gpus_per_node, e.g. 72",
         "hbm_bytes": "bytes, e.g. 85899345920 (80 GiB)", "hbm_bytes_per_s": "B/s, e.g. 3.35e12",
         "sm_count": "an integer, e.g. 132",
         "peak_flop_per_s": "a map of dtype to dense FLOP/s, e.g. {bf16: 989e12}",
         "bytes_per_s": "B/s per GPU per direction, e.g. 450e9", "latency_s": "seconds, e.g. 2e-6",
         "host_memory_bytes": "bytes per node, e.g. 2199023255552 (2 TiB)",
         "hbm_reserved_bytes": "bytes per GPU, e.g. 4294967296 (4 GiB)",
         "memory_headroom": "a fraction from 0 to below 0.5, e.g. 0.05",
         "failure_rate_per_gpu_hour": "interruptions per GPU-hour, e.g. 2e-5",
         "checkpoint_bytes_per_s": "aggregate storage B/s, e.g. 2e12",
         "relaunch_s": "seconds to restart the job, e.g. 600"}


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous cluster: ``nodes`` x ``gpus_per_node`` GPUs of one kind."""

    name: str
    """Name shown in reports, e.g. ``dgx-a100-80g``."""
    gpu: GPUSpec
    """The GPU in every slot."""
    gpus_per_node: int
    """GPUs of one host (node): the processes ``torchrun`` starts on it."""
    nodes: int
    """Hosts."""
    intra_node: LinkSpec
    """GPU-to-GPU link inside an NVLink domain (NVLink through NVSwitch), per GPU per
    direction."""
    inter_node: LinkSpec
    """Network between NVLink domains (InfiniBand, RoCE), per GPU per direction."""
    host_link: LinkSpec
    """GPU-to-CPU link (PCIe), used for offload, per GPU per direction."""
    host_memory_bytes: int
    """CPU memory per node, in bytes."""
    hbm_reserved_bytes: int = DEFAULT_HBM_RESERVED_BYTES
    """HBM per GPU the training program cannot use; see ``DEFAULT_HBM_RESERVED_BYTES``."""
    memory_headroom: float = DEFAULT_MEMORY_HEADROOM
    """Fraction of the rest the planner keeps free (``DEFAULT_MEMORY_HEADROOM``)."""
    nvlink_domain: int | None = None
    """GPUs joined by ``intra_node`` across hosts (a multi-node NVLink domain: GB200 NVL72's
    72 over 18 hosts of 4), a multiple of ``gpus_per_node``; ``None``: each host is its own
    domain. Ranks fill the domains in order (``domain_gpus``)."""
    failure_rate_per_gpu_hour: float = DEFAULT_FAILURE_RATE_PER_GPU_HOUR
    """Unexpected interruptions per GPU-hour (``DEFAULT_FAILURE_RATE_PER_GPU_HOUR``)."""
    checkpoint_bytes_per_s: float = DEFAULT_CHECKPOINT_BYTES_PER_S
    """Aggregate checkpoint storage bandwidth, write and read (``DEFAULT_CHECKPOINT_...``)."""
    relaunch_s: float = DEFAULT_RELAUNCH_S
    """Seconds to restart the job after an interruption (``DEFAULT_RELAUNCH_S``)."""
    profile: Profile | None = field(default=None, compare=False, repr=False)
    """Measured times of this machine (``autopar profile``); the cost model asks it first and
    prices what it does not cover analytically. Not part of the cluster file: ``--profile``."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise AutoparError("name must be a non-empty string", where="name", fix="write a name")
        for key, kind in (("gpu", GPUSpec), *((k, LinkSpec) for k in _LINKS)):
            if not isinstance(getattr(self, key), kind):
                raise AutoparError(f"{key} must be a {kind.__name__}", where=key,
                                   fix=f"pass a {kind.__name__}, e.g. a preset of hardware.py")
        for key in ("gpus_per_node", "nodes", "host_memory_bytes"):
            check_positive(getattr(self, key), key, integer=True)
        if self.nvlink_domain is not None:
            check_positive(self.nvlink_domain, "nvlink_domain", integer=True)
            if self.nvlink_domain % self.gpus_per_node:
                raise AutoparError(
                    f"nvlink_domain={self.nvlink_domain} is not a multiple of gpus_per_node="
                    f"{self.gpus_per_node}: a domain joins whole hosts", where="nvlink_domain",
                    fix=_HINT["nvlink_domain"] + ", or leave it out (one host a domain)")
        check_plausible(self.host_memory_bytes, "host_memory_bytes", "host_memory_bytes")
        reserved = self.hbm_reserved_bytes
        if isinstance(reserved, bool) or not isinstance(reserved, int) or \
                not 0 <= reserved < self.gpu.hbm_bytes:
            raise AutoparError(f"hbm_reserved_bytes must be an integer from 0 to below "
                               f"gpu.hbm_bytes ({self.gpu.hbm_bytes}), got {reserved!r}",
                               where="hbm_reserved_bytes", fix=_HINT["hbm_reserved_bytes"])
        if reserved:  # 0 reserves nothing: an idealized GPU, allowed
            check_plausible(reserved, "hbm_reserved_bytes", "hbm_reserved_bytes")
        if self.profile is not None and not isinstance(self.profile, Profile):
            raise AutoparError(f"profile must be a Profile, not a {type(self.profile).__name__}",
                               where="profile", fix="pass Profile.load(path)")
        for key in _RUN_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not 0 <= value < math.inf or (key == "checkpoint_bytes_per_s" and not value):
                raise AutoparError(f"{key} must be a finite number >= 0"
                                   + (" and > 0" if key == "checkpoint_bytes_per_s" else "")
                                   + f", got {value!r}", where=key, fix=_HINT[key])
        h = self.memory_headroom
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not 0 <= h < 0.5:
            raise AutoparError(f"memory_headroom must be a fraction from 0 to below 0.5, got "
                               f"{h!r}", where="memory_headroom", fix=_HINT["memory_headroom"])

    @property
    def num_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def domain_gpus(self) -> int:
        """GPUs of one NVLink domain (``nvlink_domain``, or a host's), at most the cluster's."""
        return min(self.nvlink_domain or self.gpus_per_node, self.num_gpus)

    @property
    def usable_hbm_bytes(self) -> int:
        """HBM per GPU a plan may fill: ``gpu.hbm_bytes - hbm_reserved_bytes``, less the
        ``memory_headroom`` fraction of that."""
        return int((self.gpu.hbm_bytes - self.hbm_reserved_bytes) * (1 - self.memory_headroom))

    def with_nodes(self, nodes: int) -> ClusterSpec:
        """The same cluster with ``nodes`` nodes."""
        return replace(self, nodes=nodes)

    def with_profile(self, profile: Profile | None) -> ClusterSpec:
        """The same cluster priced with ``profile``'s measurements first."""
        return replace(self, profile=profile)

    @classmethod
    def preset(cls, name: str, nodes: int = 1) -> ClusterSpec:
        """A built-in cluster (see ``preset_names()``) with ``nodes`` nodes."""
        if name not in _PRESETS:
            raise AutoparError(f"no cluster preset called {name!r}", where="cluster",
                               fix=f"use one of {', '.join(_PRESETS)}"
                                   + did_you_mean(name, _PRESETS))
        return _PRESETS[name].with_nodes(nodes)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ClusterSpec:
        """Read a cluster from a ``.yaml``/``.yml`` or ``.json`` file; see ``from_dict``."""
        p = Path(path)
        kind = p.suffix.lower()
        if kind not in CLUSTER_FILE_SUFFIXES:
            raise AutoparError(f"cannot tell the format of {p.name!r} from its extension",
                               where=str(p), fix="name the file *.yaml, *.yml or *.json")
        try:
            text = p.read_text()
        except OSError as e:
            raise AutoparError(f"cannot read the cluster file ({e.strerror})", where=str(p),
                               fix="check the path, or use a preset name instead") from None
        try:
            data = json.loads(text) if kind == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as e:
            mark = getattr(e, "problem_mark", None)
            line = getattr(e, "lineno", None) or (mark.line + 1 if mark is not None else "?")
            problem = getattr(e, "problem", None) or getattr(e, "msg", None) or str(e)
            raise AutoparError(f"the file does not parse as {kind[1:].upper()}: {problem}",
                               where=f"{p}, line {line}", fix="fix the syntax there") from None
        return cls.from_dict(data, where=str(p), default_name=p.stem)

    @classmethod
    def from_dict(cls, data: object, *, where: str = "", default_name: str = "custom"
                  ) -> ClusterSpec:
        """Build from the ``to_dict`` layout. ``base: <preset>`` starts from that preset and
        overrides what is given (``gpu``, links and ``peak_flop_per_s`` merge key by key);
        ``gpu`` and each link may also name a preset of ``hardware.GPUS``/``hardware.LINKS``.
        Errors give ``where`` (the file) and the dotted field."""
        loc = f"{where}: " if where else ""
        top = _as_map(data, "", loc, _TOP_KEYS)
        merged: dict[str, Any] = {}
        base = top.pop("base", None)
        if base is not None:
            with _located(loc, "base", replace_where=True):
                merged = cls.preset(str(base)).to_dict()
        merged["name"] = default_name
        for key, value in top.items():
            if key in _SECTION_KEYS:
                section = _section(key, value, loc)
                if not isinstance(value, str):  # a map overrides; a preset name replaces
                    section.setdefault("source", (where or "user input") +
                                       (f", over preset {base}" if base is not None else ""))
                    section = _merge(merged.get(key, {}), section)
                value = section
            merged[key] = value
        return _build(merged, loc)

    def to_dict(self) -> dict[str, Any]:
        """The file layout: ``from_dict(to_dict())`` gives back an equal spec."""
        domain = {"nvlink_domain": self.nvlink_domain} if self.nvlink_domain else {}
        return {"name": self.name, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                **domain,
                "gpu": asdict(self.gpu), **{k: asdict(getattr(self, k)) for k in _LINKS},
                "host_memory_bytes": self.host_memory_bytes,
                "hbm_reserved_bytes": self.hbm_reserved_bytes,
                "memory_headroom": self.memory_headroom,
                **{k: getattr(self, k) for k in _RUN_KEYS
                   if getattr(self, k) != _RUN_DEFAULTS[k]}}

    def to_file(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_dict()`` as JSON (``.json``) or YAML (otherwise)."""
        d, p = self.to_dict(), Path(path)
        p.write_text(json.dumps(d, indent=2) if p.suffix.lower() == ".json"
                     else yaml.safe_dump(d, sort_keys=False))

    def describe(self) -> list[tuple[str, str]]:
        """Rows of (field, value with units) for a table a person reads."""
        g = self.gpu
        peaks = ", ".join(f"{d} {v / 1e12:.4g}" for d, v in g.peak_flop_per_s.items())
        rows = [("Cluster", f"{self.name}: {self.nodes} x {self.gpus_per_node} = "
                            f"{self.num_gpus} x {g.name}"),
                ("Peak per GPU", f"{peaks} TFLOP/s (dense)"),
                ("HBM", f"{format_bytes(g.hbm_bytes)}, {format_bytes_per_s(g.hbm_bytes_per_s)}"),
                ("HBM usable", f"{format_bytes(self.usable_hbm_bytes)} "
                               f"({format_bytes(self.hbm_reserved_bytes)} reserved, "
                               f"{self.memory_headroom:.0%} headroom)")]
        if self.nvlink_domain:
            hosts = self.nvlink_domain // self.gpus_per_node
            rows.append(("NVLink domain", f"{self.nvlink_domain} GPUs ({hosts} nodes of "
                                          f"{self.gpus_per_node}) joined by "
                                          f"{self.intra_node.name}"))
        for label, lk in zip(("Intra-node", "Inter-node", "Host link"),
                             (self.intra_node, self.inter_node, self.host_link)):
            rows.append((label, f"{lk.name}: {format_bytes_per_s(lk.bytes_per_s)} per GPU per "
                                f"direction, {lk.latency_s * 1e6:.3g} us"))
        rows.append(("Host memory", f"{format_bytes(self.host_memory_bytes)} per node"))
        if self.profile is not None:
            p = self.profile
            rows.append(("Profile", f"{p.source or 'given'}: {p.device}, {p.compute_dtype}, "
                                    f"{p.nproc} x {p.backend}, measured {p.date}"))
        return rows


def process_cluster(nproc: int, like: str = "hgx-h100-80g") -> ClusterSpec:
    """A one-node cluster of ``nproc`` GPUs of preset ``like``: what a plan given as flags is
    priced on when it is verified on ``nproc`` CPU processes."""
    base = ClusterSpec.preset(like, nodes=1)
    return replace(base, name=f"{like}-{nproc}gpu", gpus_per_node=nproc)


def preset_names() -> list[str]:
    """Names accepted by ``ClusterSpec.preset``."""
    return list(_PRESETS)


def _merge(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """``new`` over ``old``; maps inside (``peak_flop_per_s``) merge key by key too."""
    return {**old, **{k: {**old[k], **v} if isinstance(v, Mapping) and
                      isinstance(old.get(k), Mapping) else v for k, v in new.items()}}


def _as_map(value: object, dotted: str, loc: str, known: tuple[str, ...] | None) -> dict[str, Any]:
    """``value`` as a dict with string keys, every key among ``known`` (if given)."""
    if not isinstance(value, Mapping):
        raise AutoparError(f"{dotted or 'the cluster'} must be a map of keys to values, not "
                           f"{type(value).__name__}", where=f"{loc}{dotted or 'top level'}",
                           fix="write `key: value` lines (YAML) or an object (JSON)")
    for key in value:
        if known is not None and key not in known:
            field = f"{dotted}.{key}" if dotted else key
            raise AutoparError(f"unknown key {key!r}", where=f"{loc}{field}",
                               fix=f"remove it or fix its spelling{did_you_mean(str(key), known)};"
                                   f" known keys: {', '.join(known)}")
    return {str(k): v for k, v in value.items()}


def _section(key: str, value: object, loc: str) -> dict[str, Any]:
    """A ``gpu`` or link section as a dict; a preset name expands to that preset's fields."""
    if isinstance(value, str):
        with _located(loc, key, replace_where=True):
            return asdict(gpu_preset(value) if key == "gpu" else link_preset(value))
    return _as_map(value, key, loc, _SECTION_KEYS[key])


def _get(section: Mapping[str, Any], key: str, dotted: str, loc: str) -> Any:
    if key not in section:
        raise AutoparError(f"required field {dotted} is missing", where=f"{loc}{dotted}",
                           fix=f"add {dotted}: {_HINT.get(key, 'a value')}, or start from a "
                               f"preset with `base:` ({', '.join(_PRESETS)})")
    return section[key]


def _number(section: Mapping[str, Any], key: str, dotted: str, loc: str, *,
            integer: bool = False, default: float | None = None) -> Any:
    """``section[key]`` as a number: an int, a float, or a string such as "989e12"."""
    value = section.get(key, default) if default is not None else _get(section, key, dotted, loc)
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if isinstance(value, str):
        text = value.strip()
        with suppress(ValueError):
            number = int(text) if text.lstrip("+-").isdigit() else float(text)
    if number is not None and math.isfinite(number) and (not integer or float(number).is_integer()):
        return int(number) if integer else float(number)
    raise AutoparError(f"{dotted} must be {'a whole number' if integer else 'a number'}, got "
                       f"{value!r}", where=f"{loc}{dotted}",
                       fix=f"write a plain number, {_HINT.get(key, 'e.g. 989e12')}; "
                           "the unit is in the key name")


def _build(d: dict[str, Any], loc: str) -> ClusterSpec:
    """Check presence and types and convert numbers here; the dataclasses check the ranges."""
    g = _as_map(_get(d, "gpu", "gpu", loc), "gpu", loc, _SECTION_KEYS["gpu"])
    peak = _as_map(_get(g, "peak_flop_per_s", "gpu.peak_flop_per_s", loc),
                   "gpu.peak_flop_per_s", loc, None)
    args = (str(_get(g, "name", "gpu.name", loc)),
            {k: _number(peak, k, f"gpu.peak_flop_per_s.{k}", loc) for k in peak},
            _number(g, "hbm_bytes", "gpu.hbm_bytes", loc, integer=True),
            _number(g, "hbm_bytes_per_s", "gpu.hbm_bytes_per_s", loc), str(g.get("source", "")),
            _number(g, "sm_count", "gpu.sm_count", loc, integer=True) if g.get("sm_count") is not None else None)
    with _located(loc, "gpu."):
        gpu = GPUSpec(*args)
    links = {}
    for key in _LINKS:
        s = _as_map(_get(d, key, key, loc), key, loc, _SECTION_KEYS[key])
        bandwidth = _number(s, "bytes_per_s", f"{key}.bytes_per_s", loc)
        latency = _number(s, "latency_s", f"{key}.latency_s", loc)
        with _located(loc, f"{key}."):
            links[key] = LinkSpec(str(s.get("name", key)), bandwidth, latency,
                                  str(s.get("source", "")))
    ints = {k: _number(d, k, k, loc, integer=True) for k in
            ("gpus_per_node", "nodes", "host_memory_bytes")}
    if d.get("nvlink_domain") is not None:
        ints["nvlink_domain"] = _number(d, "nvlink_domain", "nvlink_domain", loc, integer=True)
    ints["hbm_reserved_bytes"] = _number(d, "hbm_reserved_bytes", "hbm_reserved_bytes", loc,
                                         integer=True, default=DEFAULT_HBM_RESERVED_BYTES)
    headroom = _number(d, "memory_headroom", "memory_headroom", loc,
                       default=DEFAULT_MEMORY_HEADROOM)
    run = {k: _number(d, k, k, loc) for k in _RUN_KEYS if d.get(k) is not None}
    with _located(loc, ""):
        return ClusterSpec(str(_get(d, "name", "name", loc)), gpu, **links, **ints,
                           memory_headroom=headroom, **run)


@contextmanager
def _located(loc: str, prefix: str, *, replace_where: bool = False) -> Iterator[None]:
    """Re-raise an ``AutoparError`` at ``loc`` + ``prefix`` (+ its own field unless replaced);
    a message that starts with its field names the prefixed field (``inter_node.bytes_per_s``)."""
    try:
        yield
    except AutoparError as e:
        field = prefix if replace_where else prefix + e.where
        named = not replace_where and bool(e.where) and e.what.startswith(f"{e.where} ")
        raise AutoparError(prefix + e.what if named else e.what, where=f"{loc}{field}",
                           fix=e.fix) from None


_PRESETS: dict[str, ClusterSpec] = {name: ClusterSpec(name, gpu, 8, 1, intra, inter, host, memory)
                                    for name, gpu, intra, inter, host, memory in (
    ("dgx-a100-80g", A100_SXM4_80GB, NVLINK3, IB_HDR, PCIE4_X16, 2 * TiB),
    ("dgx-a100-40g", A100_SXM4_40GB, NVLINK3, IB_HDR, PCIE4_X16, 1 * TiB),
    ("hgx-h100-80g", H100_SXM5_80GB, NVLINK4, IB_NDR, PCIE5_X16, 2 * TiB),
    ("hgx-h100-roce", H100_SXM5_80GB, NVLINK4, ROCE_400G, PCIE5_X16, 2 * TiB),
    ("hgx-h200", H200_SXM_141GB, NVLINK4, IB_NDR, PCIE5_X16, 2 * TiB),
    ("hgx-h800", H800_SXM5_80GB, NVLINK4_H800, IB_NDR, PCIE5_X16, 2 * TiB),
    ("dgx-b200", B200_180GB, NVLINK5, IB_NDR, PCIE5_X16, 2 * TB),  # [DGXB200] 2 TB
)}
_PRESETS["gb200-nvl72"] = ClusterSpec(  # [GB200]: a compute tray is a host of 4 GPUs
    "gb200-nvl72", B200_GB200_186GB, 4, 1, NVLINK5, IB_NDR, NVLINK_C2C, 2 * 480 * GB,
    nvlink_domain=72)


def profile_cluster(profile: Profile) -> ClusterSpec:
    """The one-node cluster a profile measured, each process a "GPU": what a CPU machine's
    processes (gloo) are planned on. Its figures come from the profile -- the peak is the
    fastest GEMM of the grid, the memory bandwidth the fastest memory-bound point, each link the
    largest send-recv's bandwidth and the smallest one's time as latency, memory the machine's
    shared by the processes, less 512 MiB each for the interpreter and torch (~0.4-0.6 GB per
    rank measured, ../shared/design/FINDINGS.md) -- and a figure outside ``PLAUSIBLE`` is put at
    its edge, as its ``source`` says. The profile prices what it measured; these numbers price
    the rest and are the MFU's denominator."""
    src = f"measured by autopar profile ({profile.source or 'in memory'}, {profile.date})"
    notes: list[str] = []

    def within(value: float, kind: str, label: str) -> float:
        r = PLAUSIBLE[kind]
        clamped = min(max(value, r.low), r.high)
        if clamped != value:
            notes.append(f"{label} {value:.3g} outside the plausible range, set to {clamped:.3g}")
        return clamped

    if profile.gemm is None or profile.memory is None or profile.host_memory_bytes is None:
        raise AutoparError("the profile lacks the GEMM, memory-bound or host-memory figures a "
                           "cluster is made of", where=profile.source or "profile",
                           fix="measure a full profile with `autopar profile`")
    g = profile.gemm
    peak = max(2 * m * n * k / g.at(m, n, k) for m in g.rows for n in g.cols for k in g.depth)
    hbm_s = max(x / s for x, s in zip(profile.memory.x, profile.memory.seconds))
    share = profile.host_memory_bytes // profile.nproc
    link = profile.collectives.get(collective_key(Collective.SEND_RECV, 2, 2))
    if link is not None:
        bandwidth, latency = link.x[-1] / link.seconds[-1], link.seconds[0]
    else:  # one process: no link to measure; the memory stands in for it
        bandwidth, latency = hbm_s, 1e-6
    peak = within(peak, "peak_flop_per_s", "peak")
    hbm_s = within(hbm_s, "hbm_bytes_per_s", "memory bandwidth")
    bandwidth = within(bandwidth, "bytes_per_s", "link bandwidth")
    latency = within(latency, "latency_s", "link latency")
    host = within(hbm_s, "bytes_per_s", "host link")
    hbm = int(within(share - 512 * 2**20, "hbm_bytes", "memory"))
    host_memory = int(within(profile.host_memory_bytes, "host_memory_bytes", "host memory"))
    src += ("; " + "; ".join(notes)) if notes else ""
    gpu = GPUSpec(f"process of {profile.device}", {profile.compute_dtype: peak},
                  hbm, hbm_s, src)
    one = LinkSpec(f"{profile.backend} (same host)", bandwidth, latency, src)
    return ClusterSpec(f"profiled-{profile.backend}-{profile.nproc}", gpu, profile.nproc, 1, one,
                       one, LinkSpec("host memory", host, 1e-6, src),
                       host_memory,
                       hbm_reserved_bytes=0, profile=profile)
