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
wheel's every dependency. megatron-bridge's wheel (also Python 3.12 only, its recipes and config
code pure Python) is unpacked beside them, and what ``import megatron.bridge.recipes`` needs
beyond this environment is installed (``pip install --target --no-deps``) into a folder of its
own, ``BRIDGE_DEPENDENCIES``: Bridge pins ``transformers<=5.12.1``, whose huggingface-hub<2 and
tokenizers<=0.23.0 the environment's newer transformers does not share, so they cannot go in the
``test`` extra; ``tests/unit/exports/test_bridge_runs.py`` runs Bridge in a process of its own
with these folders first on its path. A version already unpacked is kept.
``scripts/install.sh test`` runs this.
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
MEGATRON_BRIDGE = "0.6.2"
"""The megatron-bridge release the Bridge export is written against (PyPI, 2026-09; it runs
on megatron-core 0.19.2, ``MEGATRON_CORE``)."""
BRIDGE_DEPENDENCIES = (
    # Bridge's transformers pin (<=5.12.1, >=5.8) and what that release imports at a version
    # it accepts (huggingface-hub<2, tokenizers<=0.23.0, httpx, typer)
    "transformers==5.12.1", "huggingface-hub==1.33.0", "tokenizers==0.22.2", "httpx==0.28.1",
    "httpcore==1.0.9", "h11==0.16.0", "anyio==4.16.0", "typer==0.29.2",
    # Hugging Face's kernels as that transformers wants it (its extra: >=0.12.0,<0.13): the
    # environment's newer one, which transformers 5.25 depends on, refuses 5.12.1's kernel
    # table ("Either a revision or a version must be specified")
    "kernels==0.12.3",
    # the recipes' common module imports Bridge's data builders, which import megatron-energon
    # (megatron-core's dev extra pins ~=7.0) and what it imports
    "megatron-energon==7.4.1", "multi-storage-client==0.51.0", "opentelemetry-api==1.43.0",
    "xattr==1.3.0", "cffi==2.1.1", "lark==1.3.1", "wcmatch==12.0.1", "bracex==3.2.3",
    "rapidyaml==0.15.2", "deprecation==2.1.0", "filetype==1.2.0", "webdataset==1.0.2",
    "braceexpand==0.1.7", "jsonschema==4.26.0", "jsonschema-specifications==2025.9.1",
    "referencing==0.37.0", "rpds-py==2026.9.1", "attrs==26.1.0",
    # megatron.bridge.recipes imports every family's recipes: the diffusion ones import
    # diffusers, Bridge's checkpointing nvidia-modelopt (megatron-core's dev extra: >=0.44),
    # which imports pulp
    "diffusers==0.42.1", "nvidia-modelopt==0.47.0", "pulp==3.3.2",
    # the overrides' parser: Hydra (Bridge pins >=1.3.4,<1.4), its grammar's runtime (4.9.*)
    # and OmegaConf
    "omegaconf==2.3.0", "antlr4-python3-runtime==4.9.3", "hydra-core==1.3.4",
)
"""What ``import megatron.bridge.recipes`` and its overrides need beyond the ``test`` extra's
environment, pinned (each at the version installed when the test was written); checked by
running Bridge's process with the packages outside the ``test`` extra's dependencies hidden."""


def frameworks_dir() -> Path:
    return Path(os.environ.get("AUTOPAR_FRAMEWORKS")
                or Path.home() / ".cache" / "autopar" / "frameworks")


def megatron_dir(root: Path | None = None) -> Path:
    """Where the unpacked megatron-core wheel lies (its ``megatron`` package inside)."""
    return (root or frameworks_dir()) / f"megatron-core-{MEGATRON_CORE}"


def torchtitan_dir(root: Path | None = None) -> Path:
    """Where the unpacked torchtitan wheel lies (its ``torchtitan`` package inside)."""
    return (root or frameworks_dir()) / f"torchtitan-{TORCHTITAN}"


def bridge_dir(root: Path | None = None) -> Path:
    """Where the unpacked megatron-bridge wheel lies (its ``megatron/bridge`` inside)."""
    return (root or frameworks_dir()) / f"megatron-bridge-{MEGATRON_BRIDGE}"


def bridge_dependencies_dir(root: Path | None = None) -> Path:
    """Where ``BRIDGE_DEPENDENCIES`` are installed (``requirements.txt`` lists them)."""
    return (root or frameworks_dir()) / f"megatron-bridge-{MEGATRON_BRIDGE}-dependencies"


def fetch_megatron(root: Path) -> Path:
    return _fetch(megatron_dir(root), "megatron-core", MEGATRON_CORE,
                  Path("megatron") / "training" / "arguments.py")


def fetch_torchtitan(root: Path) -> Path:
    return _fetch(torchtitan_dir(root), "torchtitan", TORCHTITAN,
                  Path("torchtitan") / "config" / "configs.py")


def fetch_bridge(root: Path) -> Path:
    """The megatron-bridge wheel unpacked, and its ``BRIDGE_DEPENDENCIES`` installed beside
    it (again where the list changed)."""
    _fetch(bridge_dir(root), "megatron-bridge", MEGATRON_BRIDGE,
           Path("megatron") / "bridge" / "recipes" / "__init__.py")
    target = bridge_dependencies_dir(root)
    wanted = "\n".join(BRIDGE_DEPENDENCIES) + "\n"
    listed = target / "requirements.txt"
    if listed.exists() and listed.read_text() == wanted:
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    # --no-compile: the driver byte-compiles only what it imports, on its first run
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--root-user-action", "ignore",
                    "--target", str(partial), *BRIDGE_DEPENDENCIES], check=True)
    (partial / "requirements.txt").write_text(wanted)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


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
    print(f"fetch_frameworks: megatron-bridge {MEGATRON_BRIDGE} and its dependencies in "
          f"{fetch_bridge(root)}")


if __name__ == "__main__":
    main()
