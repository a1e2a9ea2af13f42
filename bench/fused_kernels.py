"""Time the fused kernels of ``autopar.kernels`` against eager PyTorch and ``torch.compile``.

    python bench/fused_kernels.py                                   # rich table
    python bench/fused_kernels.py --markdown > bench/results/kernels-h100.md   # the whole results file
    python bench/fused_kernels.py --only rms_norm,linear_cross_entropy --quick

Needs a CUDA GPU (and Triton's compiler, not its interpreter): without one it says so and exits
with status 2.

For each op, forward and forward+backward: the median time of ``triton.testing.do_bench`` (which
flushes L2 between runs); the bytes the op must move at the least (each input read once, each
output written once; the ``*_bytes`` of ``Case``) over that time, in decimal GB/s, and as a
percentage of the device's copy bandwidth measured here (``x.copy_(y)`` on 1 GiB); and the speedup
over the eager PyTorch the models run (``models/llama/``, ``models/gpt/``, ``lm_loss``) and over
``torch.compile`` of the same eager code. The fused loss is compute bound, so its GB/s is left
out; instead its peak memory above the inputs during forward+backward (gradients included, both
sides produce them) is set against eager's.

Targets (issue 5): rms_norm, swiglu and rope forward at >= 85 % of the copy bandwidth and no slower
than torch.compile; the fused loss's peak memory <= 1/8 of eager's at vocabulary 128256.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ helpers, also when loaded by path

from machine import machine_lines  # noqa: E402

COMMAND = "python bench/fused_kernels.py --markdown"
GB = 1e9
COPY_BYTES = 2**30
BANDWIDTH_TARGET = 0.85
BANDWIDTH_TARGET_OPS = ("rms_norm", "swiglu", "rope")
MEMORY_TARGET = 1 / 8
OPS = ("rms_norm", "layer_norm", "swiglu", "gelu", "rope", "linear_cross_entropy")
"""The ops ``cases`` times, in its order: what ``--only`` may name (checked before the GPU is,
so that a wrong name is told on any machine)."""


@dataclass
class Case:
    """One op at one shape: fused, eager and inputs, and the least bytes each phase moves."""

    op: str
    shape: str
    make_inputs: Callable[[], list]
    fused: Callable
    eager: Callable
    forward_bytes: float | None
    backward_bytes: float | None


@dataclass(frozen=True)
class Row:
    op: str
    shape: str
    phase: str
    fused_ms: float
    eager_ms: float
    compiled_ms: float
    gb_per_s: float | None
    copy_fraction: float | None

    def meets_bandwidth_target(self) -> bool | None:
        if self.op not in BANDWIDTH_TARGET_OPS or self.phase != "fwd":
            return None
        return self.copy_fraction >= BANDWIDTH_TARGET and self.fused_ms <= self.compiled_ms


def _tensor(*shape: int, scale: float = 1.0, grad: bool = True) -> torch.Tensor:
    x = torch.randn(*shape, device="cuda") * scale
    return x.to(torch.bfloat16).requires_grad_(grad)


def cases(quick: bool) -> list[Case]:
    """The benchmark shapes: a 16384 x 8192 bf16 activation; Llama 3 8B's RoPE and LM head."""
    from autopar import kernels
    from autopar.models.layers import lm_loss
    from autopar.models.llama import apply_rope, rope_tables

    d = 16 if quick else 1
    rows, cols, e = 16384 // d, 8192, 2  # bf16
    n = rows * cols
    batch, seq, q_heads, kv_heads, head_dim = 4, 4096 // d, 32, 8, 128
    qk = batch * seq * (q_heads + kv_heads) * head_dim
    tokens, hidden, vocab = 8192 // d, 4096, 128256
    cos, sin = rope_tables(seq, head_dim, 500000.0, device="cuda")

    def rope_inputs() -> list:
        q = _tensor(batch, seq, q_heads, head_dim, grad=False).transpose(1, 2).requires_grad_()
        return [q, _tensor(batch, kv_heads, seq, head_dim), cos, sin]

    return [
        Case("rms_norm", f"{rows}x{cols} bf16", lambda: [_tensor(rows, cols), _tensor(cols), 1e-6],
             kernels.rms_norm, lambda x, w, eps: F.rms_norm(x, (cols,), w, eps), 2 * n * e,
             3 * n * e),
        Case("layer_norm", f"{rows}x{cols} bf16",
             lambda: [_tensor(rows, cols), _tensor(cols), _tensor(cols), 1e-5], kernels.layer_norm,
             lambda x, w, b, eps: F.layer_norm(x, (cols,), w, b, eps), 2 * n * e, 3 * n * e),
        Case("swiglu", f"{rows}x{cols} bf16", lambda: [_tensor(rows, cols), _tensor(rows, cols)],
             kernels.swiglu, lambda g, u: F.silu(g) * u, 3 * n * e, 5 * n * e),
        Case("gelu", f"{rows}x{cols} bf16", lambda: [_tensor(rows, cols)], kernels.gelu,
             lambda x: F.gelu(x, approximate="tanh"), 2 * n * e, 3 * n * e),
        Case("rope", f"q {batch}x{q_heads}x{seq}x{head_dim}, k {kv_heads} heads, bf16", rope_inputs,
             kernels.rope, lambda q, k, c, s: (apply_rope(q, c, s), apply_rope(k, c, s)),
             2 * qk * e, 2 * qk * e),
        Case("linear_cross_entropy", f"{tokens} tokens, hidden {hidden}, vocab {vocab}, bf16",
             lambda: [_tensor(tokens, hidden), _tensor(vocab, hidden, scale=0.02),
                      torch.randint(0, vocab, (tokens,), device="cuda")],
             kernels.linear_cross_entropy, lambda h, w, t: lm_loss(h @ w.T, t), None, None),
    ]


