"""Fetch the frameworks' own code the export tests run, at the versions users install.

    python3 scripts/fetch_frameworks.py [DIR]

Megatron-LM's ``megatron/training`` (its ``parse_args`` and ``validate_args``) ships in the
``megatron-core`` wheel, built for Python 3.12 only; its argument code is pure Python, so the
wheel is downloaded (``pip download --no-deps``) and unpacked, not installed, into ``DIR``
(default ``$AUTOPAR_FRAMEWORKS``, else ``~/.cache/autopar/frameworks``), where
``tests/unit/exports/test_megatron_validate.py`` imports it from. torchtitan's wheel is unpacked
beside it the same way: ``tests/unit/exports/test_exports.py`` builds its config dataclasses
(``torchtitan/config/configs.py``, which needs only torch) from the export, and
``tests/unit/exports/test_torchtitan_runs.py`` puts it on ``sys.path`` and runs its trainer's
code on each export, with the few packages that trainer imports (the ``test`` extra), not the
wheel's every dependency. A version already unpacked is kept. ``scripts/install.sh test``
runs this.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

MEGATRON_CORE = "0.19.2"
"""The megatron-core release the Megatron export is written against (PyPI, 2026-09)."""
TORCHTITAN = "0.3.0"
"""The torchtitan release the torchtitan export is written against (PyPI, 2026-09)."""


def frameworks_dir() -> Path:
    return Path(os.environ.get("AUTOPAR_FRAMEWORKS")
                or Path.home() / ".cache" / "autopar" / "frameworks")


def megatron_dir(root: Path | None = None) -> Path:
    """Where the unpacked megatron-core wheel lies (its ``megatron`` package inside)."""
    return (root or frameworks_dir()) / f"megatron-core-{MEGATRON_CORE}"


def torchtitan_dir(root: Path | None = None) -> Path:
    """Where the unpacked torchtitan wheel lies (its ``torchtitan`` package inside)."""
    return (root or frameworks_dir()) / f"torchtitan-{TORCHTITAN}"


def fetch_megatron(root: Path) -> Path:
    return _fetch(megatron_dir(root), "megatron-core", MEGATRON_CORE,
                  Path("megatron") / "training" / "arguments.py")


def fetch_torchtitan(root: Path) -> Path:
    return _fetch(torchtitan_dir(root), "torchtitan", TORCHTITAN,
                  Path("torchtitan") / "config" / "configs.py")


def _fetch(target: Path, package: str, version: str, probe: Path) -> Path:
    """``package==version``'s wheel (for Python 3.12, no dependencies) unpacked into
    ``target``, unless ``probe`` is there already."""
    if (target / probe).exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.12", "--dest", tmp,
                        f"{package}=={version}"], check=True)
        wheels = list(Path(tmp).glob(f"{package.replace('-', '_')}-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"fetch_frameworks: expected one {package} wheel, got {wheels}")
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)  # what a run cut short left
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(partial)
        partial.rename(target)
    return target


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else frameworks_dir()
    root.mkdir(parents=True, exist_ok=True)
    print(f"fetch_frameworks: megatron-core {MEGATRON_CORE} in {fetch_megatron(root)}")
    print(f"fetch_frameworks: torchtitan {TORCHTITAN} in {fetch_torchtitan(root)}")


if __name__ == "__main__":
    main()
