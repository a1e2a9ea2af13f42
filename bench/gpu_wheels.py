"""The wheels the GPU check carries to the lent GPU machine, and what travels with them.

The device machine has no network: what autopar needs beyond its image travels as wheels in the
repository's ``.whl/`` folder (git ignores it), named in the ``carry`` of the session's run call.
``bench/gpu_wheels.txt`` pins them -- file name, bytes, sha256 -- so that a machine without the
files (CI, a fresh checkout) still checks the set:

* every pinned file installs on the device's Python (``DEVICE_PYTHON``, x86-64 manylinux): its
  file name's tags, read here (``tag_problem``);
* the working tree that travels -- tracked and untracked-not-ignored files, a ``shared/`` inside
  the checkout, and the carried ``.whl/`` -- stays within the device tool's ``LIMIT_BYTES``
  (64 MiB), counting the pinned sizes where the files are not fetched (``travel_bytes``);
* where ``.whl/`` exists, its files are the pinned ones, byte for byte (``check_fetched``).

``fetch`` downloads the pinned files from PyPI (the one step of the check that needs the
network; run it on the CPU machine before the session's run call). Standard library only: the
GPU check runs this before autopar is installed.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIST = REPO / "bench" / "gpu_wheels.txt"
FOLDER = REPO / ".whl"
LIMIT_BYTES = 64 * 2**20
"""The device tool's limit on the working tree that travels, carried paths included (64 MiB)."""
DEVICE_PYTHON = (3, 12)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
"""The platform tags ``pip download`` asks for (the device README's list); the device's glibc
is newer than every one of them."""
_MANYLINUX = re.compile(r"^manylinux(1|2010|2014|_2_(\d+))_x86_64$")
_SKIPPED_WALK = {".git", ".venv", ".whl", ".pytest_cache", "__pycache__", "build", "dist"}


@dataclass(frozen=True)
class Wheel:
    """One pinned wheel: its file name, size in bytes and sha256."""

    file: str
    bytes: int
    sha256: str

    @property
    def name(self) -> str:
        return self.file.split("-")[0]

    @property
    def version(self) -> str:
        return self.file.split("-")[1]


def read_list(path: Path = LIST) -> list[Wheel]:
    """The pinned wheels of ``path`` (``#`` starts a comment); ``ValueError`` names a bad line,
    two versions of one package, or a file that would not install on the device."""
    wheels: list[Wheel] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 3 or not parts[0].endswith(".whl") or not parts[1].isdigit() or \
                not re.fullmatch(r"[0-9a-f]{64}", parts[2]):
            raise ValueError(f"{path.name}:{number}: expected 'FILE.whl BYTES SHA256', got "
                             f"{line!r}")
        wheel = Wheel(parts[0], int(parts[1]), parts[2])
        problem = tag_problem(wheel.file)
        if problem:
            raise ValueError(f"{path.name}:{number}: {problem}")
        wheels.append(wheel)
    names = [w.name.lower().replace("_", "-") for w in wheels]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"{path.name}: more than one version of {', '.join(twice)} (pip "
                         "refuses to install two)")
    return wheels


def tag_problem(file: str, python: tuple[int, int] = DEVICE_PYTHON) -> str | None:
    """Why the wheel ``file`` would not install on CPython ``python`` on x86-64 Linux, or
    ``None``: its Python tag (``py3``, ``cpXY``, or ``cpXY`` with the stable ABI ``abi3`` for
    any later Python) and its platform tag (``any`` or manylinux x86-64)."""
    stem = file[:-len(".whl")].split("-")
    if len(stem) not in (5, 6):
        raise ValueError(f"{file!r} is not a wheel's file name")
    py_tags, abi_tags, plat_tags = (t.split(".") for t in stem[-3:])
    here = f"cp{python[0]}{python[1]}"

    def python_ok(tag: str) -> bool:
        if tag in ("py3", f"py{python[0]}{python[1]}", here):
            return True
        m = re.fullmatch(r"cp(\d)(\d+)", tag)
        return bool(m and "abi3" in abi_tags and (int(m[1]), int(m[2])) <= python)

    if not any(python_ok(t) for t in py_tags):
        return f"{file}: built for {'.'.join(py_tags)}, not CPython {python[0]}.{python[1]}"
    if not any(t == "any" or _MANYLINUX.match(t) for t in plat_tags):
        return f"{file}: built for {'.'.join(plat_tags)}, not x86-64 Linux (manylinux)"
    return None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_fetched(wheels: list[Wheel], folder: Path = FOLDER) -> list[str]:
    """What is wrong with ``folder`` against the pinned ``wheels`` (empty: it holds each, byte
    for byte, and nothing else that would travel with it)."""
    problems = []
    for w in wheels:
        path = folder / w.file
        if not path.is_file():
            problems.append(f"{w.file} is missing")
        elif path.stat().st_size != w.bytes:
            problems.append(f"{w.file} has {path.stat().st_size} bytes, the list {w.bytes}")
        elif sha256(path) != w.sha256:
            problems.append(f"{w.file}: sha256 differs from the list")
    pinned = {w.file for w in wheels}
    extra = sorted(p.name for p in folder.iterdir() if p.name not in pinned) \
        if folder.is_dir() else []
    if extra:
        problems.append(f"files the list does not name, which would travel too: "
                        f"{', '.join(extra)} (remove them)")
    return problems


