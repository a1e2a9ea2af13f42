"""What the export tests share: a plan of a zoo model on a preset, and the frameworks' own code
as ``scripts/fetch_frameworks.py`` unpacked it (each test skipped, saying so, where it has not
been fetched)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

import autopar
from autopar import ClusterSpec, ParallelConfig, TrainSpec
from bench_scripts import load_file

FETCH = load_file(Path(__file__).resolve().parents[1] / "scripts" / "fetch_frameworks.py",
                  "fetch_frameworks")


def plan(model: str, cluster: str, nodes: int, train: TrainSpec, **config):
    """``model`` planned with ``config`` on ``nodes`` of the preset ``cluster``."""
    return autopar.plan_for(autopar.models.build(model), ClusterSpec.preset(cluster, nodes=nodes),
                            train, ParallelConfig(**config), name=model)


def megatron_dir() -> Path:
    """The unpacked megatron-core wheel (its ``megatron`` package inside)."""
    path = FETCH.megatron_dir()
    if not (path / "megatron" / "training" / "arguments.py").exists():
        pytest.skip(f"Megatron-LM's code is not fetched ({path}): "
                    "python3 scripts/fetch_frameworks.py")
    return path


def torchtitan_configs() -> ModuleType:
    """torchtitan's ``torchtitan/config/configs.py`` loaded on its own: its dataclasses need
    only torch, where the package's ``__init__`` imports its CLI's dependencies."""
    path = FETCH.torchtitan_dir() / "torchtitan" / "config" / "configs.py"
    if not path.exists():
        pytest.skip(f"torchtitan's code is not fetched ({path}): "
                    "python3 scripts/fetch_frameworks.py")
    return load_file(path, f"torchtitan_{FETCH.TORCHTITAN.replace('.', '_')}_configs")
