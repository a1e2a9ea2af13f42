"""``dry_run(plan)``: the emitted program of every rank role, run for one step on fake tensors.

For each distinct role of the plan -- a pipeline rank: which stages it holds, where it sits
in the schedule; ranks that differ only in their data- or tensor-parallel coordinate run the
same program on shards of the same size -- the dry run, in one process (this one, or one of
the processes it spawns to run roles side by side, ``workers``):

1. joins a process group of the plan's world size as a rank of that role, on torch's
   ``"fake"`` backend (``FakeStore``: collectives complete at once and move no data);
2. builds the model on the meta device and gives it fake tensors (``FakeTensorMode``: shapes,
   dtypes and devices, no memory), then applies the plan with the passes the real run uses
   (``autopar.parallelize``: tensor parallelism, FSDP2, pipeline stages and schedule,
   checkpointing, fusions);
3. runs one full training step -- the rank's micro-batches through the plan's real schedule,
   backward, the optimizer step -- as any step after the first runs it (the optimizer's
   states, which the first step makes, exist already), under ``MemoryAccount`` (every byte by
   kind, and the peak) and counting the collectives issued. A pipelined step of many
   micro-batches is run as long as it takes to pass through every memory state of the whole
   step (``autopar/dryrun/steady.py``: the first of llama3-405b's 16 stages runs 32 of its 64
   micro-batches, the last 3), and what the others would hold all step is added back: the
   peak is the whole step's, byte for byte (``tests/unit/dryrun/test_steady.py``).

Of four or more adjacent pipeline ranks that run the same program, only the three with the
fewest micro-batches in flight are run, and the others' peaks are read off them where they step
evenly from rank to rank (``autopar/dryrun/alike.py``: llama3-405b's ranks 1-11 off 12-14, byte
for byte the roles' own, ``tests/unit/dryrun/test_alike.py``); ``every_role`` runs them all.

What a tensor account cannot see -- the CUDA context, NCCL's workspaces, the caching
allocator's fragmentation -- is not in the dry run; the memory model names it
(``costmodel/memory.py``).

Two things of a real run the fake world cannot do, done here instead: the pipeline stages get
their micro-batch shapes given (the first stage's output, from a forward of one micro-batch
before the step), since the schedule would otherwise receive them from the neighbour rank;
and the stages' start-up vote on those shapes (a value sent around the ring, which a fake
tensor does not hold) is skipped. fp16's gradient scaler decides to skip a step from the
values of the gradients; the dry run unscales them and steps. Where the CPU build decomposes
an op the GPU runs as one kernel, the step keeps what the GPU kernel keeps
(``autopar/dryrun/gpu_kernels.py``: RMSNorm).

A role's figures do not depend on where it runs: each process joins its own fake process
group per role and clears DTensor's sharding cache after it (``_forget_meshes``), and learns
the stages' shapes from the first stage before its first role (``tests/unit/dryrun/test_dry_run.py``
holds side-by-side runs to the figures of one process). Where the time goes and what was done
about it: ``bench/results/dry_run_405b.md``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import wraps

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from autopar.core.collectives import COLLECTIVE_OPS
from autopar.core.errors import AutoparError
from autopar.core.estimate import StageMemory, block_ranges
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.core.specs import Precision
from autopar.dryrun.alike import extrapolated, families
from autopar.dryrun.fake_setup import fake_setup
from autopar.dryrun.gpu_kernels import gpu_saved_tensors
from autopar.dryrun.memory_account import KINDS, MemoryAccount
from autopar.dryrun.steady import microbatches_to_run, shortened
from autopar.models.init import tied_groups

ProgressFn = Callable[[int, int, str], None]
"""(roles done, roles in all, what runs now)."""



@dataclass(frozen=True)
class RoleRun:
    """One rank role's step: its peak memory by kind and the collectives it issued."""

    pp_rank: int
    rank: int
    """The global rank the role ran as (data- and tensor-parallel coordinates 0)."""
    stages: tuple[int, ...]
    """The pipeline stages this role holds (several under the interleaved schedule)."""
    blocks: int
    microbatches: int
    """The micro-batches the role ran (``autopar/dryrun/steady.py``): fewer than the step's
    where the rest repeat memory states already met; its peak is the whole step's."""
    step_microbatches: int
    """The micro-batches of the plan's step on one pipeline."""
    peak_bytes: float
    peak_breakdown: dict[str, float]
    """Bytes by kind (``memory_account.KINDS``) at the moment of the peak."""
    collectives: dict[str, int]
    """Collectives issued in the step, by kind (``all_gather``, ``reduce_scatter``, ...):
    in the ``microbatches`` the role ran."""
    predicted: StageMemory | None
    """The plan's estimate for this pipeline rank."""
    seconds: float
    inferred_from: tuple[int, ...] = ()
    """The alike pipeline ranks whose dry runs this role's peak was read off
    (``autopar/dryrun/alike.py``), where it was not run itself (``microbatches`` 0, no
    collectives); empty where it ran."""

    @property
    def predicted_bytes(self) -> float | None:
        return None if self.predicted is None else self.predicted.peak_bytes

    @property
    def error(self) -> float | None:
        """(predicted - dry run) / dry run."""
        p = self.predicted_bytes
        return None if p is None or self.peak_bytes == 0 else (p - self.peak_bytes) / self.peak_bytes

    def to_dict(self) -> dict[str, object]:
        return {"pp_rank": self.pp_rank, "rank": self.rank, "stages": list(self.stages),
                "blocks": self.blocks, "microbatches": self.microbatches,
                "step_microbatches": self.step_microbatches, "peak_bytes": self.peak_bytes,
                "peak_breakdown": dict(self.peak_breakdown),
                "collectives": dict(self.collectives),
                "predicted_bytes": self.predicted_bytes, "error": self.error,
                "seconds": self.seconds, "inferred_from": list(self.inferred_from)}


