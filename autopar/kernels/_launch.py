"""What the kernels of ``autopar.kernels`` share: where they can run, tile sizes, the offsets of a
block (``element_block``, ``row_block``, Triton helpers inlined into the kernels) and launchers.

Triton decides once, when ``triton`` is imported, whether kernels are compiled for the GPU or run
by its CPU interpreter (``TRITON_INTERPRET=1``): the ``triton.language`` helpers such as ``tl.sum``
are built then, in one mode or the other. ``interpreting`` reads that decision back, so a launch on
a CPU tensor fails with a message that says what to do instead of inside Triton's driver lookup.
Nothing here runs at import: device properties are read at the first launch on that device.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

TILE_ELEMENTS = 4096
"""Elements one program of a row or elementwise kernel holds: whole rows of up to this width in
one program, several narrower rows per program. Small enough for the CPU interpreter to take
several programs on test shapes (37 x 129 is two), so masks and the row loops are exercised."""

MAX_ROW = 65536
"""Widest last dimension of a row kernel: a row lives in registers, as in the Triton tutorials."""

INTERPRETER_PROGRAMS = 2
"""Programs of a persistent (row-looping) backward under the interpreter, so the loop runs twice."""


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1`` at its import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.sum, InterpretedFunction)


def available() -> bool:
    """Whether the kernels can launch here: a CUDA device, or Triton's CPU interpreter."""
    return interpreting() or torch.cuda.is_available()


def check_launchable(*tensors: torch.Tensor) -> None:
    """``RuntimeError`` for a CPU tensor when the interpreter is off, instead of Triton's."""
    if not interpreting() and any(t.device.type != "cuda" for t in tensors):
        devices = sorted({str(t.device) for t in tensors})
        raise RuntimeError(
            f"autopar.kernels: tensors on {', '.join(devices)}: the Triton kernels need CUDA "
            "tensors, or TRITON_INTERPRET=1 set before triton is first imported to run on CPU")


def rows_of(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a contiguous (rows, last dim) matrix: any leading dims flatten into rows."""
    return x.reshape(-1, x.shape[-1]).contiguous()


def num_warps_for(tile_elements: int) -> int:
    """Warps for a program of ``tile_elements``: about 16 elements a thread, 4 to 32 warps."""
    return min(max(tile_elements // 512, 4), 32)


@dataclass(frozen=True)
class RowTile:
    """How a row kernel covers a (rows, cols) matrix: ``block_m`` rows of ``block_n`` columns."""

    block_m: int
    block_n: int
    num_warps: int

    def row_blocks(self, n_rows: int) -> int:
        return triton.cdiv(n_rows, self.block_m)


def row_tile(n_rows: int, n_cols: int) -> RowTile:
    """One program per whole row (several rows when narrow); ``ValueError`` past ``MAX_ROW``."""
    block_n = triton.next_power_of_2(n_cols)
    if block_n > MAX_ROW:
        raise ValueError(f"last dimension {n_cols} is wider than the {MAX_ROW} a row kernel holds")
    block_m = max(1, min(TILE_ELEMENTS // block_n, triton.next_power_of_2(max(n_rows, 1))))
    return RowTile(block_m, block_n, num_warps_for(block_m * block_n))


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def persistent_programs(device: torch.device, work_blocks: int) -> int:
    """Programs of a kernel that loops over ``work_blocks``: a few per SM, at most one per block."""
    if device.type == "cuda":
        programs = 4 * _multiprocessors(device.index if device.index is not None
                                        else torch.cuda.current_device())
    else:
        programs = INTERPRETER_PROGRAMS
    return max(1, min(programs, work_blocks))


@triton.jit
def element_block(n, BLOCK: tl.constexpr):
    """Offsets and mask of this program's ``BLOCK`` elements of a flat tensor of ``n``."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return offsets, offsets < n


@triton.jit
def row_block(block, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Offsets and mask of row block ``block`` (``BLOCK_M`` rows of ``BLOCK_N`` columns) of a
    contiguous (n_rows, n_cols) matrix."""
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    return rows.to(tl.int64)[:, None] * n_cols + cols[None, :], mask


def launch_row_forward(kernel, x: torch.Tensor, params: tuple, eps: float,
                       **constexprs) -> torch.Tensor:
    """``y`` like x (contiguous) from ``kernel(x, *params, y, n_rows, n_cols, eps, BLOCK_M=,
    BLOCK_N=, **constexprs)``, one program per row block of x's rows."""
    x2 = rows_of(x)
    y = torch.empty_like(x2)
    if x2.numel():
        tile = row_tile(*x2.shape)
        kernel[(tile.row_blocks(x2.shape[0]),)](
            x2, *params, y, *x2.shape, eps, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
            num_warps=tile.num_warps, **constexprs)
    return y.view(x.shape)


def launch_row_backward(kernel, grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                        eps: float, n_sums: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``dx`` like x and ``n_sums`` column sums over rows, in weight's dtype, from
    ``kernel(dy, x, weight, dx, *partials, n_rows, n_cols, eps, BLOCK_M=, BLOCK_N=)`` on a
    persistent grid: each program loops over row blocks and writes its fp32 partial sums to its
    own row of every (programs x cols) ``partials`` buffer, which torch then sums."""
    x2, dy = rows_of(x), rows_of(grad)
    dx = torch.empty_like(x2)
    tile = row_tile(*x2.shape)
    programs = persistent_programs(x.device, tile.row_blocks(x2.shape[0]))
    partials = [torch.zeros((programs, x2.shape[1]), dtype=torch.float32, device=x.device)
                for _ in range(n_sums)]
    if x2.numel():
        kernel[(programs,)](dy, x2, weight.contiguous(), dx, *partials, *x2.shape, eps,
                            BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, num_warps=tile.num_warps)
    return dx.view(x.shape), [p.sum(0).to(weight.dtype) for p in partials]


def launch_elementwise(kernel, inputs: tuple[torch.Tensor, ...], like: torch.Tensor,
                       n_outputs: int) -> list[torch.Tensor]:
    """``n_outputs`` tensors shaped and typed like ``like`` (contiguous), from a 1-D
    ``kernel(*inputs, *outputs, n, BLOCK=)`` over contiguous copies of the inputs."""
    check_launchable(*inputs)
    inputs = tuple(t.contiguous() for t in inputs)
    outputs = [torch.empty(like.shape, dtype=like.dtype, device=like.device)
               for _ in range(n_outputs)]
    if like.numel():
        kernel[(triton.cdiv(like.numel(), TILE_ELEMENTS),)](
            *inputs, *outputs, like.numel(), BLOCK=TILE_ELEMENTS,
            num_warps=num_warps_for(TILE_ELEMENTS))
    return outputs