def _leaves(inputs: list) -> list[torch.Tensor]:
    return [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]


def _forward_backward(fn: Callable, inputs: list) -> Callable[[], None]:
    def step() -> None:
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    return step


def _time_ms(fn: Callable, inputs: list, phase: str) -> float:
    from triton.testing import do_bench

    if phase == "fwd":
        with torch.no_grad():
            return do_bench(lambda: fn(*inputs), return_mode="median")
    return do_bench(_forward_backward(fn, inputs), grad_to_none=_leaves(inputs),
                    return_mode="median")


def copy_bandwidth_bytes_per_s() -> float:
    """Read plus write bytes per second of ``y.copy_(x)`` on 1 GiB."""
    from triton.testing import do_bench

    x = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), return_mode="median")
    return 2 * COPY_BYTES / (ms * 1e-3)


def time_case(case: Case, copy_bytes_per_s: float) -> list[Row]:
    inputs = case.make_inputs()
    compiled = torch.compile(case.eager)
    rows = []
    for phase, nbytes in (("fwd", case.forward_bytes),
                          ("fwd+bwd", None if case.forward_bytes is None
                           else case.forward_bytes + case.backward_bytes)):
        fused, eager, comp = (_time_ms(f, inputs, phase) for f in (case.fused, case.eager,
                                                                   compiled))
        rate = None if nbytes is None else nbytes / (fused * 1e-3)
        rows.append(Row(case.op, case.shape, phase, fused, eager, comp,
                        None if rate is None else rate / GB,
                        None if rate is None else rate / copy_bytes_per_s))
    return rows