@dataclass(frozen=True)
class DryRun:
    """Every rank role of a plan, run for one step on fake tensors."""

    plan: Plan
    roles: tuple[RoleRun, ...]
    wall_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def peak_bytes(self) -> float:
        return max(r.peak_bytes for r in self.roles)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.plan.estimate.usable_memory_bytes

    @property
    def read_off(self) -> dict[tuple[int, ...], tuple[int, ...]]:
        """The pipeline ranks whose peaks were read off alike ranks (``autopar/dryrun/alike.py``)
        rather than run, by the ranks they were read off."""
        out: dict[tuple[int, ...], tuple[int, ...]] = {}
        for r in self.roles:
            if r.inferred_from:
                out[r.inferred_from] = out.get(r.inferred_from, ()) + (r.pp_rank,)
        return out

    def to_dict(self) -> dict[str, object]:
        return {"plan": self.plan.summary(), "world_size": self.plan.config.world_size,
                "peak_bytes": self.peak_bytes, "usable_bytes":
                    self.plan.estimate.usable_memory_bytes, "fits": self.fits,
                "roles": [r.to_dict() for r in self.roles], "wall_s": self.wall_s,
                "notes": list(self.notes)}


def dry_run(plan: Plan, model: ModelSpec | None = None, *,
            progress: ProgressFn | None = None,
            pp_ranks: Sequence[int] | None = None,
            workers: int | None = None,
            all_microbatches: bool = False, every_role: bool = False) -> DryRun:
    """Run one step of every rank role of ``plan`` on fake tensors (see the module docstring).

    ``model`` names the model when the plan does not record one (``Plan.spec_for``). Refuses
    (``AutoparError``) a plan the passes cannot run, and runs only where no process group is
    initialised (it makes its own, of the plan's world size). ``pp_ranks`` runs only those
    pipeline ranks' roles (all by default).

    ``workers`` processes run the roles side by side, each role whole in one of them: this one
    and ``workers - 1`` spawned ones, each with its own fake process group. By default one per
    CPU core this process may use, and never more than the roles; 1 runs every role here. This
    process takes roles as the others do, so a plan whose roles take less than a spawned
    process's start (some seconds, to import torch) runs here before the others are up. A
    script that calls the dry run needs the ``if __name__ == "__main__":`` guard spawned
    processes need (``multiprocessing``); without it they fail to start, and this process
    runs every role.

    A pipelined role runs the fewest of the step's micro-batches that take it through every
    memory state the whole step does (``autopar/dryrun/steady.py``), and adds back what the
    rest would hold for the whole step (their token ids, their losses): the same peak, byte
    for byte, in a fraction of the time (``RoleRun.microbatches``); ``all_microbatches`` runs
    every one of them, for the collectives of the whole step, and every role.

    Of four or more adjacent pipeline ranks running the same program (neither the first nor
    the last), the three with the fewest micro-batches in flight are run and the others' peaks
    read off them where those step by the same bytes from rank to rank
    (``autopar/dryrun/alike.py``; ``RoleRun.inferred_from``, and a note says which);
    ``every_role`` runs each of them too."""
    from autopar.passes.mesh import executable_spec

    check_dry_run_call(workers)
    spec = executable_spec(plan, model)
    start = time.perf_counter()
    c = plan.config
    wanted = sorted(set(range(c.pp) if pp_ranks is None else pp_ranks))
    if not wanted or not all(0 <= r < c.pp for r in wanted):
        raise AutoparError(f"pipeline ranks {list(pp_ranks or [])} are not all in 0..{c.pp - 1}",
                           where="pp_ranks", fix=f"name pipeline ranks from 0 to {c.pp - 1}")
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
    # alike ranks read off three of them (alike.py), unless every micro-batch is asked for
    found = () if all_microbatches or every_role else families(plan, wanted)
    later = {r for f in found for r in f.inferred}
    done: dict[int, RoleRun] = {}
    first = [r for r in wanted if r not in later]
    _run_roles(plan, spec, first, done, progress, len(wanted), workers, all_microbatches)
    rest = []
    notes = ["fake tensors on the CPU: attention runs the CPU kernels, whose saved tensors "
             "match the fused GPU kernels' in size but for their small statistics"]
    for family in found:
        read = extrapolated(family, {r: done[r].peak_breakdown for r in family.run})
        if read is None:
            rest += family.inferred
            continue
        for r, breakdown in read.items():
            done[r] = _inferred_role(plan, done[family.run[0]], r, breakdown, family.run)
        notes.append(f"pipeline ranks {block_ranges(family.inferred)} read off ranks "
                     f"{block_ranges(family.run)}, which run the same program: their peaks step "
                     "by the same bytes from rank to rank (autopar/dryrun/alike.py)")
    if rest:
        _run_roles(plan, spec, sorted(rest), done, progress, len(wanted), workers,
                   all_microbatches, before=len(done))
    if progress is not None:
        progress(len(wanted), len(wanted), "done")
    return DryRun(plan, tuple(done[r] for r in wanted), time.perf_counter() - start,
                  tuple(notes))


