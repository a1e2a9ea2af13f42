"""ClusterSpec presets hold the datasheet numbers; files load, round-trip and fail helpfully."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from autopar.costmodel import hardware
from autopar.costmodel.cluster import (DEFAULT_HBM_RESERVED_BYTES, DEFAULT_MEMORY_HEADROOM,
                                       ClusterSpec, preset_names)
from autopar.core.errors import AutoparError
from autopar.costmodel.hardware import GiB, GPUSpec, LinkSpec

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "clusters" / "h100-roce.yaml"


# --- presets hold the published figures (exact: they are copied from the datasheets) -----------

def test_a100_80gb_has_datasheet_numbers() -> None:
    gpu = hardware.A100_SXM4_80GB
    assert gpu.peak("bf16") == gpu.peak("fp16") == 312e12
    assert gpu.peak("tf32") == 156e12
    assert gpu.peak("fp32") == 19.5e12
    assert gpu.peak("fp64") == 19.5e12  # FP64 tensor core; the vector figure is 9.7
    assert gpu.hbm_bytes == 80 * 2**30 and gpu.hbm_bytes_per_s == 2.039e12
    assert hardware.A100_SXM4_40GB.hbm_bytes == 40 * 2**30
    assert hardware.A100_SXM4_40GB.hbm_bytes_per_s == 1.555e12


def test_hopper_has_dense_datasheet_numbers() -> None:
    for gpu in (hardware.H100_SXM5_80GB, hardware.H200_SXM_141GB):
        assert gpu.peak("bf16") == gpu.peak("fp16") == 989e12
        assert gpu.peak("fp8") == 1979e12
        assert gpu.peak("tf32") == 494e12
        assert gpu.peak("fp32") == 67e12
    assert hardware.H100_SXM5_80GB.hbm_bytes == 80 * 2**30
    assert hardware.H100_SXM5_80GB.hbm_bytes_per_s == 3.35e12
    assert hardware.H200_SXM_141GB.hbm_bytes == 141 * 10**9  # NVIDIA states decimal GB
    assert hardware.H200_SXM_141GB.hbm_bytes_per_s == 4.8e12


def test_links_are_per_gpu_per_direction() -> None:
    assert hardware.NVLINK3.bytes_per_s == 600e9 / 2
    assert hardware.NVLINK4.bytes_per_s == 900e9 / 2
    assert hardware.IB_HDR.bytes_per_s == 200e9 / 8
    assert hardware.IB_NDR.bytes_per_s == hardware.ROCE_400G.bytes_per_s == 400e9 / 8
    assert hardware.PCIE4_X16.bytes_per_s == 32e9 and hardware.PCIE5_X16.bytes_per_s == 64e9
    for link in hardware.LINKS.values():
        assert 1e-7 < link.latency_s < 1e-5, link.name  # microseconds, not milliseconds
        assert link.source


def test_every_preset_cites_sources() -> None:
    for spec in (*hardware.GPUS.values(), *hardware.LINKS.values()):
        assert "datasheet" in spec.source or "NCCL" in spec.source or "PCIe" in spec.source


def test_cluster_presets() -> None:
    assert set(preset_names()) >= {"dgx-a100-80g", "dgx-a100-40g", "hgx-h100-80g", "hgx-h200"}
    a100 = ClusterSpec.preset("dgx-a100-80g", nodes=16)
    assert a100.num_gpus == 128 and a100.gpus_per_node == 8
    assert a100.intra_node is hardware.NVLINK3 and a100.inter_node is hardware.IB_HDR
    assert a100.host_memory_bytes == 2 * 2**40
    h100 = ClusterSpec.preset("hgx-h100-80g")
    assert h100.nodes == 1 and h100.inter_node is hardware.IB_NDR
    assert h100.host_link is hardware.PCIE5_X16
    assert ClusterSpec.preset("hgx-h200").gpu is hardware.H200_SXM_141GB
    assert ClusterSpec.preset("dgx-a100-40g").gpu is hardware.A100_SXM4_40GB


def test_usable_hbm_is_total_minus_reserved() -> None:
    for name in preset_names():
        c = ClusterSpec.preset(name)
        assert 0 < c.usable_hbm_bytes < c.gpu.hbm_bytes
        assert c.usable_hbm_bytes == int((c.gpu.hbm_bytes - DEFAULT_HBM_RESERVED_BYTES)
                                         * (1 - DEFAULT_MEMORY_HEADROOM))


def test_with_nodes_keeps_everything_else() -> None:
    c = ClusterSpec.preset("hgx-h100-80g")
    assert c.with_nodes(4).num_gpus == 32 and c.with_nodes(4).gpu == c.gpu


def test_describe_rows_say_units() -> None:
    rows = dict(ClusterSpec.preset("dgx-a100-80g", nodes=2).describe())
    assert rows["HBM"] == "80 GiB, 2.039 TB/s"
    assert rows["HBM usable"] == "72.2 GiB (4 GiB reserved, 5% headroom)"
    assert "300 GB/s" in rows["Intra-node"] and "1 x" not in rows["Cluster"]
    assert "141 GB" in dict(ClusterSpec.preset("hgx-h200").describe())["HBM"]


def test_unknown_preset_suggests_the_closest() -> None:
    with pytest.raises(AutoparError, match="dgx-a100-80g"):
        ClusterSpec.preset("dgx-a100-80")


def test_peak_of_missing_dtype_is_an_autopar_error() -> None:
    with pytest.raises(AutoparError, match="fp8"):
        hardware.A100_SXM4_80GB.peak("fp8")


@pytest.mark.parametrize("field", ["nodes", "gpus_per_node", "host_memory_bytes"])
def test_direct_construction_rejects_non_positive(field: str) -> None:
    with pytest.raises(AutoparError) as info:
        ClusterSpec(**{**vars(ClusterSpec.preset("hgx-h100-80g")), field: 0})
    assert info.value.where == field


def test_reserved_must_leave_some_hbm() -> None:
    fields = vars(ClusterSpec.preset("hgx-h100-80g"))
    with pytest.raises(AutoparError, match="hbm_reserved_bytes"):
        ClusterSpec(**{**fields, "hbm_reserved_bytes": 80 * GiB})


def test_specs_validate_their_fields() -> None:
    with pytest.raises(AutoparError, match="latency_s"):
        LinkSpec("x", 1e9, -1.0)
    with pytest.raises(AutoparError, match="fp2"):
        GPUSpec("x", {"fp2": 1e15}, 1, 1.0)


# --- files -------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
@pytest.mark.parametrize("name", ["dgx-a100-80g", "hgx-h200"])
def test_file_round_trip(tmp_path: Path, suffix: str, name: str) -> None:
    cluster = ClusterSpec.preset(name, nodes=3)
    path = tmp_path / f"c{suffix}"
    cluster.to_file(path)
    assert ClusterSpec.from_file(path) == cluster


def test_json_written_by_hand_round_trips(tmp_path: Path) -> None:
    cluster = ClusterSpec.preset("hgx-h100-roce", nodes=2)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cluster.to_dict()))
    assert ClusterSpec.from_file(path) == cluster


def test_example_file_loads() -> None:
    c = ClusterSpec.from_file(EXAMPLE)
    assert c.name == "my-h100-roce" and c.num_gpus == 128
    assert c.inter_node.bytes_per_s == 50e9 and c.inter_node.latency_s == 5e-6
    assert c.gpu.peak("fp8") == 1979e12 and c.gpu.peak("fp64") == 67e12  # fp64 from the base
    assert c.host_link.name == "PCIe-Gen5-x16"  # kept from the base


def _write(tmp_path: Path, data: object, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if isinstance(data, dict) else str(data))
    return path


def test_base_overrides_only_what_is_given(tmp_path: Path) -> None:
    path = _write(tmp_path, {"base": "hgx-h100-80g", "nodes": "4",
                             "gpu": {"hbm_bytes_per_s": "3.0e12",
                                     "peak_flop_per_s": {"bf16": 800e12}},
                             "inter_node": "RoCE-400GbE", "hbm_reserved_bytes": 2 * GiB})
    c = ClusterSpec.from_file(path)
    base = ClusterSpec.preset("hgx-h100-80g")
    assert c.name == "c" and c.nodes == 4 and c.gpus_per_node == 8
    assert c.gpu.hbm_bytes_per_s == 3.0e12 and c.gpu.hbm_bytes == base.gpu.hbm_bytes
    assert c.gpu.peak("bf16") == 800e12 and c.gpu.peak("fp8") == 1979e12
    assert str(path) in c.gpu.source  # overridden numbers say where they came from
    assert c.inter_node == hardware.ROCE_400G and c.intra_node == base.intra_node
    assert c.usable_hbm_bytes == int((base.gpu.hbm_bytes - 2 * GiB) * (1 - c.memory_headroom))


def test_numbers_may_be_strings_ints_or_floats(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"  # PyYAML reads 989e12 (no dot) as a string
    path.write_text("base: dgx-a100-80g\nnodes: 2.0\ngpu: {peak_flop_per_s: {bf16: 989e12}}\n"
                    "host_memory_bytes: '1e12'\n")
    c = ClusterSpec.from_file(path)
    assert c.nodes == 2 and isinstance(c.nodes, int)
    assert c.gpu.peak("bf16") == 989e12 and c.host_memory_bytes == 10**12


def _full() -> dict:
    d = ClusterSpec.preset("hgx-h100-80g").to_dict()
    for section in ("gpu", "intra_node", "inter_node", "host_link"):
        d[section].pop("source")
    return d


def _error(tmp_path: Path, data: object, name: str = "c.yaml") -> AutoparError:
    path = _write(tmp_path, data, name)
    with pytest.raises(AutoparError) as info:
        ClusterSpec.from_file(path)
    assert str(path) in info.value.where and info.value.fix
    return info.value


def test_full_file_without_base_loads(tmp_path: Path) -> None:
    c = ClusterSpec.from_file(_write(tmp_path, _full()))
    assert c.gpu.peak("bf16") == 989e12 and c.intra_node.bytes_per_s == 450e9


@pytest.mark.parametrize("section, key", [(None, "nodes"), ("gpu", "hbm_bytes"),
                                          ("gpu", "peak_flop_per_s"), ("inter_node", "latency_s"),
                                          (None, "host_link")])
def test_missing_field_is_named(tmp_path: Path, section: str | None, key: str) -> None:
    d = _full()
    (d[section] if section else d).pop(key)
    dotted = f"{section}.{key}" if section else key
    e = _error(tmp_path, d)
    assert e.where.endswith(dotted) and "missing" in e.what and dotted in e.fix


def test_unknown_key_suggests_the_closest(tmp_path: Path) -> None:
    e = _error(tmp_path, {"base": "hgx-h200", "gpu": {"hbm_byte": 1}})
    assert e.where.endswith("gpu.hbm_byte") and "'hbm_bytes'" in e.fix
    e = _error(tmp_path, {"base": "hgx-h200", "node": 2})
    assert e.where.endswith(": node") and "'nodes'" in e.fix
    e = _error(tmp_path, {"base": "hgx-h200", "gpu": {"peak_flop_per_s": {"bf61": 1e15}}})
    assert e.where.endswith("gpu.peak_flop_per_s.bf61") and "'bf16'" in e.fix


@pytest.mark.parametrize("section, key, value", [
    ("gpu", "hbm_bytes", "80 GiB"), ("intra_node", "bytes_per_s", "fast"), (None, "nodes", 2.5),
    (None, "nodes", True), ("gpu", "hbm_bytes_per_s", "inf"), ("host_link", "latency_s", None)])
def test_non_number_is_named(tmp_path: Path, section: str | None, key: str, value: object) -> None:
    d = _full()
    (d[section] if section else d)[key] = value
    e = _error(tmp_path, d)
    dotted = f"{section}.{key}" if section else key
    assert e.where.endswith(dotted) and "number" in e.what and "plain number" in e.fix


@pytest.mark.parametrize("section, key, value", [
    ("gpu", "hbm_bytes", 0), ("inter_node", "bytes_per_s", "-50e9"), (None, "nodes", 0),
    (None, "gpus_per_node", -8), ("host_link", "latency_s", 0), (None, "host_memory_bytes", 0),
    ("gpu", "peak_flop_per_s", {"bf16": -1}), (None, "hbm_reserved_bytes", -1)])
def test_non_positive_is_named(tmp_path: Path, section: str | None, key: str,
                              value: object) -> None:
    d = _full()
    (d[section] if section else d)[key] = value
    e = _error(tmp_path, d)
    dotted = f"{section}.{key}" if section else key
    assert dotted in e.where


# --- numbers in the wrong unit are refused with the conversion they need -------------------------

@pytest.mark.parametrize("section, key, value, meant", [
    ("inter_node", "bytes_per_s", 400, "400 Gbit/s = 5e10 bytes/s"),
    ("intra_node", "bytes_per_s", 450, "450 GB/s = 4.5e11 bytes/s"),
    ("host_link", "bytes_per_s", 64000, "64000 MB/s = 6.4e10 bytes/s"),
    ("inter_node", "latency_s", 5, "5 us = 5e-6 s"),
    ("intra_node", "latency_s", "1900", "1900 ns = 1.9e-6 s"),
    ("gpu", "peak_flop_per_s", {"bf16": 989}, "989 TFLOP/s = 9.89e14 FLOP/s"),
    ("gpu", "hbm_bytes", 80, "80 GiB = 85899345920 bytes"),
    ("gpu", "hbm_bytes", 81920, "81920 MiB = 85899345920 bytes"),
    ("gpu", "hbm_bytes_per_s", 3.35, "3.35 TB/s = 3.35e12 bytes/s"),
    ("gpu", "hbm_bytes_per_s", 2039, "2039 GB/s = 2.039e12 bytes/s"),
    (None, "host_memory_bytes", 2, "2 TiB = 2199023255552 bytes"),
    (None, "hbm_reserved_bytes", 4, "4 GiB = 4294967296 bytes")])
def test_wrong_unit_in_file_suggests_the_conversion(tmp_path: Path, section: str | None, key: str,
                                                    value: object, meant: str) -> None:
    e = _error(tmp_path, {"base": "hgx-h100-80g", **({section: {key: value}} if section
                                                     else {key: value})})
    dotted = f"{section}.{key}" if section else key
    if isinstance(value, dict):
        dotted += ".bf16"
    assert e.where.endswith(f": {dotted}")  # the file, then the dotted field
    assert e.what.startswith(f"{dotted} = ") and "far " in e.what
    assert e.fix.startswith("did you mean ") and meant in e.fix  # 450 may be Gbit/s or GB/s
    assert "the unit is in the key name" in e.fix


def test_inter_node_in_gbit_per_s_reads_as_the_user_saw_it(tmp_path: Path) -> None:
    e = _error(tmp_path, {"base": "hgx-h100-80g", "inter_node": {"bytes_per_s": 400}})
    assert e.what == ("inter_node.bytes_per_s = 400 B/s is far below any GPU interconnect "
                      "(1e8 to 1e14 B/s)")
    assert e.fix.startswith("did you mean 400 Gbit/s = 5e10 bytes/s")
    assert e.fix.endswith("the unit is in the key name: bytes per second")


def test_wrong_unit_in_python_is_refused_too() -> None:
    with pytest.raises(AutoparError, match="400 Gbit/s = 5e10 bytes/s") as info:
        LinkSpec("IB", 400, 4e-6)
    assert info.value.where == "bytes_per_s"
    with pytest.raises(AutoparError, match="5 us = 5e-6 s"):
        LinkSpec("IB", 50e9, 5)
    with pytest.raises(AutoparError, match="989 TFLOP/s") as info:
        GPUSpec("x", {"bf16": 989}, 80 * GiB, 3.35e12)
    assert info.value.where == "peak_flop_per_s.bf16"
    with pytest.raises(AutoparError, match="80 GiB = 85899345920 bytes"):
        GPUSpec("x", {"bf16": 989e12}, 80, 3.35e12)
    with pytest.raises(AutoparError, match="3.35 TB/s = 3.35e12 bytes/s"):
        GPUSpec("x", {"bf16": 989e12}, 80 * GiB, 3.35)
    fields = vars(ClusterSpec.preset("hgx-h100-80g"))
    with pytest.raises(AutoparError, match="512 GiB") as info:
        ClusterSpec(**{**fields, "host_memory_bytes": 512})
    assert info.value.where == "host_memory_bytes"


def test_far_above_without_a_likely_unit_says_the_unit() -> None:
    with pytest.raises(AutoparError, match="far above any GPU's memory") as info:
        GPUSpec("x", {"bf16": 989e12}, 10**17, 3.35e12)
    assert "in bytes" in info.value.fix and "did you mean" not in info.value.fix


def test_ranges_bracket_every_preset() -> None:
    """The ranges are ordered, and every preset lies inside what a guess may land in."""
    for kind, r in hardware.PLAUSIBLE.items():
        assert r.low <= r.typical[0] < r.typical[1] <= r.high, kind
    inside = lambda kind, v: (  # noqa: E731
        hardware.PLAUSIBLE[kind].typical[0] <= v <= hardware.PLAUSIBLE[kind].typical[1])
    for gpu in hardware.GPUS.values():
        assert GPUSpec(**vars(gpu)) == gpu
        assert all(inside("peak_flop_per_s", v) for v in gpu.peak_flop_per_s.values())
        assert inside("hbm_bytes", gpu.hbm_bytes) and inside("hbm_bytes_per_s", gpu.hbm_bytes_per_s)
    for link in hardware.LINKS.values():
        assert LinkSpec(**vars(link)) == link
        assert inside("bytes_per_s", link.bytes_per_s) and inside("latency_s", link.latency_s)
    for name in preset_names():
        c = ClusterSpec.preset(name, nodes=2)
        assert ClusterSpec.from_dict(c.to_dict()) == c
        assert inside("host_memory_bytes", c.host_memory_bytes)
        assert inside("hbm_reserved_bytes", c.hbm_reserved_bytes)
    assert ClusterSpec.from_file(EXAMPLE).nodes == 16


def test_unusual_but_real_cluster_is_accepted(tmp_path: Path) -> None:
    """Two desktops of 4 consumer PCIe GPUs (24 GiB, 1 TB/s, weak fp64) on 10 GbE."""
    gpu = {"name": "RTX-4090", "hbm_bytes": 24 * GiB, "hbm_bytes_per_s": 1.008e12,
           "peak_flop_per_s": {"bf16": 165e12, "fp32": 82.6e12, "fp64": 1.29e12}}
    pcie4 = {"name": "PCIe-Gen4-x16", "bytes_per_s": 32e9, "latency_s": 5e-6}
    path = _write(tmp_path, {"name": "lab", "nodes": 2, "gpus_per_node": 4, "gpu": gpu,
                             "intra_node": pcie4, "host_link": pcie4,
                             "inter_node": {"bytes_per_s": 1.25e9 / 4, "latency_s": 50e-6},
                             "host_memory_bytes": 64 * GiB, "hbm_reserved_bytes": 0})
    c = ClusterSpec.from_file(path)
    assert c.inter_node.bytes_per_s == 1.25e9 / 4 and c.gpu.hbm_bytes == 24 * GiB
    assert c.usable_hbm_bytes == int(24 * GiB * 0.95)  # 0 reserved: allowed
    # one 10 GbE port shared by 8 GPUs, a 2 GiB-host edge box, an old card's fp64
    assert LinkSpec("10GbE/8", 1.25e9 / 8, 100e-6).bytes_per_s == 1.5625e8
    assert ClusterSpec(**{**vars(c), "host_memory_bytes": 2 * GiB}).host_memory_bytes == 2 * GiB
    assert GPUSpec("T4", {"fp16": 65e12, "fp64": 0.25e12}, 16 * GiB, 320e9).peak("fp64") == 2.5e11


def test_missing_file_is_an_autopar_error(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(AutoparError) as info:
        ClusterSpec.from_file(path)
    assert str(path) in info.value.where and "path" in info.value.fix


@pytest.mark.parametrize("name, text", [("c.yaml", "gpu: {name: [\n"), ("c.json", "{'nodes': 1}"),
                                        ("c.yaml", "- just\n- a list\n")])
def test_unparsable_file_is_an_autopar_error(tmp_path: Path, name: str, text: str) -> None:
    e = _error(tmp_path, text, name)
    assert "parse" in e.what or "map" in e.what


def test_unknown_extension_and_unknown_presets(tmp_path: Path) -> None:
    assert "yaml" in _error(tmp_path, "nodes: 1", "c.toml").fix
    e = _error(tmp_path, {"base": "hgx-h100"})
    assert e.where.endswith("base") and "hgx-h100-80g" in e.fix
    e = _error(tmp_path, {"base": "hgx-h100-80g", "inter_node": "IB-NDR"})
    assert e.where.endswith("inter_node") and "IB-NDR-400G" in e.fix


def test_memory_headroom_comes_from_the_file_and_is_checked(tmp_path: Path) -> None:
    base = ClusterSpec.preset("hgx-h100-80g")
    path = _write(tmp_path, {"base": "hgx-h100-80g", "memory_headroom": 0})
    c = ClusterSpec.from_file(path)
    assert c.usable_hbm_bytes == base.gpu.hbm_bytes - base.hbm_reserved_bytes
    assert ClusterSpec.from_dict(c.to_dict()) == c
    with pytest.raises(AutoparError, match="memory_headroom must be a fraction"):
        ClusterSpec.from_file(_write(tmp_path, {"base": "hgx-h100-80g", "memory_headroom": 0.6}))


def test_blackwell_presets_have_datasheet_numbers() -> None:
    """DGX B200 and GB200 NVL72 (``hardware.py`` [DGXB200], [B200], [GB200]): dense peaks are
    half the sparse figures, fp4 included; 180 GB and 186 GB (decimal) of HBM3e at 8 TB/s;
    NVLink 5 at 900 GB/s per direction; a GB200 host is a tray of 4 GPUs in a 72-GPU domain."""
    b200 = ClusterSpec.preset("dgx-b200", nodes=2)
    assert b200.gpu.peak("bf16") == 2.25e15 and b200.gpu.peak("fp8") == 4.5e15
    assert b200.gpu.peak("fp4") == 9e15
    assert b200.gpu.hbm_bytes == 180 * 10**9 and b200.gpu.hbm_bytes_per_s == 8e12
    assert b200.intra_node is hardware.NVLINK5 and b200.intra_node.bytes_per_s == 900e9
    assert b200.gpus_per_node == 8 and b200.nvlink_domain is None and b200.domain_gpus == 8
    rack = ClusterSpec.preset("gb200-nvl72", nodes=18)
    assert rack.gpus_per_node == 4 and rack.nvlink_domain == 72 and rack.num_gpus == 72
    assert rack.gpu.peak("bf16") == 2.5e15 and rack.gpu.peak("fp8") == 5e15
    assert rack.gpu.hbm_bytes == 186 * 10**9
    assert rack.host_memory_bytes == 960 * 10**9 and rack.host_link is hardware.NVLINK_C2C
    assert ClusterSpec.preset("gb200-nvl72", nodes=2).domain_gpus == 8  # part of a rack
    assert ClusterSpec.from_dict(rack.to_dict()) == rack
    assert ("NVLink domain", "72 GPUs (18 nodes of 4) joined by NVLink5") in rack.describe()


def test_an_nvlink_domain_joins_whole_hosts(tmp_path: Path) -> None:
    with pytest.raises(AutoparError, match="nvlink_domain=70 is not a multiple of "
                                           "gpus_per_node=4"):
        dataclasses.replace(ClusterSpec.preset("gb200-nvl72"), nvlink_domain=70)
    f = tmp_path / "nvl36.yaml"
    f.write_text("base: gb200-nvl72\nnvlink_domain: 36\nnodes: 18\n")
    assert ClusterSpec.from_file(f).domain_gpus == 36