def tree_bytes(repo: Path = REPO) -> tuple[int, str]:
    """(bytes, how counted) of the working tree that travels, carried paths aside: git's
    tracked and untracked-not-ignored files, and a ``shared/`` folder inside the checkout;
    where git cannot list them (CI's copy has no ``.git``), every file outside the folders
    that are never tracked (virtual environments, caches, builds, ``.whl``)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=repo, check=True,
                                capture_output=True).stdout.split(b"\0")
        files = [repo / os.fsdecode(f) for f in listed if f]
        how = "git ls-files"
    except (OSError, subprocess.CalledProcessError):
        files = []
        for root, dirs, names in os.walk(repo):
            dirs[:] = [d for d in dirs if d not in _SKIPPED_WALK and not d.endswith(".egg-info")]
            files += [Path(root, name) for name in names]
        how = "every file, no git here"
    total = sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())
    shared = repo / "shared"
    if shared.is_dir() and how == "git ls-files" and not any(
            f.is_relative_to(shared) for f in files):
        total += sum(f.stat().st_size for f in shared.rglob("*") if f.is_file())
        how += " + shared/"
    return total, how


def travel_bytes(wheels: list[Wheel], folder: Path = FOLDER) -> dict[str, object]:
    """The bytes that travel with the run call and whether they fit ``LIMIT_BYTES``: the tree
    (``tree_bytes``) plus ``.whl/`` -- its files where fetched, else the pinned sizes."""
    tree, how = tree_bytes()
    if folder.is_dir() and any(folder.iterdir()):
        carried = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        source = ".whl/ as fetched"
    else:
        carried = sum(w.bytes for w in wheels)
        source = "the pinned sizes (.whl/ not fetched here)"
    total = tree + carried
    return {"tree_bytes": tree, "tree_counted_by": how, "wheels_bytes": carried,
            "wheels_counted_by": source, "total_bytes": total, "limit_bytes": LIMIT_BYTES,
            "fits": total <= LIMIT_BYTES}


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def fetch(python: str = sys.executable) -> int:
    """Download the pinned wheels into ``.whl/`` (pip, PyPI) and check them; 0 when the set is
    complete and fits, else 1 with what is wrong."""
    wheels = read_list()
    FOLDER.mkdir(exist_ok=True)
    for w in wheels:
        path = FOLDER / w.file
        if path.is_file() and path.stat().st_size == w.bytes and sha256(path) == w.sha256:
            continue
        platforms = [a for p in PLATFORMS for a in ("--platform", p)]
        cmd = [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
               "--python-version", ".".join(map(str, DEVICE_PYTHON)), "--implementation", "cp",
               *platforms, "-d", str(FOLDER), f"{w.name}=={w.version}"]
        print("fetching", w.file, flush=True)
        subprocess.run(cmd, check=False)
    problems = check_fetched(wheels)
    size = travel_bytes(wheels)
    for p in problems:
        print("problem:", p)
    print(f"travels: tree {mib(size['tree_bytes'])} + .whl {mib(size['wheels_bytes'])} = "
          f"{mib(size['total_bytes'])} of {mib(LIMIT_BYTES)}"
          + ("" if size["fits"] else " -- OVER the limit"))
    return 0 if not problems and size["fits"] else 1