def _run_roles(plan: Plan, spec: ModelSpec, ranks: list[int], done: dict[int, RoleRun],
               progress: ProgressFn | None, total: int, workers: int, all_microbatches: bool,
               before: int = 0) -> None:
    """Dry-run the roles of ``ranks`` into ``done``: in this process, or side by side in up to
    ``workers`` processes; ``progress`` counts them among ``total`` roles, ``before`` done."""
    if not ranks:
        return
    within = None if progress is None else (
        lambda n, _total, what: progress(before + n, total, what))
    runs = _RoleRuns(plan, spec, ranks, within, steady=not all_microbatches)
    processes = min(workers, len(ranks))
    with _old_objects_frozen():
        if processes == 1:
            runs.here()
        else:
            runs.side_by_side(processes - 1)
    done.update(zip(ranks, runs.roles()))


def _inferred_role(plan: Plan, like: RoleRun, pp_rank: int, breakdown: dict[str, float],
                   run: tuple[int, ...]) -> RoleRun:
    """``pp_rank``'s role read off the alike ranks ``run`` (``alike.extrapolated``), ``like``
    the first of them: its program's stages and blocks, the peak ``breakdown``."""
    stages = tuple(s - like.pp_rank + pp_rank for s in like.stages)
    return RoleRun(pp_rank=pp_rank, rank=role_rank(plan, pp_rank), stages=stages,
                   blocks=like.blocks, microbatches=0, step_microbatches=like.step_microbatches,
                   peak_bytes=sum(breakdown.values()), peak_breakdown=breakdown, collectives={},
                   predicted=_predicted(plan, pp_rank), seconds=0.0, inferred_from=run)


