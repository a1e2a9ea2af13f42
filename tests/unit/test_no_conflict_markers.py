"""No file of the repository keeps a merge's conflict markers (a ``<<<<<<< HEAD`` block once
stayed in docs/architecture.md for two sessions, with two versions of a row)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKERS = ("<<<<<<< ", ">>>>>>> ")


def _tracked() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # a copy without git (CI's)
        out = []
    if out:
        return [ROOT / name for name in out]
    return [p for p in ROOT.rglob("*")
            if not any(part.startswith(".") or part.endswith(".egg-info") or
                       part in ("build", "dist", "node_modules", "__pycache__")
                       for part in p.relative_to(ROOT).parts)]


def test_no_file_keeps_merge_conflict_markers() -> None:
    found = []
    for path in _tracked():
        if not path.is_file() or path.suffix not in (".py", ".md", ".json", ".sh", ".txt",
                                                     ".toml", ".cfg", ".yaml", ".yml"):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if line.startswith(MARKERS):
                found.append(f"{path.relative_to(ROOT)}:{number}")
    assert not found, found
