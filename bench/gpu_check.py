"""The GPU check (issue 35): everything autopar has never run on a GPU, in one command.

Run as ``bash bench/gpu_check.sh`` (which runs this with the machine's ``python3``); the shell
script's header has the session's exact run call. Five parts, each with a time budget
(``PARTS``; 510 s together, inside the run call's ``RUN_TIMEOUT_S``), run in order; a part may
use its own budget plus what the parts before it left. A part that fails, or runs out of time
(its command is killed), is a result: the next part runs, and the results files are rewritten
after every part, so what ran is kept even if the run call itself is cut off.

1. **environment** (70 s; 46 s on the H200 of 2026-11-28): the GPU, driver, torch/CUDA/Triton/
   transformers versions; the carried
   wheels checked against ``bench/gpu_wheels.txt`` (``gpu_wheels.py``) and installed with
   autopar's own wheel, built here from the tree, into ``SITE`` (no network: ``--no-index``,
   no build isolation); every later command imports autopar from there (``PYTHONPATH``, and
   ``PYTHONSAFEPATH`` so that the tree's ``autopar/`` folder does not shadow it); then
   ``pytest tests/gpu``.
2. **kernels** (150 s): ``bench/fused_kernels.py --markdown`` -- each fused kernel's bandwidth against
   a copy, its speed against eager and ``torch.compile``, forward and backward (in two runs,
   ``KERNEL_GROUPS``, so that a slow ``torch.compile`` costs only its group's rows); then
   ``bench/fp8_linear.py``, torchao's float8 linear against bf16's, eager and compiled (what
   ``costmodel/compute.py:fp8_cast_s`` prices; bench/results/fp8_linear.md).
3. **profile** (60 s): ``autopar profile --nproc 1 --device cuda`` -- GEMMs, attention,
   memory-bound kernels and the optimizer step on the GPU grid (``autopar.measure.profiling.GPU``; one
   GPU, so no collectives), written as ``profile-<kind>.json``, the preset the repository keeps
   (``bench/results/``).
4. **step** (150 s): ``bench/gpu_step.py`` -- a 1B-class Llama 3's real step under each
   checkpoint policy against ``estimate`` (with and without the profile) and the dry run:
   step time, ``max_memory_allocated``, ``max_memory_reserved``, and the fragmentation and
   context terms derived; bf16 (FP8 is skipped, saying why, until issue 31 adds it).
5. **program** (80 s): ``autopar verify --device cuda`` of three dp = 1 plans (fp32 plain; bf16,
   FSDP2 on the one-rank mesh; bf16 ZeRO-3 with full checkpointing and the fused kernels) --
   two steps each against the eager model in one process, within verify's written bounds.

Results, in ``--out`` (default ``$OUT``): ``gpu-<kind>.md`` and ``gpu-<kind>.json`` (every part:
status, summary, seconds, commands with exit codes and output tails, data), ``gpu-<kind>.log``
(every command's whole output) and ``profile-<kind>.json``; ``<kind>`` is ``h100``, ``h200``
(from the card's name) or ``check-dry``. Four files, in one folder: within what the device tool
brings back (8 files, 16 MiB each).

``--dry`` runs the same on a CPU machine: the wheel set (the pinned list's tags and sizes and,
where fetched, the files), the size of what travels, autopar's wheel built and installed into a
temporary ``SITE`` (the device's dependency wheels checked by ``pip install --dry-run`` for
CPython 3.12 x86-64), ``tests/gpu`` collected and skipped, every CUDA command run to its clean
refusal (so each is known to parse and to reach its device check), part 4's predictions at full
size, and the results files. ``--fetch`` downloads the pinned wheels (``gpu_wheels.fetch``).
Standard library only, so that it runs before autopar is installed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path

import gpu_wheels  # noqa: E402
from machine import machine_lines  # noqa: E402

REPO = gpu_wheels.REPO
RUN_COMMAND = "bash bench/gpu_check.sh"
RUN_CARRY = [".whl"]
RUN_TIMEOUT_S = 570
"""The session's run call: ``run(command=RUN_COMMAND, carry=RUN_CARRY, timeout_s=RUN_TIMEOUT_S)``
after ``bash bench/gpu_check.sh --fetch`` here. The parts' budgets sum to 510 s; the 60 s left
cover the start of this script and the writing of the results."""
PART5_MODEL = ("--model", "llama", "--model-arg", "num_layers=2", "--model-arg",
               "hidden_size=256", "--model-arg", "num_heads=4", "--model-arg", "num_kv_heads=2",
               "--model-arg", "ffn_hidden_size=512", "--model-arg", "vocab_size=1024",
               "--model-arg", "seq_len=256", "--global-batch", "4", "--seq-len", "256",
               "--micro-batch", "2", "--steps", "2", "--dp", "1", "--device", "cuda")
"""Part 5's model and batch: a small Llama (its CPU reference takes seconds), two steps."""
PART5_CASES = {
    "fp32, no FSDP": ("--precision", "fp32"),
    "bf16, FSDP2 on the one-rank mesh": ("--precision", "bf16"),
    "bf16, ZeRO-3, full checkpointing, fused kernels": (
        "--precision", "bf16", "--zero", "3", "--checkpoint", "full",
        "--fusions", "rms_norm,swiglu,rope,linear_cross_entropy"),
}
KERNEL_GROUPS = ("rms_norm,layer_norm,swiglu,gelu", "rope,linear_cross_entropy")
"""Part 2's runs of ``bench/fused_kernels.py`` (``--only``), the bandwidth-bound norms and
activations first."""
REFUSAL = {"kernels": "needs a CUDA GPU", "profile": "no CUDA GPU", "verify": "no CUDA GPU"}
"""What each CUDA command says when it refuses on a machine without one (``--dry``)."""
PROBE = ("import json, platform, torch\n"
         "d = {'python': platform.python_version(), 'torch': torch.__version__,\n"
         "     'cuda': torch.version.cuda, 'cuda_available': torch.cuda.is_available()}\n"
         "for name in ('triton', 'transformers', 'numpy', 'pytest', 'setuptools', 'ortools',\n"
         "             'autopar'):\n"
         "    try:\n"
         "        m = __import__(name)\n"
         "        d[name] = getattr(m, '__version__', '?')\n"
         "    except Exception as e:\n"
         "        d[name] = f'not importable: {type(e).__name__}: {e}'\n"
         "try:\n"
         "    import autopar.costmodel, autopar.passes, autopar.kernels\n"
         "    from ortools.linear_solver import pywraplp\n"
         "    d['autopar_file'] = autopar.__file__\n"
         "except Exception as e:\n"
         "    d['imports'] = f'{type(e).__name__}: {e}'\n"
         "if torch.cuda.is_available():\n"
         "    p = torch.cuda.get_device_properties(0)\n"
         "    d.update(gpu=p.name, capability=f'{p.major}.{p.minor}', sms=p.multi_processor_count,\n"
         "             memory_bytes=p.total_memory)\n"
         "print(json.dumps(d))\n")