def _predicted(plan: Plan, pp_rank: int) -> StageMemory | None:
    """The plan's estimate for ``pp_rank``'s stage, where it has one."""
    stages = plan.estimate.stage_memory
    return stages[pp_rank] if pp_rank < len(stages) else None


def check_dry_run_call(workers: int | None) -> None:
    """Refuse (``AutoparError``) what no plan's dry run could run with: a process group
    already initialised here, ``workers`` not a positive whole number."""
    if dist.is_initialized():
        raise AutoparError("a process group is already initialised in this process",
                           where="autopar.dryrun.run",
                           fix="run the dry run in a process of its own, not under torchrun")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int)
                                or workers < 1):
        raise AutoparError(f"workers={workers!r} is not a positive whole number",
                           where="workers", fix="pass 1 or more, or leave it out")


class _RoleRuns:
    """The roles of one dry run, taken one by one by this process and by spawned ones.

    The roles are claimed in order from a shared counter (``multiprocessing`` ``Value``), so
    none runs twice and a process that finishes early takes the next. A process learns the
    stages' micro-batch shapes from the first stage before its first role
    (``_run_role_after_shapes``). Spawned processes send back ``("start", pp_rank)``,
    ``("done", RoleRun)`` or ``("error", pp_rank, error, traceback)``; this process reads
    them between its own roles, so the progress it reports of the others' lags by up to one
    role."""

    def __init__(self, plan: Plan, spec: ModelSpec, wanted: list[int],
                 progress: ProgressFn | None, steady: bool = True) -> None:
        self.plan, self.spec, self.wanted, self.progress = plan, spec, wanted, progress
        self.steady = steady
        self.done: dict[int, RoleRun] = {}
        self.running: list[int] = []
        self.shapes: dict[str, torch.Tensor] = {}

    def roles(self) -> tuple[RoleRun, ...]:
        return tuple(self.done[r] for r in self.wanted)

    def _report(self) -> None:
        if self.progress is not None and self.running:
            what = ", ".join(map(str, sorted(self.running)))
            self.progress(len(self.done), len(self.wanted),
                          f"pipeline rank{'s' if len(self.running) > 1 else ''} {what}")

    def _run_here(self, pp_rank: int) -> None:
        self.running.append(pp_rank)
        self._report()
        self.done[pp_rank] = _run_role_after_shapes(self.plan, self.spec, pp_rank, self.shapes,
                                                    self.steady)
        self.running.remove(pp_rank)  # reported with what the others sent meanwhile

    def here(self) -> None:
        for pp_rank in self.wanted:
            self._run_here(pp_rank)

    def side_by_side(self, helpers: int, here: bool = True) -> None:
        """The roles in this process (unless ``here`` is false: a test's way to have every
        role run in a spawned process) and ``helpers`` spawned ones."""
        import multiprocessing
        import queue

        ctx = multiprocessing.get_context("spawn")  # not fork: torch's threads and state
        claimed = ctx.Value("i", 0)
        results = ctx.Queue()
        procs = [ctx.Process(target=_serve, daemon=True, name=f"autopar-dry-run-{i + 1}",
                             args=(self.plan, self.spec, self.wanted, claimed, results,
                                   self.steady))
                 for i in range(helpers)]
        for proc in procs:
            proc.start()
        try:
            while len(self.done) < len(self.wanted):
                self._take(results)
                i = _claim(claimed, len(self.wanted)) if here else None
                if i is not None:
                    self._run_here(self.wanted[i])
                    continue
                try:
                    self._receive(results.get(timeout=0.5))
                except queue.Empty:
                    if not any(proc.is_alive() for proc in procs):
                        self._take(results)
                        if len(self.done) < len(self.wanted):
                            missing = [r for r in self.wanted if r not in self.done]
                            raise RuntimeError(
                                f"a dry-run worker process ended without the result of "
                                f"pipeline ranks {missing} (exit codes "
                                f"{[proc.exitcode for proc in procs]})")
        finally:
            for proc in procs:  # those still starting have no role: they are not waited for
                if proc.is_alive():
                    proc.terminate()
                proc.join()
            results.close()

    def _take(self, results) -> None:
        import queue

        while True:
            try:
                message = results.get_nowait()
            except queue.Empty:
                return
            self._receive(message)

    def _receive(self, message: tuple) -> None:
        if message[0] == "start":
            self.running.append(message[1])
        elif message[0] == "done":
            role = message[1]
            self.running.remove(role.pp_rank)
            self.done[role.pp_rank] = role
        else:
            _, pp_rank, error, trace = message
            if isinstance(error, AutoparError):
                raise error
            raise RuntimeError(f"the dry run of pipeline rank {pp_rank} failed in a worker "
                               f"process:\n{trace}")
        self._report()


