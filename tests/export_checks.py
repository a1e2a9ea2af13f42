"""What the export tests share: a plan of a zoo model on a preset, and the frameworks' own code
as ``scripts/fetch_frameworks.py`` unpacked it (each test skipped, saying so, where it has not
been fetched)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

import autopar
from autopar import ClusterSpec, ParallelConfig, TrainSpec
from autopar.core.specs import Checkpoint
from bench_scripts import load_file

FETCH = load_file(Path(__file__).resolve().parents[1] / "scripts" / "fetch_frameworks.py",
                  "fetch_frameworks")


def plan(model: str, cluster: str, nodes: int, train: TrainSpec, **config):
    """``model`` planned with ``config`` on ``nodes`` of the preset ``cluster``; its traced graph
    kept in the run's trace cache (``tests/conftest.py``), which the export tests' plans of one
    model, batch and sequence share across their modules and workers."""
    return autopar.plan_for(autopar.models.build(model), ClusterSpec.preset(cluster, nodes=nodes),
                            train, ParallelConfig(**config), name=model, trace_cache=True)


H100 = "hgx-h100-80g"


def gpt175b():
    """GPT-175B on 128 DGX A100 nodes as Megatron-LM's paper ran it: tp 8, pp 8 (v 3), full."""
    return plan("gpt-175b", "dgx-a100-80g", 128, TrainSpec(global_batch=1536, seq_len=2048),
                dp=16, tp=8, pp=8, micro_batch=1, schedule="interleaved", virtual_stages=3,
                sequence_parallel=True, zero=1, checkpoint="full")


def llama_interleaved(precision: str = "fp16"):
    """Llama 3 8B: interleaved pp 2 x v 2, tp 2 with sequence parallelism, ZeRO-1, selective."""
    return plan("llama3-8b", H100, 2, TrainSpec(global_batch=64, seq_len=4096,
                                                precision=precision),
                dp=4, tp=2, pp=2, micro_batch=1, schedule="interleaved", virtual_stages=2,
                sequence_parallel=True, zero=1, checkpoint="selective")


def llama_zero3_offload():
    """Llama 3 8B: ZeRO-3 over 16 GPUs, full recomputation, optimizer offload, bf16."""
    return plan("llama3-8b", H100, 2, TrainSpec(global_batch=64, seq_len=4096),
                dp=16, zero=3, checkpoint="full", offload=True)


def llama_uneven_blocks():
    """Llama 3 8B over pp 3 (stages of 11, 11, 10 blocks), the first 4 of each recomputed."""
    policies = []
    for size in (11, 11, 10):
        policies += [Checkpoint.FULL] * 4 + [Checkpoint.NONE] * (size - 4)
    return plan("llama3-8b", H100, 3, TrainSpec(global_batch=48, seq_len=4096),
                dp=8, tp=1, pp=3, micro_batch=1, zero=1, checkpoint=tuple(policies))


def mixtral_ep8():
    """Mixtral 8x7B over 16 GPUs, ep 8, ZeRO-1: the experts' count and width to carry."""
    return plan("mixtral-8x7b", H100, 2, TrainSpec(global_batch=64, seq_len=4096),
                dp=16, ep=8, zero=1, micro_batch=1)


def llama_fp8():
    """Llama 3 8B in fp8 (tensorwise: FP8 weight all-gather under ZeRO-3) on 16 GPUs."""
    return plan("llama3-8b", H100, 2, TrainSpec(global_batch=64, seq_len=4096, precision="fp8"),
                dp=16, zero=3, checkpoint="full")


FIXTURES = {"gpt175b": gpt175b, "llama_zero3_offload": llama_zero3_offload,
            "llama_uneven_blocks": llama_uneven_blocks, "mixtral_ep8": mixtral_ep8,
            "llama_fp8": llama_fp8}
"""The plan kinds every framework's run test covers, by name (each adds its own)."""


def megatron_dir() -> Path:
    """The unpacked megatron-core wheel (its ``megatron`` package inside)."""
    path = FETCH.megatron_dir()
    if not (path / "megatron" / "training" / "arguments.py").exists():
        pytest.skip(f"Megatron-LM's code is not fetched ({path}): "
                    "python3 scripts/fetch_frameworks.py")
    return path


def bridge_dirs() -> list[Path]:
    """The unpacked megatron-bridge wheel, its dependencies and the megatron-core wheel, in
    the order Bridge's process puts them on ``sys.path``; skipped, saying so, where one is not
    fetched."""
    root = FETCH.frameworks_dir()
    dirs = [FETCH.bridge_dir(root), FETCH.bridge_dependencies_dir(root), megatron_dir()]
    if not (dirs[0] / "megatron" / "bridge" / "recipes").exists() or \
            not (dirs[1] / "requirements.txt").exists():
        pytest.skip(f"Megatron-Bridge {FETCH.MEGATRON_BRIDGE}'s code is not fetched ({root}): "
                    "python3 scripts/fetch_frameworks.py")
    return dirs


def torchtitan_configs() -> ModuleType:
    """torchtitan's ``torchtitan/config/configs.py`` loaded on its own: its dataclasses need
    only torch, where the package's ``__init__`` imports its CLI's dependencies."""
    path = FETCH.torchtitan_dir() / "torchtitan" / "config" / "configs.py"
    if not path.exists():
        pytest.skip(f"torchtitan's code is not fetched ({path}): "
                    "python3 scripts/fetch_frameworks.py")
    return load_file(path, f"torchtitan_{FETCH.TORCHTITAN.replace('.', '_')}_configs")


def torchtitan_package() -> ModuleType:
    """The unpacked torchtitan wheel importable as ``torchtitan`` (its folder put on
    ``sys.path``), with its trainer imported: what an exported ``autopar_plan.py`` imports.
    Skipped, saying what is missing, where the wheel is not fetched or a dependency of its
    trainer (the ``test`` extra's spmd_types, tyro, torchdata, tensorboard, datasets) is not
    installed."""
    root = FETCH.torchtitan_dir()
    if not (root / "torchtitan" / "trainer.py").exists():
        pytest.skip(f"torchtitan's code is not fetched ({root}): "
                    "python3 scripts/fetch_frameworks.py")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        importlib.import_module("torchtitan.trainer")
    except ModuleNotFoundError as e:
        pytest.skip(f"torchtitan {FETCH.TORCHTITAN}'s trainer needs {e.name}: "
                    "pip install -e '.[test]'")
    return importlib.import_module("torchtitan")
