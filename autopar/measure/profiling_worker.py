"""One rank of ``autopar profile``: ``python -m autopar.measure.profiling_worker JOB.json``.

Started by ``autopar.measure.profiling`` through ``verify.start_ranks`` (the environment torchrun sets),
run through ``verify_worker.main`` (``rank<R>.pt`` or ``rank<R>.error``, a barrier and
``os._exit`` at the end). Every rank measures the same list of points in the same order, each
point after a barrier, so the compute is timed with all ranks computing at once -- on a CPU
"cluster" of processes sharing cores, that contention is what a training step sees. A point's
time is the median of its repetitions on each rank, then the slowest rank's (a step waits for
the slowest). Rank 0 writes ``progress.json`` after every point for the launcher's display.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from autopar.core.collectives import Collective
from autopar.verify.worker import main

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The torch dtype each profiled precision computes in."""
KINDS = (Collective.ALL_REDUCE, Collective.ALL_GATHER, Collective.REDUCE_SCATTER,
         Collective.ALL_TO_ALL)
"""The collectives a profile times between ranks (``send-recv`` on two ranks apart)."""


def _timed(fn: Callable[[], object], device: torch.device, min_s: float, max_reps: int) -> float:
    """Median seconds of ``fn``: one warm-up call, then as many repetitions as fill ``min_s``
    at the slowest rank's pace (at least 3, at most ``max_reps``; once when one call fills
    ``min_s``) -- the same count on every
    rank, since a collective must be called as often on each."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    t = time.perf_counter()
    fn()
    sync()
    first = torch.tensor([time.perf_counter() - t], dtype=torch.float64)
    dist.all_reduce(first, op=dist.ReduceOp.MAX)
    # a call longer than min_s is timed once more (its own warm-up was the first call)
    reps = int(min(max_reps, max(3, min_s // max(first.item(), 1e-9))))
    reps = 1 if first.item() >= min_s else reps
    times: list[float] = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class _Points:
    """The measurements of this rank, in order; rank 0 reports progress."""

    def __init__(self, job: dict, total: int) -> None:
        self.job, self.total, self.done = job, total, 0
        self.seconds: list[float] = []
        self.rank = dist.get_rank()
        self.device = torch.device(job["device"])

    def measure(self, what: str, fn: Callable[[], object], *, sustained: bool = False) -> None:
        """Time ``fn`` after a barrier; ``sustained`` (compute) repeats a short kernel until
        ``min_s`` has passed, so that every rank computes for the whole window at once -- a
        few repetitions of a microsecond kernel would run one rank after another, each with a
        core to itself, which a training step whose ranks all compute never sees."""
        dist.barrier()
        reps = 100_000 if sustained else self.job["max_reps"]
        self.seconds.append(_timed(fn, self.device, self.job["min_s"], reps))
        self.done += 1
        if self.rank == 0:
            Path(self.job["folder"], "progress.json").write_text(
                json.dumps({"done": self.done, "total": self.total, "what": what}))

    def slowest(self) -> list[float]:
        t = torch.tensor(self.seconds, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()


def point_count(job: dict, world: int) -> int:
    """How many points ``run`` measures (for the progress display)."""
    g = len(job["gemm_sizes"])
    groups = len(groups_of(world))
    grouped = len(job["grouped_rows"]) * len(job["grouped_sizes"]) ** 2
    return (g ** 3 + grouped + 2 * len(job["attention_seq"]) + len(job["memory_elements"])
            + len(job["optimizer_params"])
            + len(job["collective_bytes"]) * (len(KINDS) * groups + (world >= 2)))


def grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """The experts' GEMMs of one MoE layer in one call: ``a``'s rows by groups ending at
    ``offs``, group ``i`` times ``b[i]`` -- ``torch._grouped_mm`` where this torch has it (one
    kernel), a loop of ``mm`` otherwise (``profiling.grouped_kernel`` says which)."""
    if hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm(a, b, offs=offs)
    starts = [0, *offs.tolist()[:-1]]
    return torch.cat([a[s:e] @ b[i] for i, (s, e) in enumerate(zip(starts, offs.tolist()))])


def groups_of(world: int) -> list[int]:
    """Group sizes measured: the whole world, and pairs when there are more than two ranks;
    none for one rank (a "collective" of one moves nothing)."""
    if world == 1:
        return []
    return [world] + ([2] if world > 2 and world % 2 == 0 else [])


def run(job: dict) -> dict:
    """Measure every table (see ``autopar.measure.profiling.profile``); every rank returns them."""
    if job["device"].startswith("cuda"):
        torch.cuda.set_device(dist.get_rank() % torch.cuda.device_count())
        job = {**job, "device": f"cuda:{torch.cuda.current_device()}"}
    world, rank = dist.get_world_size(), dist.get_rank()
    dev, dtype = torch.device(job["device"]), DTYPES[job["precision"]]
    pts = _Points(job, point_count(job, world))
    # drawn where they are used: a GPU grid's largest operands (2^30 elements) would take
    # seconds each to draw on one CPU thread
    gen = torch.Generator(device=dev).manual_seed(rank)

    def rand(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return (torch.rand(*shape, generator=gen, device=dev) - 0.5).to(dt)

    sizes = job["gemm_sizes"]
    for m in sizes:
        for n in sizes:
            for k in sizes:
                a, b = rand(m, k), rand(k, n)
                pts.measure(f"GEMM {m}x{n}x{k}", lambda a=a, b=b: a @ b, sustained=True)
    experts = job["grouped_groups"]
    for m in job["grouped_rows"]:
        for n in job["grouped_sizes"]:
            for k in job["grouped_sizes"]:
                a, b = rand(experts * m, k), rand(experts, k, n)
                offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * m
                pts.measure(f"grouped GEMM {experts} x {m}x{n}x{k}",
                            lambda a=a, b=b, offs=offs: grouped(a, b, offs), sustained=True)
    heads, head_dim = job["attention_heads"], job["attention_head_dim"]
    for s in job["attention_seq"]:
        q, k, v = (rand(1, heads, s, head_dim).requires_grad_() for _ in range(3))
        pts.measure(f"attention forward, {s} tokens", lambda q=q, k=k, v=v:
                    F.scaled_dot_product_attention(q, k, v, is_causal=True), sustained=True)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        grad = torch.ones_like(out)
        pts.measure(f"attention backward, {s} tokens", lambda out=out, grad=grad, q=q, k=k, v=v:
                    torch.autograd.grad(out, (q, k, v), grad, retain_graph=True), sustained=True)
    width = job["memory_width"]
    for n in job["memory_elements"]:
        x, y, z = rand(n // width, width), rand(n // width, width), rand(n // width, width)
        w, bias = rand(width), rand(width)

        def mix(x=x, y=y, z=z, w=w, bias=bias) -> None:
            torch.add(x, y, out=z)  # reads 2, writes 1
            F.gelu(x)  # reads 1, writes 1
            F.layer_norm(x, (width,), w, bias)
            torch.softmax(x, dim=-1)
        pts.measure(f"memory-bound kernels, {n} elements", mix, sustained=True)
    for p in job["optimizer_params"]:
        param = torch.nn.Parameter(rand(p, dt=torch.float32))
        param.grad = rand(p, dt=torch.float32)
        opt = torch.optim.AdamW([param], lr=1e-4)
        pts.measure(f"AdamW step, {p} parameters", opt.step, sustained=True)
    for size in groups_of(world):
        group = dist.group.WORLD if size == world else _pair_group(world)
        _warm_up(group, rank, world, dev)
        for nbytes in job["collective_bytes"]:
            n = max(size, nbytes // 4 // size * size)  # fp32 elements, a multiple of the group
            whole, part = rand(n, dt=torch.float32), rand(n // size, dt=torch.float32)
            calls = {
                Collective.ALL_REDUCE: lambda t=whole: dist.all_reduce(t, group=group),
                Collective.ALL_GATHER: lambda o=whole, i=part: dist.all_gather_into_tensor(o, i,
                                                                                  group=group),
                Collective.REDUCE_SCATTER: lambda o=part, i=whole: dist.reduce_scatter_tensor(o, i,
                                                                                     group=group),
                Collective.ALL_TO_ALL: lambda o=whole.clone(), i=whole: dist.all_to_all_single(o, i,
                                                                                      group=group),
            }
            for kind in KINDS:
                pts.measure(f"{kind} of {nbytes} B over {size} ranks", calls[kind])
    if world >= 2:
        for nbytes in job["collective_bytes"]:
            t = rand(max(1, nbytes // 4), dt=torch.float32)
            pts.measure(f"send-recv of {nbytes} B", lambda t=t: _send_recv(t, rank, world))
    return {"seconds": pts.slowest(), "world": world}


def _warm_up(group: dist.ProcessGroup, rank: int, world: int, dev: torch.device) -> None:
    """Gloo connects pairs of ranks at their first exchange: a few of each collective (and a
    send-recv) first, so no measured point pays for a connection."""
    t = torch.zeros(2 * world, device=dev)
    for _ in range(3):
        dist.all_reduce(t, group=group)
        dist.all_to_all_single(t.clone(), t, group=group)
        _send_recv(t, rank, world)
    dist.barrier()


_PAIRS: dict[int, dist.ProcessGroup] = {}


def _pair_group(world: int) -> dist.ProcessGroup:
    """This rank's pair ({0, 1}, {2, 3}, ...): every rank creates every pair, as new_group asks."""
    if world not in _PAIRS:
        mine = None
        for first in range(0, world, 2):
            g = dist.new_group([first, first + 1])
            if dist.get_rank() in (first, first + 1):
                mine = g
        _PAIRS[world] = mine
    return _PAIRS[world]


def _send_recv(t: torch.Tensor, rank: int, world: int) -> None:
    """Even ranks send to the next odd one, all pairs at once (a pipeline's stage boundaries);
    an odd last rank idles."""
    if rank % 2 == 0 and rank + 1 < world:
        dist.send(t, rank + 1)
    elif rank % 2 == 1:
        dist.recv(t, rank - 1)


if __name__ == "__main__":
    main(sys.argv[1:], work=run)