def _claim(claimed, n: int) -> int | None:
    """The index of the next role nobody has taken, or None when all are taken."""
    with claimed.get_lock():
        i = claimed.value
        if i >= n:
            return None
        claimed.value = i + 1
        return i


def _serve(plan: Plan, spec: ModelSpec, wanted: list[int], claimed, results,
           steady: bool) -> None:
    """A spawned process of ``_RoleRuns.side_by_side``: roles until none is left."""
    import gc
    import pickle
    import traceback

    gc.freeze()  # see _old_objects_frozen; this process ends with its last role
    shapes: dict[str, torch.Tensor] = {}
    while (i := _claim(claimed, len(wanted))) is not None:
        pp_rank = wanted[i]
        results.put(("start", pp_rank))
        try:
            role = _run_role_after_shapes(plan, spec, pp_rank, shapes, steady)
        except BaseException as err:  # noqa: BLE001 -- the parent raises it
            try:
                pickle.dumps(err)
            except Exception:  # noqa: BLE001 -- sent as text only
                err = None
            results.put(("error", pp_rank, err, traceback.format_exc()))
            return
        results.put(("done", role))


def _run_role_after_shapes(plan: Plan, spec: ModelSpec, pp_rank: int,
                           shapes: dict[str, torch.Tensor], steady: bool = True) -> RoleRun:
    """``pp_rank``'s role; before a process's first role other than the first stage's, the
    stages' shapes from the first stage (``_shape_finder``), which ``shapes`` keeps for the
    process's later roles."""
    if plan.config.pp > 1 and pp_rank != 0 and "boundary" not in shapes:
        _run_role(plan, spec, 0, shapes, step=False)
    return _run_role(plan, spec, pp_rank, shapes, steady=steady)  # type: ignore[return-value]