def peak_bytes_above_start(step: Callable[[], None]) -> int:
    """The most CUDA memory ``step`` had allocated at once beyond what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - start


def loss_peak_memory(case: Case) -> tuple[int, int, int]:
    """(eager, fused, gradients) bytes: peaks above the inputs over forward+backward, and the
    bytes of the gradients of hidden and weight, which both peaks include."""
    inputs = case.make_inputs()
    peaks = []
    for fn in (case.eager, case.fused):
        for leaf in _leaves(inputs):
            leaf.grad = None
        peaks.append(peak_bytes_above_start(_forward_backward(fn, inputs)))
    grads = sum(leaf.numel() * leaf.element_size() for leaf in _leaves(inputs))
    return peaks[0], peaks[1], grads


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else ("met" if ok else "NOT met")


HEADER = ["op", "shape", "phase", "fused ms", "GB/s", "% of copy", "vs eager", "vs compile",
          "target"]


def _cells(row: Row) -> list[str]:
    return [row.op, row.shape, row.phase, f"{row.fused_ms:.3f}", _fmt(row.gb_per_s, ".0f"),
            _fmt(None if row.copy_fraction is None else 100 * row.copy_fraction, ".1f"),
            f"{row.eager_ms / row.fused_ms:.2f}x", f"{row.compiled_ms / row.fused_ms:.2f}x",
            _verdict(row.meets_bandwidth_target())]


def _memory_cells(memory: tuple[int, int, int]) -> list[str]:
    eager, fused, grads = memory
    return [f"{eager / GB:.2f}", f"{fused / GB:.2f}", f"{grads / GB:.2f}",
            f"1/{eager / fused:.1f}", _verdict(fused <= MEMORY_TARGET * eager)]


MEMORY_HEADER = ["eager peak GB", "fused peak GB", "of which gradients GB", "fused / eager",
                 "target <= 1/8"]


def markdown(rows: list[Row], memory: tuple[int, int, int] | None, gpu: str,
             copy_bytes_per_s: float, versions: str) -> str:
    header = [line.replace("no GPU", f"GPU: {gpu}")
              for line in machine_lines(COMMAND, versions)]
    lines = [f"# Fused Triton kernels on {gpu}", "", *header,
             f"- Measured copy bandwidth: {copy_bytes_per_s / GB:.0f} GB/s (`y.copy_(x)`, 1 GiB)",
             "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    if memory is not None:
        lines += ["", "Fused loss, peak memory above the inputs over forward+backward:", "",
                  "| " + " | ".join(MEMORY_HEADER) + " |", "|" + "---|" * len(MEMORY_HEADER),
                  "| " + " | ".join(_memory_cells(memory)) + " |"]
    return "\n".join(lines) + "\n"


def print_tables(rows: list[Row], memory: tuple[int, int, int] | None, gpu: str,
                 copy_bytes_per_s: float) -> None:
    console = Console()
    table = Table(title=f"Fused kernels on {gpu}; copy bandwidth {copy_bytes_per_s / GB:.0f} GB/s")
    for name in HEADER:
        table.add_column(name, justify="left" if name in ("op", "shape", "phase") else "right")
    for row in rows:
        table.add_row(*_cells(row))
    console.print(table)
    if memory is not None:
        mem = Table(title="Fused loss: peak memory above the inputs, forward+backward")
        for name in MEMORY_HEADER:
            mem.add_column(name, justify="right")
        mem.add_row(*_memory_cells(memory))
        console.print(mem)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print the results file")
    parser.add_argument("--only", help="comma-separated ops, e.g. rms_norm,rope")
    parser.add_argument("--quick", action="store_true",
                        help="shapes 16 times smaller, to check the script itself")
    args = parser.parse_args(argv)
    wanted = set(args.only.split(",")) if args.only else set(OPS)
    if wanted - set(OPS):
        parser.error(f"unknown ops {sorted(wanted - set(OPS))}; the ops are {', '.join(OPS)}")
    if not torch.cuda.is_available():
        print("bench/fused_kernels.py needs a CUDA GPU: none is visible here "
              "(torch.cuda.is_available() is False).", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("bench/fused_kernels.py times compiled kernels: unset TRITON_INTERPRET.", file=sys.stderr)
        return 2
    import triton

    selected = [c for c in cases(args.quick) if c.op in wanted]
    gpu = torch.cuda.get_device_name()
    copy_rate = copy_bandwidth_bytes_per_s()
    rows = [row for case in selected for row in time_case(case, copy_rate)]
    loss = [c for c in selected if c.op == "linear_cross_entropy"]
    memory = loss_peak_memory(loss[0]) if loss else None
    if args.markdown:
        versions = f"torch {torch.__version__}, triton {triton.__version__}"
        print(markdown(rows, memory, gpu, copy_rate, versions), end="")
    else:
        print_tables(rows, memory, gpu, copy_rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
