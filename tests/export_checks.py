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


A100 = "dgx-a100-80g"

ISSUE_KINDS = {
    # issue 33's eight kinds: (model, cluster, nodes, TrainSpec fields, ParallelConfig fields)
    "llama3-8b-tp2-pp2-selective": ("llama3-8b", H100, 1, dict(global_batch=64, seq_len=4096),
                                    dict(dp=2, tp=2, pp=2, micro_batch=1, zero=1,
                                         sequence_parallel=True, checkpoint="selective")),
    "llama3-70b-cp2-zero3-offload": ("llama3-70b", H100, 4, dict(global_batch=64, seq_len=8192),
                                     dict(dp=16, cp=2, zero=3, micro_batch=1, offload=True,
                                          checkpoint="full")),
    "mixtral-ep8-zero3": ("mixtral-8x7b", H100, 2, dict(global_batch=64, seq_len=4096),
                          dict(dp=16, ep=8, zero=3, micro_batch=1, checkpoint="full")),
    "gpt-175b-tp4-pp8-interleaved": ("gpt-175b", A100, 16, dict(global_batch=256,
                                                                seq_len=2048),
                                     dict(dp=4, tp=4, pp=8, micro_batch=1, zero=1,
                                          schedule="interleaved", virtual_stages=3,
                                          sequence_parallel=True, checkpoint="full")),
    "llama3-8b-cp2-tp2-zero3": ("llama3-8b", H100, 1, dict(global_batch=16, seq_len=8192),
                                dict(dp=2, cp=2, tp=2, zero=3, micro_batch=1,
                                     sequence_parallel=True, checkpoint="selective")),
    "gpt-18b-fp16-pp2": ("gpt-18b", A100, 1, dict(global_batch=32, seq_len=2048,
                                                    precision="fp16"),
                         dict(dp=4, pp=2, micro_batch=1, zero=1, checkpoint="full")),
    "llama3-70b-tp2-zero3-offload": ("llama3-70b", H100, 2, dict(global_batch=32, seq_len=4096),
                                     dict(dp=8, tp=2, zero=3, micro_batch=1, offload=True,
                                          sequence_parallel=True, checkpoint="full")),
    "gpt-7.5b-zero0-uneven-pp8": ("gpt-7.5b", A100, 1, dict(global_batch=32, seq_len=2048),
                                  dict(dp=1, pp=8, micro_batch=1, zero=0,
                                       checkpoint="none")),
    # the wave's MoE and FP8 plans
    "qwen3-30b-fold-tp2-ep8": ("qwen3-30b-a3b", H100, 2, dict(global_batch=32, seq_len=4096),
                               dict(dp=8, tp=2, ep=8, zero=1, micro_batch=1,
                                    sequence_parallel=True, checkpoint="moe")),
    "llama3-8b-fp8-tp2": ("llama3-8b", H100, 1, dict(global_batch=32, seq_len=4096,
                                                     precision="fp8"),
                          dict(dp=4, tp=2, zero=1, micro_batch=1, sequence_parallel=True)),
    # DeepSeek-V3's latent attention, shared expert and dense first layers
    "deepseek-v3-pp4-ep8": ("deepseek-v3", H100, 4, dict(global_batch=32, seq_len=4096),
                            dict(dp=8, pp=4, ep=8, zero=1, micro_batch=1)),
    # GPT-OSS's sinks, window and biases
    "gpt-oss-20b-ep4": ("gpt-oss-20b", H100, 1, dict(global_batch=16, seq_len=4096),
                        dict(dp=8, ep=4, zero=1, micro_batch=1)),
}
"""Issue 33's plan kinds (its eight, and the MoE and FP8 plans of its wave), which every
target's run test takes: each (kind, target) pair is run by the framework's own code and read
back, or refused by ``autopar export`` (``REFUSED``)."""

REFUSED = {
    ("llama3-70b-cp2-zero3-offload", "deepspeed"): "Ulysses",
    ("llama3-8b-cp2-tp2-zero3", "deepspeed"): "Ulysses",
    ("llama3-8b-fp8-tp2", "deepspeed"): "no FP8 switch",
    ("gpt-18b-fp16-pp2", "torchtitan"): "precision fp16",
    ("gpt-oss-20b-ep4", "megatron"): "attention sinks",
    ("gpt-oss-20b-ep4", "bridge"): "attention sinks",
}
"""The (kind, target) pairs ``autopar export`` refuses, and a word of the reason it gives."""


def refused_for(target: str) -> dict[str, str]:
    """The kinds ``autopar export`` refuses for ``target`` (``REFUSED``), and a word of the
    reason."""
    return {kind: word for (kind, to), word in REFUSED.items() if to == target}


def issue_plan(kind: str):
    """The plan of one of ``ISSUE_KINDS``."""
    model, cluster, nodes, train, config = ISSUE_KINDS[kind]
    return plan(model, cluster, nodes, TrainSpec(**train), **config)


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