def role_rank(plan: Plan, pp_rank: int) -> int:
    """The global rank of pipeline rank ``pp_rank`` at data- and tensor-parallel coordinate 0
    (``pp`` is the outermost mesh axis, ``autopar.core.mesh.ORDER``)."""
    return pp_rank * (plan.config.world_size // plan.config.pp)


def _run_role(plan: Plan, spec: ModelSpec, pp_rank: int, shapes: dict[str, torch.Tensor],
              step: bool = True, steady: bool = True) -> RoleRun | None:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from autopar.passes import device_mesh, parallelize
    from autopar.models.feed import feed_of
    from autopar.passes.stage import held_blocks
    from autopar.models.training import optimizer

    began = time.perf_counter()
    c, train = plan.config, plan.train
    rank = role_rank(plan, pp_rank)
    in_step = c.microbatches(train)
    run = microbatches_to_run(c, train, pp_rank) if steady and step else in_step
    whole = plan  # the estimate the role is held to
    plan = shortened(plan, run) if run < in_step else plan
    with _fake_world(rank, c.world_size), _mesh_tensors_real(), fake_setup(rank):
        mesh = device_mesh(plan, "cpu")
        model = spec.build("meta")
        if train.precision is Precision.BF16_PURE:
            model.to(torch.bfloat16)
        feed = feed_of(model)
        with FakeTensorMode(allow_non_fake_inputs=True):
            _to_empty(model, "cpu")
            # a pipeline stage's micro-batch: this cp rank's share of the sequence
            micro, _ = feed.example(c.micro_batch, train.seq_len // c.cp, "cpu")
            program = parallelize(model, plan, mesh, "cpu",
                                  stage_shapes=_shape_finder(micro, shapes))
            del model
            if not step:
                return None
            _skip_pipeline_vote(program)
            opt = optimizer(program.parameters())
            _allocate_states(opt)
            # the values do not matter on fake tensors, only the shapes (feed.py); the whole
            # step's batch, of which the micro-batches run are the first
            tokens, targets = feed.example(train.global_batch // c.dp, train.seq_len, "cpu")
            tokens, targets = tokens[:run * c.micro_batch], targets[:run * c.micro_batch]
            holders = _Holders(program, opt)
            account = MemoryAccount(holders)

            def optimizer_steps(*_) -> None:
                account.in_optimizer = True
                holders.states_settled = False

            opt.register_step_pre_hook(optimizer_steps)
            opt.register_step_post_hook(lambda *_: setattr(account, "in_optimizer", False))
            with account, gpu_saved_tensors():
                for kind in ("parameters", "optimizer"):  # what exists before the step
                    account.track((t for k, t in holders() if k == kind), kind)
                account.track(_buffers(program), "parameters")
                holders.states_settled = True
                loss = program.step(tokens, targets)
                if program.scaler is not None:  # fp16: see the module docstring
                    program.unscale_([opt])
                    program.scaler = None
                program.optimizer_step([opt])
    stages = tuple(i for i, _ in program.stages)
    peak_breakdown = {k: float(account.peak_breakdown[k]) for k in KINDS}
    peak_breakdown["activations"] += (in_step - run) * _batch_bytes(c.cp, tokens, targets, run,
                                                                    loss)
    return RoleRun(
        pp_rank=pp_rank, rank=rank, stages=stages,
        blocks=sum(held_blocks(m) for m in program.modules),
        microbatches=run, step_microbatches=in_step,
        peak_bytes=sum(peak_breakdown.values()), peak_breakdown=peak_breakdown,
        collectives=_collectives(account.collectives), predicted=_predicted(whole, pp_rank),
        seconds=time.perf_counter() - began)


def _batch_bytes(cp: int, tokens: torch.Tensor, targets: torch.Tensor, run: int,
                 loss: torch.Tensor | None) -> float:
    """What one more micro-batch of the step adds for the whole step beyond the states
    (``autopar/dryrun/steady.py``): under context parallelism this cp rank's chunks of its
    token ids and targets, which the step cuts from the whole batch at its start
    (``passes/program.py``); on the last stage its loss, kept to average at the end. (The
    batch itself is the whole step's: the micro-batches run are views of it.)"""
    shards = (tokens.nbytes + targets.nbytes) / (run * cp) if cp > 1 else 0.0
    return shards + (0.0 if loss is None else loss.element_size())


def _to_empty(model: torch.nn.Module, device: str) -> None:
    """``model.to_empty(device=device)`` under the fake mode, faster: a contiguous tensor is
    made from its shape, strides and dtype -- all ``empty_like`` keeps of it -- rather than
    from the meta tensor itself, which the fake mode would first convert to a fake one (a
    tenth of a 405B role's time, for blocks most roles then drop)."""
    def empty(t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous():
            return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
        return torch.empty_like(t, device=device)

    # ``_apply`` makes one new parameter per module holding a shared one, which would untie a
    # weight two modules share (GPT's tied head) and make the dry run hold it twice; the real
    # run keeps it one (``passes/materialize.py``), so the sharers get the first's again
    # (swapping in place, ``keeping_parameters``, is refused for fake tensors)
    tied = tied_groups(model)
    model._apply(empty)
    for first, *others in tied:
        for name in others:
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner)._parameters[leaf] = model.get_parameter(first)


def _shape_finder(micro: torch.Tensor, shapes: dict[str, torch.Tensor]):
    """The pipeline stages' micro-batch shapes: the first stage's input is a micro-batch of
    tokens; every later stage's input is the first stage's output (the blocks keep the shape
    of what flows between them), found once by a forward of the first stage, which pipeline
    rank 0 holds and runs first; a stage's output by a forward of the stage."""
    from torch.distributed.fsdp import FSDPModule

    def find(stages):
        out = {}
        for index, stage in stages:
            x = micro if index == 0 else shapes["boundary"]
            with torch.no_grad():
                y = stage(x)
            for m in stage.modules():  # as the schedule's own shape inference leaves them
                if isinstance(m, FSDPModule):
                    m.reshard()
            y = _differentiable(y)
            if index == 0:
                shapes["boundary"] = y
            out[index] = (x, y)
        return out

    return find


def _allocate_states(opt: torch.optim.Optimizer) -> None:
    """Make the optimizer's states, as its first step does (a step over zero gradients,
    before the account starts): the step the dry run accounts is then any later one, when the
    states exist from its first op."""
    params = [p for group in opt.param_groups for p in group["params"]]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _differentiable(t: torch.Tensor) -> torch.Tensor:
    """An example of what flows between stages in training: activations carry gradients (the
    schedule gives a stage a gradient buffer only for an output that requires one)."""
    t = t.detach()
    return t.requires_grad_(True) if t.is_floating_point() else t


def _skip_pipeline_vote(program) -> None:
    if program.schedule is None:
        return
    schedule = program.schedule
    if not hasattr(schedule, "_warmup_p2p"):
        raise AutoparError(
            f"this torch ({torch.__version__}) has no pipeline start-up vote the dry run knows "
            "how to stand in for", where="torch.distributed.pipelining",
            fix="run the dry run with torch 2.13")
    from torch.distributed.pipelining.stage import InferenceMode

    def static(stages, has_backward, p2p_done):
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    schedule._warmup_p2p = static


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t  # to_local() is an autograd op


class _Holders:
    """What the rank holds, by kind: parameters (shards, and FSDP's gathered copies while they
    exist), their gradients (sharded and whole), the optimizer's states -- ``(kind, tensor)``
    in the order ``MemoryAccount`` relabels them.

    The account asks at every new peak (some 1,400 times in a 405B rank's step), so the walk
    over the program is made once: the modules of each program module and FSDP's parameters
    are fixed once the program is made; the tensors they hold (registered parameters, which
    FSDP swaps, gradients, gathered copies) are read at every call.

    ``states_settled``: the optimizer's states are left out while it is true -- from when the
    account has labelled them (``track``) until the optimizer's step begins. Only the step
    makes, replaces or frees a state (in storage of its own, never a parameter's or a
    gradient's), and the account relabels a storage of a holder's kind only at a walk, which
    ends with the states; so in between every walk would find each state's storage labelled
    ``optimizer`` already."""

    states_settled = False

    def __init__(self, program, opt: torch.optim.Optimizer) -> None:
        from torch.distributed.fsdp import FSDPModule

        self._parts = []
        for module in program.modules:
            modules = list(module.modules())
            fsdp_params = []
            for m in modules:
                if isinstance(m, FSDPModule):
                    group = m._get_fsdp_state()._fsdp_param_group
                    fsdp_params.extend(group.fsdp_params if group is not None else ())
            self._parts.append((modules, fsdp_params))
        self._opt = opt
        if [id(p) for modules, _ in self._parts for p in _parameters(modules)] != \
                [id(p) for m in program.modules for p in m.parameters()]:
            raise RuntimeError("the dry run's walk over the program's parameters does not find "
                               "what module.parameters() finds: a module overrides it")

    def __call__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for modules, fsdp_params in self._parts:
            wholes = [getattr(fp, "_unsharded_param", None) for fp in fsdp_params]
            # a registered parameter that is FSDP's gathered copy, and its gradient, come again
            # below as the same kind; the account keeps the kind a storage gets last in a walk,
            # so only that last time is given
            later = {id(w) for w in wholes if w is not None}
            for p in _parameters(modules):
                if id(p) in later:
                    continue
                yield "parameters", _local(p)
                if p.grad is not None:
                    yield "gradients", _local(p.grad)
            for fp, whole in zip(fsdp_params, wholes):
                if whole is not None:
                    yield "parameters", _local(whole)
                    if whole.grad is not None:
                        yield "gradients", _local(whole.grad)
                accumulated = getattr(fp, "unsharded_accumulated_grad", None)
                if accumulated is not None:
                    yield "gradients", _local(accumulated)
                sharded = fp.sharded_param
                if sharded.grad is not None:
                    yield "gradients", _local(sharded.grad)
        if self.states_settled:
            return
        for state in self._opt.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    yield "optimizer", _local(v)


def _parameters(modules: list[torch.nn.Module]) -> Iterator[torch.nn.Parameter]:
    """The parameters registered on ``modules``, each once, in ``Module.parameters()``'s
    order (read from the modules' own dictionaries: no generator stack per module)."""
    seen: set[int] = set()
    for m in modules:
        for p in m._parameters.values():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                yield p


def _buffers(program) -> Iterator[torch.Tensor]:
    for module in program.modules:
        for b in module.buffers():
            yield _local(b)


def _collectives(counts: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for name, n in counts.items():
        kind = str(COLLECTIVE_OPS.get(name, name))
        out[kind] = out.get(kind, 0) + int(n)
    return dict(sorted(out.items()))


@contextmanager
def _old_objects_frozen() -> Iterator[None]:
    """Python's full collections skip what exists before the roles run (torch's modules, the
    plan, the caller's objects; ``gc.freeze``, undone after): a full collection in a process
    that has imported torch walks some 300,000 objects, a few times a role (0.4 s of a 405B
    role's 8). What the roles make is collected as before. Left alone where the caller has
    frozen objects already."""
    import gc

    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def _fake_world(rank: int, world: int) -> Iterator[None]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()
        _forget_meshes()


def _forget_meshes() -> None:
    """Drop DTensor's cache of sharding decisions: it is keyed by meshes compared by value, so
    the next role's mesh (equal, with new process groups) would find outputs placed on the
    last role's, whose groups are gone."""
    from torch.distributed.tensor import DTensor

    torch._C._clear_DTensor_sharding_propagator_cache()  # the C++ dispatch's own
    propagator = DTensor._op_dispatcher.sharding_propagator
    for cached in (propagator.propagate_op_sharding, propagator._propagate_tensor_meta_cached):
        clear = getattr(cached, "cache_clear", None)
        if clear is not None:
            clear()


@contextmanager
def _mesh_tensors_real() -> Iterator[None]:
    """``DeviceMesh`` keeps its rank layout in small integer tensors, which FSDP and DTensor
    build again while the program is made; under ``FakeTensorMode`` those would be fake and
    the mesh could not read them. Here they are made real (a few bytes per rank; not part of
    the program's memory)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.distributed.device_mesh import DeviceMesh

    def real(fn):
        @wraps(fn)
        def run(*args, **kwargs):
            with unset_fake_temporarily():
                return fn(*args, **kwargs)
        return run

    init, mesh = DeviceMesh.__init__, DeviceMesh.mesh
    # expert parallelism's mesh is the dp ranks flattened and unflattened (expert_parallel.py)
    flatten, unflatten = DeviceMesh._flatten, DeviceMesh._unflatten
    DeviceMesh.__init__ = real(init)  # type: ignore[method-assign]
    DeviceMesh.mesh = property(real(mesh.fget))  # type: ignore[method-assign,assignment]
    DeviceMesh._flatten = real(flatten)  # type: ignore[method-assign]
    DeviceMesh._unflatten = real(unflatten)  # type: ignore[method-assign]
    try:
        yield
    finally:
        DeviceMesh.__init__ = init  # type: ignore[method-assign]
        DeviceMesh.mesh = mesh  # type: ignore[method-assign]
        DeviceMesh._flatten = flatten  # type: ignore[method-assign]
        DeviceMesh._unflatten = unflatten  # type: ignore[method-assign]