"""Versions, the GPU, and the imports from the installed autopar (its sub-packages, ortools'
solver), in one interpreter: its last line is JSON."""


@dataclass
class Command:
    """One command a part ran."""

    argv: list[str]
    rc: int | None
    """Exit status; ``None`` when it was killed at its time limit."""
    seconds: float
    stdout: str = field(repr=False)
    stderr: str = field(repr=False)

    @property
    def timed_out(self) -> bool:
        return self.rc is None

    @property
    def text(self) -> str:
        return (self.stdout + "\n" + self.stderr).strip()

    def to_dict(self) -> dict[str, object]:
        return {"argv": self.argv, "rc": self.rc, "seconds": round(self.seconds, 2),
                "timed_out": self.timed_out, "tail": self.text[-1500:]}


@dataclass
class Result:
    """What a part found: ``status`` ok, failed or skipped (it needs what is not here)."""

    status: str
    summary: str
    lines: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)


class Check:
    """One run of the check: where results go, the commands' environment and time limits."""

    def __init__(self, out: Path, kind: str, dry: bool, work: Path) -> None:
        self.out, self.kind, self.dry, self.work = out, kind, dry, work
        self.site = work / "site"
        self.log = open(out / f"gpu-{kind}.log", "w", encoding="utf-8")
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="120", PYTHONSAFEPATH="1")
        self.deadline = float("inf")
        self.commands: list[Command] = []
        self.gpu_tests = True
        """Whether part 1 runs ``tests/gpu`` (not in a rerun of other parts: ``--only``)."""
        self.head: dict[str, object] = {}
        self.n = 0  # commands started: their output files' numbers

    def installed_env(self) -> None:
        """Later commands import autopar (and the carried wheels) from ``site`` only."""
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(self.site), *filter(None, [os.environ.get("PYTHONPATH")])])

    def run(self, argv: list[str], limit_s: float | None = None) -> Command:
        """``run_all`` of one command."""
        return self.run_all([argv], limit_s)[0]

    def run_all(self, argvs: list[list[str]], limit_s: float | None = None) -> list[Command]:
        """Run ``argvs`` side by side in the repository until each ends or the part's deadline
        (or ``limit_s``) passes; then it is killed with every process it started (its own
        session: a rank left holding the GPU would spoil the parts after it). Their output
        goes to files (no pipe to fill while another is waited for), then to the log."""
        left = min(self.deadline - time.monotonic(), limit_s or float("inf"))
        end = None if left == float("inf") else time.monotonic() + max(1.0, left)
        began = time.monotonic()
        started = []
        for argv in argvs:
            self.n += 1
            out, err = self.work / f"command{self.n}.out", self.work / f"command{self.n}.err"
            with open(out, "w") as o, open(err, "w") as e:
                try:
                    proc: subprocess.Popen | OSError = subprocess.Popen(
                        argv, cwd=REPO, env=self.env, stdout=o, stderr=e,
                        start_new_session=True)
                except OSError as error:
                    proc = error
            started.append((argv, proc, out, err))
        commands = []
        for argv, proc, out, err in started:
            rc: int | None = 127
            note = f"could not start: {proc}" if isinstance(proc, OSError) else ""
            if isinstance(proc, subprocess.Popen):
                try:
                    rc = proc.wait(None if end is None else max(0.1, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    rc, note = None, f"killed after {left:.0f} s (the part's time budget)"
            cmd = Command(argv, rc, time.monotonic() - began,
                          out.read_text(errors="replace"),
                          (err.read_text(errors="replace") + "\n" + note).strip())
            self.log.write(f"$ {' '.join(argv)}\n# exit {cmd.rc}, {cmd.seconds:.1f} s\n"
                           f"{cmd.stdout}\n{cmd.stderr}\n\n")
            self.log.flush()
            self.commands.append(cmd)
            commands.append(cmd)
        return commands

    def python(self, *args: str, limit_s: float | None = None) -> Command:
        return self.run([sys.executable, *args], limit_s)


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank (a command's verdict or error)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def refused(cmd: Command, phrase: str) -> bool:
    """Whether ``cmd`` refused cleanly for want of CUDA: exit 2 and ``phrase``, not a usage
    error (argparse also exits 2)."""
    return cmd.rc == 2 and phrase in cmd.text and "usage:" not in cmd.text


def dry_refusal(cmd: Command, phrase: str, what: str) -> Result:
    """A ``--dry`` part whose command needs CUDA: skipped when it refused cleanly, else
    failed (the command is broken: it would fail on the GPU too)."""
    if refused(cmd, phrase):
        return Result("skipped", f"needs CUDA: {what} refused cleanly "
                                 f"(\"{last_line(cmd.text)[:160]}\")")
    return Result("failed", f"{what} did not refuse as a command without CUDA should "
                            f"(exit {cmd.rc}): {last_line(cmd.text)}")


# ---------------------------------------------------------------------------------- part 1
def install(check: Check) -> tuple[list[str], list[str], dict]:
    """The carried wheels checked and installed, autopar's wheel built and installed, the
    imports checked: (problems, markdown lines, data)."""
    problems: list[str] = []
    lines: list[str] = []
    try:
        wheels = gpu_wheels.read_list()
    except (OSError, ValueError) as err:
        return [f"the wheel list: {err}"], [f"- wheel list: {err}"], {}
    size = gpu_wheels.travel_bytes(wheels)
    fetched = gpu_wheels.FOLDER.is_dir()
    found = gpu_wheels.check_fetched(wheels) if fetched else []
    data = {"wheels": [asdict(w) for w in wheels], "travel": size, "fetched": fetched,
            "fetched_problems": found}
    lines.append("- Wheels (`bench/gpu_wheels.txt`): " + ", ".join(
        f"{w.file} ({gpu_wheels.mib(w.bytes)})" for w in wheels))
    lines.append(f"- Travels: tree {gpu_wheels.mib(size['tree_bytes'])} "
                 f"({size['tree_counted_by']}) + wheels {gpu_wheels.mib(size['wheels_bytes'])} "
                 f"({size['wheels_counted_by']}) = {gpu_wheels.mib(size['total_bytes'])} of "
                 f"{gpu_wheels.mib(size['limit_bytes'])}: "
                 + ("fits" if size["fits"] else "OVER the limit"))
    if not size["fits"]:
        problems.append("what travels is over the device tool's 64 MiB")
    if not fetched:
        note = "not fetched here (`bash bench/gpu_check.sh --fetch` before a GPU session)"
        lines.append(f"- .whl/: {note}")
        if not check.dry:
            problems.append(".whl/ was not carried: ortools cannot be imported")
    elif found:
        problems += [f".whl/: {p}" for p in found]
        lines += [f"- .whl/: {p}" for p in found]
    files = [str(gpu_wheels.FOLDER / w.file) for w in wheels
             if (gpu_wheels.FOLDER / w.file).is_file()]
    pip = ["-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--target"]
    if files:
        if check.dry:  # cp312 wheels cannot be installed for this Python: pip checks the tags
            tags = ["--python-version", ".".join(map(str, gpu_wheels.DEVICE_PYTHON)),
                    "--implementation", "cp", "--only-binary=:all:",
                    *[a for p in gpu_wheels.PLATFORMS for a in ("--platform", p)]]
            cmd = check.python(*pip[:3], "--dry-run", *pip[3:], str(check.work / "cp312"),
                               *tags, *files)
        else:
            cmd = check.python(*pip, str(check.site), *files)
        ok = cmd.rc == 0
        done = "checked for CPython 3.12" if check.dry else "installed"
        lines.append(f"- Dependency wheels {done}: "
                     f"{'ok' if ok else 'FAILED: ' + last_line(cmd.text)}")
        if not ok:
            problems.append(f"pip install of the wheels: {last_line(cmd.text)}")
    how, problem = install_autopar(check)
    lines.append(f"- autopar: {how}")
    if problem:
        problems.append(problem)
    check.installed_env()
    cmd = check.python("-c", PROBE, limit_s=90)
    try:
        data["versions"] = versions = json.loads(cmd.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        problems.append(f"the versions and imports: {last_line(cmd.text)}")
        return problems, lines, data
    lines.insert(0, "- " + ", ".join(f"{k} {v}" for k, v in versions.items()
                                     if k not in ("autopar_file", "imports")))
    where = versions.get("autopar_file", "")
    if "imports" in versions:
        problems.append(f"imports: {versions['imports']}")
        lines.append(f"- Imports: FAILED: {versions['imports']}")
    elif not where.startswith(str(check.site)):
        problems.append(f"autopar was imported from {where}, not from the installed wheel")
        lines.append(f"- Imports: autopar from {where}, NOT the installed wheel")
    else:
        lines.append(f"- Imports (autopar, its sub-packages, ortools' solver): ok, autopar "
                     f"from `{Path(where).parent}`")
    return problems, lines, data


def install_autopar(check: Check) -> tuple[str, str | None]:
    """autopar's wheel built from a copy of the tree's package sources (its own build folder;
    offline, the interpreter's setuptools) and installed into ``site``; where the build
    fails, the packages laid out as the wheel lays them out (``[tool.setuptools.package-dir]``)
    so that the later parts still run. (how, problem or None)."""
    src, wheels = check.work / "autopar-src", check.work / "autopar-wheel"
    package_dir = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    src.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for folder in set(package_dir.values()):
        shutil.copytree(REPO / folder, src / folder, ignore=ignore, dirs_exist_ok=True)
    build = check.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index",
                       "--no-build-isolation", "-w", str(wheels), str(src)], limit_s=120)
    built = sorted(wheels.glob("autopar-*.whl"))
    if build.rc == 0 and built:
        cmd = check.python("-m", "pip", "install", "-q", "--no-index", "--no-deps",
                           "--no-compile", "--target", str(check.site), str(built[0]))
        if cmd.rc == 0:
            return f"built ({built[0].name}) and installed into `{check.site}`", None
        return ("wheel built, install FAILED", f"pip install of autopar's wheel: "
                                                f"{last_line(cmd.text)}")
    for package, folder in sorted(package_dir.items()):  # autopar first, then its sub-packages
        target = check.site.joinpath(*package.split("."))
        shutil.copytree(REPO / folder, target, ignore=ignore, dirs_exist_ok=True)
    reason = last_line(build.text)
    return (f"wheel build FAILED ({reason}); the packages copied into `{check.site}` as the "
            f"wheel lays them out", f"autopar's wheel did not build: {reason}")


def part_environment(check: Check) -> Result:
    lines, data, problems = [], {}, []
    smi = shutil.which("nvidia-smi")
    if smi:
        cmd = check.run([smi, "--query-gpu=name,driver_version,memory.total,memory.used",
                         "--format=csv,noheader"], limit_s=30)
        lines.append(f"- nvidia-smi: {cmd.stdout.strip() or last_line(cmd.text)}")
        data["nvidia_smi"] = cmd.stdout.strip()
    else:
        lines.append("- nvidia-smi: not on this machine")
    found, install_lines, install_data = install(check)
    problems += found
    lines += install_lines
    data.update(install_data)
    if not check.gpu_tests:
        lines.append("- `pytest tests/gpu`: not run (--only without part 1)")
        return Result("failed" if problems else "ok", "; ".join(problems) or
                      "wheels checked, autopar installed; tests/gpu not run", lines, data)
    cmd = check.python("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/gpu")
    data["tests_gpu"] = last_line(cmd.stdout)
    lines.append(f"- `pytest tests/gpu`: exit {cmd.rc}: {last_line(cmd.stdout)}")
    cuda = data.get("versions", {}).get("cuda_available")
    if cmd.rc != 0:
        problems.append(f"tests/gpu: {last_line(cmd.stdout)}")
    elif not cuda and "skipped" not in cmd.stdout:
        problems.append("tests/gpu ran without CUDA and skipped nothing")
    if problems:
        return Result("failed", "; ".join(problems), lines, data)
    tests = "tests/gpu skipped (no CUDA here)" if not cuda else "tests/gpu passed"
    return Result("ok", f"wheels fit ({gpu_wheels.mib(data['travel']['total_bytes'])} of "
                        f"64 MiB), autopar installed from its wheel, {tests}", lines, data)


# ---------------------------------------------------------------------------------- parts 2-5
def part_kernels(check: Check) -> Result:
    """``bench/fused_kernels.py --markdown`` once per group of ``KERNEL_GROUPS``: a group that runs
    out of time loses its own rows only."""
    body, data, failed = [], {}, []
    for group in KERNEL_GROUPS:
        cmd = check.python("bench/fused_kernels.py", "--markdown", "--only", group)
        if check.dry:
            return dry_refusal(cmd, REFUSAL["kernels"], "bench/fused_kernels.py")
        data[group] = cmd.stdout
        if cmd.rc != 0:
            failed.append(group)
            body += [f"- {group}: exit {cmd.rc}: {last_line(cmd.text)}", ""]
            continue
        body += [line.replace("# ", "### ", 1) if line.startswith("# ") else line
                 for line in cmd.stdout.splitlines()] + [""]
    cmd = check.python("bench/fp8_linear.py")
    data["fp8_linear"] = cmd.stdout
    if cmd.rc != 0:
        failed.append("fp8_linear")
        body += [f"- bench/fp8_linear.py: exit {cmd.rc}: {last_line(cmd.text)}", ""]
    else:
        body += ["### FP8 linears (bench/fp8_linear.py): torchao's float8 against bf16", "",
                 *cmd.stdout.splitlines(), ""]
    met = sum("| met |" in line for line in body)
    missed = sum("NOT met" in line for line in body)
    summary = f"targets met {met}, not met {missed}" + (
        f"; FAILED: {', '.join(failed)}" if failed else "")
    return Result("failed" if failed else "ok", summary, body, data)


def part_profile(check: Check) -> Result:
    path = check.out / f"profile-{check.kind}.json"
    cmd = check.python("-m", "autopar", "profile", "--nproc", "1", "--device", "cuda",
                       "--out", str(path))
    if check.dry:
        return dry_refusal(cmd, REFUSAL["profile"], "autopar profile --device cuda")
    if cmd.rc != 0 or not path.is_file():
        return Result("failed", f"autopar profile exit {cmd.rc}: {last_line(cmd.text)}")
    prof = json.loads(path.read_text())
    t = prof["tables"]
    g = t["gemm"]
    n_c, n_d = len(g["cols"]), len(g["depth"])
    gemm = max(2 * m * n * k / g["seconds"][(i * n_c + j) * n_d + d]
               for i, m in enumerate(g["rows"]) for j, n in enumerate(g["cols"])
               for d, k in enumerate(g["depth"]))
    memory = max(x / s for x, s in zip(t["memory"]["x"], t["memory"]["seconds"]))
    attention = max(x / s for x, s in zip(t["attention_forward"]["x"],
                                          t["attention_forward"]["seconds"]))
    opt = t["optimizer"]
    summary = (f"best GEMM {gemm / 1e12:.0f} TFLOP/s, attention forward "
               f"{attention / 1e12:.0f} TFLOP/s, memory-bound {memory / 1e9:.0f} GB/s, AdamW "
               f"{opt['x'][-1] / opt['seconds'][-1] / 1e9:.2f} G parameters/s")
    lines = [f"- Written: `{path.name}` ({prof['device']}, {prof['compute_dtype']}, torch "
             f"{prof['torch_version']}, CUDA {prof['cuda_version']}); keep it as "
             f"`bench/results/{path.name}` (`autopar estimate --profile`)", f"- {summary}"]
    return Result("ok", summary, lines, {"file": path.name, "gemm_flop_per_s": gemm,
                                         "memory_bytes_per_s": memory,
                                         "attention_flop_per_s": attention})


def part_step(check: Check) -> Result:
    out, md = check.work / "step.json", check.work / "step.md"
    prof = check.out / f"profile-{check.kind}.json"
    args = ["bench/gpu_step.py", "--out", str(out), "--markdown", str(md)]
    args += ["--profile", str(prof)] if prof.is_file() else []
    cmd = check.python(*args, *(["--dry"] if check.dry else []))
    if not out.is_file():
        return Result("failed", f"bench/gpu_step.py exit {cmd.rc}: {last_line(cmd.text)}")
    doc = json.loads(out.read_text())
    lines = md.read_text().splitlines() if md.is_file() else []
    errors = [k for r in doc["rows"] for k in r if k.endswith("_error")]
    done = [r for r in doc["rows"] if "measured" in r]
    if cmd.rc != 0 or errors:
        return Result("failed", f"exit {cmd.rc}; errors in {', '.join(sorted(set(errors)))}"
                      if errors else f"exit {cmd.rc}: {last_line(cmd.text)}", lines, doc)
    if doc["measured_skipped"]:
        return Result("ok" if check.dry else "failed",
                      f"predictions of {len(doc['rows'])} plans; measured: skipped -- "
                      f"{doc['measured_skipped']}", lines, doc)
    worst = max(abs(r["estimate"]["step_time_s"] / r["measured"]["step_s"] - 1) for r in done)
    return Result("ok", f"{len(done)} plans measured; the estimate's step time within "
                        f"{worst:.0%}", lines, doc)


def part_program(check: Check) -> Result:
    """The three cases one after the other on the GPU; side by side with ``--dry``, where
    each only builds its plan and refuses."""
    lines, data, statuses = [], {}, []
    argvs = [[sys.executable, "-m", "autopar", "verify", *PART5_MODEL, *args, "--timeout", "60"]
             for args in PART5_CASES.values()]
    commands = check.run_all(argvs) if check.dry else (check.run(a) for a in argvs)
    for name, cmd in zip(PART5_CASES, commands):
        if check.dry:
            r = dry_refusal(cmd, REFUSAL["verify"], f"autopar verify --device cuda ({name})")
            statuses.append(r.status)
            lines.append(f"- {name}: {r.status}: {r.summary}")
            continue
        status = {0: "passed", 1: "FAILED (out of its bounds)"}.get(cmd.rc, f"error, exit {cmd.rc}")
        statuses.append("ok" if cmd.rc == 0 else "failed")
        data[name] = {"rc": cmd.rc, "output": cmd.stdout[-6000:]}
        lines += [f"**{name}**: {status}", "", "```", cmd.stdout.strip()[-6000:]
                  or last_line(cmd.text), "```", ""]
    status = "failed" if "failed" in statuses else ("skipped" if check.dry else "ok")
    summary = ", ".join(f"{n}: {s}" for n, s in zip(PART5_CASES, statuses))
    if status == "skipped":
        summary = (f"needs CUDA: autopar verify --device cuda built each of the "
                   f"{len(PART5_CASES)} plans and refused cleanly")
    return Result(status, summary, lines, data)


@dataclass(frozen=True)
class Part:
    number: int
    name: str
    title: str
    budget_s: int
    run: Callable[[Check], Result]


PARTS = (
    Part(1, "environment", "Environment, wheels, tests/gpu", 70, part_environment),
    Part(2, "kernels", "Fused kernels (bench/fused_kernels.py, bench/fp8_linear.py)", 150,
         part_kernels),
    Part(3, "profile", "autopar profile on the GPU", 60, part_profile),
    Part(4, "step", "A real step against the prediction (bench/gpu_step.py)", 150, part_step),
    Part(5, "program", "The emitted program on CUDA (autopar verify --device cuda)", 80,
         part_program),
)


def run_parts(check: Check, parts: tuple[Part, ...]) -> list[dict]:
    """Each part in order under its deadline: its budget plus what the parts before it left
    (the run's end less the budgets of the parts after it). A part's exception is its
    result. The results files are rewritten after every part."""
    results: list[dict] = []
    end = time.monotonic() + sum(p.budget_s for p in parts)
    for i, part in enumerate(parts):
        check.deadline = end - sum(p.budget_s for p in parts[i + 1:])
        began, first = time.monotonic(), len(check.commands)
        print(f"part {part.number} ({part.name}), up to "
              f"{check.deadline - began:.0f} s ...", flush=True)
        try:
            result = part.run(check)
        except Exception as err:  # noqa: BLE001 -- a part's failure is a result
            check.log.write(traceback.format_exc())
            result = Result("failed", f"{type(err).__name__}: {err}")
        seconds = time.monotonic() - began
        results.append({"number": part.number, "name": part.name, "title": part.title,
                        "budget_s": part.budget_s, "seconds": round(seconds, 1),
                        "status": result.status, "summary": result.summary,
                        "lines": result.lines, "data": result.data,
                        "commands": [c.to_dict() for c in check.commands[first:]]})
        print(f"part {part.number} ({part.name}): {result.status} in {seconds:.0f} s -- "
              f"{result.summary}", flush=True)
        write_results(check, results)
    return results


def header(check: Check, argv: list[str], gpu: str | None) -> dict[str, object]:
    """The run's facts: ``machine_lines``' date, machine, revision and command (a device
    machine's copy of the tree has no ``.git``: its revision reads unknown)."""
    command = " ".join([RUN_COMMAND, *argv])
    lines = [line.replace("no GPU", f"GPU: {gpu}") if gpu else line
             for line in machine_lines(command, f"interpreter {sys.executable}")]
    return {"kind": check.kind, "dry": check.dry, "gpu": gpu,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine_lines": lines, "command": command,
            "run_call": {"command": RUN_COMMAND, "carry": RUN_CARRY,
                         "timeout_s": RUN_TIMEOUT_S},
            "budget_s": sum(p.budget_s for p in PARTS)}


def write_results(check: Check, parts: list[dict]) -> None:
    """``gpu-<kind>.json`` and ``gpu-<kind>.md`` from what has run so far."""
    doc = {**check.head, "parts": parts}
    (check.out / f"gpu-{check.kind}.json").write_text(json.dumps(doc, indent=1, default=str))
    h = check.head
    title = "dry run on a CPU machine" if check.dry else f"{check.kind.upper()}"
    lines = [f"# GPU check: {title}", "", *h["machine_lines"],
             f"- The session's run call: command `{RUN_COMMAND}`, carry `{RUN_CARRY}`, "
             f"timeout_s {RUN_TIMEOUT_S} (parts' budgets: {h['budget_s']} s)", "",
             "| part | status | seconds (budget) | summary |", "|---|---|---|---|"]
    lines += [f"| {p['number']}. {p['name']} | {p['status']} | {p['seconds']:.0f} "
              f"({p['budget_s']}) | {p['summary'].replace('|', '/')} |" for p in parts]
    for p in parts:
        lines += ["", f"## {p['number']}. {p['title']}", "", f"**{p['status']}**: "
                  f"{p['summary']}", "", *p["lines"]]
        failed = [c for c in p["commands"] if c["rc"] != 0]
        if failed and p["status"] == "failed":
            lines += ["", "Commands that did not exit 0:", ""]
            for c in failed:
                lines += [f"- `{' '.join(c['argv'][-6:])}`: exit {c['rc']}", "", "```",
                          c["tail"][-800:], "```"]
    (check.out / f"gpu-{check.kind}.md").write_text("\n".join(lines) + "\n")


def gpu_kind() -> tuple[str | None, str]:
    """(the card's name or None, the results' kind: ``h100``, ``h200``, or the name's
    letters), read by the machine's own torch."""
    probe = ("import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() "
             "else '')")
    try:
        cmd = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             timeout=120, check=False)
    except subprocess.TimeoutExpired:
        return None, "none"
    name = cmd.stdout.strip() or None
    if name is None:
        return None, "none"
    for kind in ("h200", "h100"):
        if kind in name.lower():
            return name, kind
    return name, "".join(c for c in name.lower() if c.isalnum())[:20] or "gpu"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the results' folder (default $OUT; with --dry a new "
                                      "temporary folder)")
    parser.add_argument("--dry", action="store_true",
                        help="on a CPU machine: check the wheels, the commands and the files")
    parser.add_argument("--fetch", action="store_true",
                        help="download the pinned wheels into .whl/ (needs PyPI)")
    parser.add_argument("--only", help="comma-separated part numbers to run (1's install "
                                       "always runs)")
    args = parser.parse_args(argv)
    if args.fetch:
        return gpu_wheels.fetch()
    name, kind = (None, "check-dry") if args.dry else gpu_kind()
    if name is None and not args.dry:
        print("bench/gpu_check.sh: no CUDA GPU is visible here; on a CPU machine run it with "
              "--dry.", file=sys.stderr)
        return 2
    out = args.out or os.environ.get("OUT") or (tempfile.mkdtemp(prefix="gpu-check-")
                                                if args.dry else None)
    if out is None:
        print("bench/gpu_check.sh: give --out DIR (or set OUT).", file=sys.stderr)
        return 2
    parts, explicit = PARTS, set()
    if args.only:
        try:
            explicit = {int(n) for n in args.only.split(",")}
        except ValueError:
            parser.error(f"--only takes part numbers, e.g. 4,5; got {args.only!r}")
        parts = tuple(p for p in PARTS if p.number in explicit | {1})
    Path(out).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-work-") as work:
        check = Check(Path(out), kind, args.dry, Path(work))
        check.head = header(check, argv, name)
        check.gpu_tests = not args.only or 1 in explicit
        print(f"GPU check ({'dry run' if args.dry else name}); results in {out}", flush=True)
        results = run_parts(check, parts)
        check.log.close()
    print("\n".join(f"{r['number']}. {r['name']:<12} {r['status']:<8} {r['seconds']:>5.0f} s  "
                    f"{r['summary'][:150]}" for r in results))
    print(f"results: {out}/gpu-{kind}.md, gpu-{kind}.json, gpu-{kind}.log")
    return 1 if any(r["status"] == "failed" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
