"""Fetch the frameworks' own code the export tests run, at the versions users install.

    python3 scripts/fetch_frameworks.py [DIR]

Megatron-LM's ``megatron/training`` (its ``parse_args`` and ``validate_args``) ships in the
``megatron-core`` wheel, built for Python 3.12 only; its argument code is pure Python, so the
wheel is downloaded (``pip download --no-deps``) and unpacked, not installed, into ``DIR``
(default ``$AUTOPAR_FRAMEWORKS``, else ``~/.cache/autopar/frameworks``), where
``tests/unit/exports/test_megatron_validate.py`` imports it from. A version already unpacked is
kept. ``scripts/install.sh test`` runs this.
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


def frameworks_dir() -> Path:
    return Path(os.environ.get("AUTOPAR_FRAMEWORKS")
                or Path.home() / ".cache" / "autopar" / "frameworks")


def megatron_dir(root: Path | None = None) -> Path:
    """Where the unpacked megatron-core wheel lies (its ``megatron`` package inside)."""
    return (root or frameworks_dir()) / f"megatron-core-{MEGATRON_CORE}"


def fetch_megatron(root: Path) -> Path:
    target = megatron_dir(root)
    if (target / "megatron" / "training" / "arguments.py").exists():
        return target
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "--python-version", "3.12", "--dest", tmp,
                        f"megatron-core=={MEGATRON_CORE}"], check=True)
        wheels = list(Path(tmp).glob("megatron_core-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"fetch_frameworks: expected one megatron-core wheel, got {wheels}")
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


if __name__ == "__main__":
    main()
