"""Where a benchmark ran: the header lines every ``bench/results/*.md`` starts with."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def revision() -> str:
    """The commit the results were taken at, and whether the tree had uncommitted changes."""
    try:
        rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return rev.replace("-dirty", " with uncommitted changes")


def machine_lines(command: str, versions: str) -> list[str]:
    """Date, machine (CPUs, load), ``versions`` of the software, and the command."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "-"
    return [f"- Date: {datetime.date.today().isoformat()}",
            f"- Machine: {platform.machine()}, {cpus} CPUs ({cpu_name()}), no GPU; "
            f"{platform.platform()}; load average at start {load}",
            f"- Python {platform.python_version()}, {versions} at {revision()}",
            f"- Command: `{command}`"]
