"""Train a model under an autopar plan: the ``train.py`` that ``autopar export`` writes.

Run it on every rank with ``torchrun`` (``bash launch.sh`` next to it does that). It reads
``plan.json`` and ``model.json`` from its own folder, builds the model on the meta device
(shapes only, no memory), applies the plan there (``autopar.device_mesh`` +
``autopar.parallelize``) and then gives each rank its own shards only
(``autopar.passes.materialize``), and trains.

Weights: drawn from ``--seed``, each parameter from its own random stream, so the shards equal
the slices of the one-process model ``ModelSpec.build("cpu", seed)`` bit for bit. While they
are drawn a rank holds at most its shards plus ONE whole parameter (fp32, on the CPU) at a time
-- the largest, the embedding or the head, bounds it -- plus the buffers (RoPE tables), which
every rank computes; a factory's model (``FILE.py:FACTORY``) is the exception, built whole once
on the CPU since its own code decides its init. With ``--init-from DIR`` the weights are read
instead, each rank reading only the slices it holds: DIR is a transformers folder
(``save_pretrained``'s ``model.safetensors``, or several shards with
``model.safetensors.index.json``; the keys are the parameter names, which a transformers Llama
shares) or a DCP checkpoint ``train.py`` saved (``checkpoints/step-<N>``, under any plan of the
model). Only the weights are read: training starts at step 1 with a fresh optimizer (to continue
a run, with its optimizer state and step, use ``--resume``). The start record of the log gives,
for every rank, its resident memory before the build (``/proc/self/statm``), its peak once its
weights are in (``VmHWM``; ``ru_maxrss`` where there is no ``/proc``: ``peak_rss_bytes``) and
the bytes of the shards it holds.

Steps are counted from 1: step ``s`` trains on batch ``s - 1`` of the data and a checkpoint
``step-<N>`` holds the state after ``N`` optimizer steps, so ``--resume`` continues at ``N + 1``
and sees the tokens an uninterrupted run would have seen.

Data: without ``--tokens``, ``autopar.models.training.synthetic_inputs(model, s - 1, global_batch,
seq_len, seed)`` (uniform random tokens, or an image model's normal images and uniform labels;
the same as ``autopar verify``). With ``--tokens FILE`` (token models only),
a flat array of token ids: a ``.npy`` file (any integer dtype), or a raw file of
``--tokens-dtype`` (``uint16`` by default, as nanoGPT's ``.bin`` files; or ``int32``), read
through a memory map. Row ``r`` of step ``s`` is the window of ``seq_len + 1`` tokens starting at
``((s - 1) * global_batch + r) * seq_len`` (wrapping around the file); inputs are its first
``seq_len`` tokens, targets the last ``seq_len``. Each data-parallel replica reads its own rows;
under context parallelism each cp rank of it runs its two chunks of every row (the program's
step cuts them: ``passes/context_parallel.py:sequence_shard``).

Checkpoints: ``torch.distributed.checkpoint`` (DCP) in ``--checkpoint-dir/step-<N>/``. The
state is keyed by the model's own parameter names (the stages keep them) with the optimizer
state flattened per parameter (``StateDictOptions(flatten_optimizer_state_dict=True)``), so no
key depends on the plan, and DCP reshards on load: a checkpoint saved under one plan resumes
under another. Each pipeline stage module on a rank has its own AdamW (an interleaved rank
holds several; ``get_state_dict`` maps one optimizer's parameters to the names of one module).

Logs: one JSON line per logged step (``step``, ``loss``, ``tokens_per_s``, ...) in
``--log-file``, printed too, by the rank that holds the last stage with dp and tp rank 0. The
loss is the mean over the whole global batch (averaged over the data-parallel replicas).

Every rank ends with a barrier and ``os._exit``: gloo ranks can abort while the interpreter
shuts down, which would make ``torchrun`` report a failure after a good run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from autopar.core.plan import Plan
from autopar.passes import ParallelProgram, device_mesh, parallelize
from autopar.passes.materialize import for_load, for_save, materialize
from autopar.core.errors import AutoparError
from autopar.core.mesh import DATA_PARALLEL, MeshAxis
from autopar.models.init import tied_groups
from autopar.models.feed import FeedKind, feed_of
from autopar.models.training import ModelSpec, end_rank, optimizer, synthetic_inputs, vocab_size

HERE = Path(__file__).resolve().parent
STATE_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10,
                   help="train until this step number (counted from 1, also after a resume)")
    p.add_argument("--tokens", default=None, metavar="FILE",
                   help="flat token ids: FILE.npy, or raw --tokens-dtype (default: synthetic)")
    p.add_argument("--tokens-dtype", choices=("uint16", "int32"), default="uint16",
                   help="dtype of a raw (not .npy) token file (default uint16)")
    p.add_argument("--checkpoint-dir", default=str(HERE / "checkpoints"), metavar="DIR",
                   help="where step-<N>/ checkpoints go (default: ./checkpoints next to train.py)")
    p.add_argument("--save-every", type=int, default=0, metavar="N",
                   help="save a checkpoint every N steps and after the last (0: never)")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                   help="continue from a checkpoint: the latest in --checkpoint-dir, or CKPT")
    p.add_argument("--log-every", type=int, default=1, metavar="N",
                   help="log every N steps and the last (default 1)")
    p.add_argument("--log-file", default=str(HERE / "train_log.jsonl"), metavar="FILE",
                   help="JSON lines, one per logged step (appended)")
    p.add_argument("--init-from", default=None, metavar="DIR",
                   help="read the weights from DIR (transformers safetensors or a DCP "
                        "checkpoint of train.py) instead of drawing them from --seed")
    p.add_argument("--seed", type=int, default=0, help="weights and synthetic tokens")
    return p.parse_args(argv)


# ----- memory -----
def peak_rss_bytes() -> int:
    """This process's peak resident set size so far: ``VmHWM`` of ``/proc/self/status`` on
    Linux, else ``ru_maxrss`` (bytes on macOS, KiB elsewhere). Not ``ru_maxrss`` on Linux: it
    keeps the launcher's peak across ``exec`` (a rank started by a process holding 800 MiB
    reports at least 800 MiB), where ``VmHWM`` is this program's own."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def rss_bytes() -> int:
    """This process's resident set size now (``/proc/self/statm``; the peak where there is no
    ``/proc``): the peak so far may be an import's transient, above what stays resident."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()
    return pages * os.sysconf("SC_PAGE_SIZE")


def held_bytes(program: ParallelProgram) -> int:
    """Bytes of the parameters and buffers this rank holds (its local shards)."""
    seen: set[int] = set()
    total = 0
    for module in program.modules:
        for t in (*module.parameters(), *module.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                local = t.to_local() if isinstance(t, DTensor) else t
                total += local.numel() * local.element_size()
    return total


# ----- data -----
class TokenFile:
    """A flat array of token ids on disk, read through a memory map."""

    def __init__(self, path: str, dtype: str, vocab: int) -> None:
        if path.endswith(".npy"):
            self.ids = np.load(path, mmap_mode="r")
        else:
            self.ids = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        if self.ids.ndim != 1 or self.ids.dtype.kind not in "iu":
            raise AutoparError(f"{path} holds {self.ids.dtype} of shape {self.ids.shape}",
                               where="--tokens", fix="pass a flat array of integer token ids")
        self.vocab = vocab

    def batch(self, index: int, rows: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.ids)
        if n < seq_len + 1:
            raise AutoparError(f"the token file has {n} tokens, a row needs {seq_len + 1}",
                               where="--tokens", fix="pass a longer token file")
        out = np.empty((rows, seq_len + 1), dtype=np.int64)
        for r in range(rows):
            start = ((index * rows + r) * seq_len) % (n - seq_len)
            out[r] = self.ids[start:start + seq_len + 1]
        x = torch.from_numpy(out)
        if int(x.max()) >= self.vocab:
            raise AutoparError(f"token id {int(x.max())} is outside the model's vocabulary of "
                               f"{self.vocab}", where="--tokens",
                               fix="tokenize with the model's tokenizer, or pick a model whose "
                                   "vocab_size covers the ids")
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()


# ----- checkpoints -----
class Checkpointer:
    """Model and optimizer state of this rank's stage modules, saved and loaded with DCP, and
    the loss scaler's state of an fp16 plan (its scale and growth tracker)."""

    def __init__(self, modules: list[nn.Module], optimizers: list[torch.optim.Optimizer],
                 scaler: object | None = None, tied: list[list[str]] = ()) -> None:
        self.modules, self.optimizers, self.scaler = modules, optimizers, scaler
        self.tied = [list(group) for group in tied]
        """The model's tied parameters' names, a list per parameter (``tied_groups``)."""

    def _alias(self, key: str, saved: set[str], section: str) -> str | None:
        """``key`` of ``section`` with the tied parameter it names renamed to a name of the
        same parameter the checkpoint holds; None when there is none."""
        dotted = f".{key}."
        for group in self.tied:
            for name in group:
                if f".{name}." not in dotted:
                    continue
                for other in group:
                    alias = dotted.replace(f".{name}.", f".{other}.", 1)[1:-1]
                    if other != name and f"{section}.{alias}" in saved:
                        return alias
        return None

    def _read_tied_from_aliases(self, state: dict, saved: set[str]):
        """Point every entry of a tied parameter the checkpoint lacks at the name it holds it
        by. A plan without pipelining keeps one tied weight, one optimizer state, under its
        first name (GPT's embedding); a pipelined plan holds the head's copy on the last stage
        under the head's name. Returns the function that, after ``dcp.load``, puts the entries
        back under their own names (copying where this rank holds both names apart)."""
        moved: list[tuple[str, str, str, object]] = []
        for section in ("model", "optim"):
            entries = state.get(section, {})
            for key in list(entries):
                alias = None if f"{section}.{key}" in saved else self._alias(key, saved, section)
                if alias is None:
                    continue
                value = entries.pop(key)
                if alias in entries:  # both names on this rank, apart: copy after the load
                    moved.append((section, key, alias, value))
                else:
                    entries[alias] = value
                    moved.append((section, key, alias, None))

        @torch.no_grad()
        def restore(loaded: dict) -> None:
            for section, key, alias, own in moved:
                entries = loaded[section]
                if own is None:
                    entries[key] = entries.pop(alias)
                elif isinstance(own, torch.Tensor):
                    own.copy_(entries[alias])
                    entries[key] = own
                else:
                    entries[key] = entries[alias]

        return restore

    def _parts(self) -> list[tuple[dict, dict]]:
        return [get_state_dict(m, o, options=STATE_OPTIONS)
                for m, o in zip(self.modules, self.optimizers)]

    def _merge(self, parts: list[tuple[dict, dict]], step: int) -> dict:
        # Keys are the model's own names, so the stages of a rank never collide, except on
        # modules every stage keeps (rotary tables): one entry serves them all.
        model: dict = {}
        optim: dict = {}
        for m, o in parts:
            model.update(m)
            optim.update(o)
        scaling = self.scaler.state_dict() if self.scaler is not None else {}
        return {"model": model, "optim": optim, "step": step, "loss_scaling": scaling}

    def save(self, folder: Path, step: int) -> None:
        # a fused projection's sectioned shards cross DCP whole (materialize.for_save)
        dcp.save(for_save(self._merge(self._parts(), step)), checkpoint_id=str(folder))

    def load(self, folder: Path) -> int:
        """Load ``folder`` into this plan's sharding (DCP reshards); returns its step."""
        parts = self._parts()
        state = self._merge(parts, -1)
        saved = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
        if not any(key.startswith("loss_scaling.") for key in saved):
            state.pop("loss_scaling")  # saved under a bf16 or fp32 plan: no scaler state
        restore = self._read_tied_from_aliases(state, set(saved))
        state, fill = for_load(state)
        dcp.load(state, checkpoint_id=str(folder))
        fill()
        restore(state)
        if self.scaler is not None and state.get("loss_scaling"):
            self.scaler.load_state_dict(state["loss_scaling"])
        for (m_sd, o_sd), module, opt in zip(parts, self.modules, self.optimizers):
            set_state_dict(module, opt, options=STATE_OPTIONS,
                           model_state_dict={k: state["model"][k] for k in m_sd},
                           optim_state_dict={k: state["optim"][k] for k in o_sd})
        return int(state["step"])


def latest_checkpoint(folder: Path) -> Path | None:
    """The complete ``step-<N>`` checkpoint with the largest N (DCP writes ``.metadata`` last)."""
    done = [p for p in folder.glob("step-*") if (p / ".metadata").exists()
            and p.name.removeprefix("step-").isdigit()]
    return max(done, key=lambda p: int(p.name.removeprefix("step-")), default=None)


# ----- training -----
def global_mean(loss: torch.Tensor, program: ParallelProgram) -> torch.Tensor:
    """The loss over the global batch: the mean of the data-parallel replicas' means (each
    replica has the same number of rows). Called by the ranks holding the last stage only;
    their dp groups hold nobody else."""
    loss = loss.detach().clone()
    for axis in DATA_PARALLEL:
        group = program.mesh[axis.value]
        if group.size() > 1:
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=group.get_group())
    return loss


def train(args: argparse.Namespace) -> None:
    plan = Plan.from_file(HERE / "plan.json")
    spec = ModelSpec.from_dict(json.loads((HERE / "model.json").read_text())).resolved(HERE)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda" if cuda else "cpu")

    if args.init_from and args.resume:
        raise AutoparError("--init-from and --resume both say where the weights come from",
                           where="train.py arguments",
                           fix="--resume continues a run (weights, optimizer, step); "
                               "--init-from starts one from given weights: pass one of them")
    before_build = rss_bytes()
    model = spec.build("meta")  # shapes only; materialize gives each rank its shards
    tied = tied_groups(model)
    if args.tokens and feed_of(model).kind is not FeedKind.TOKENS:
        raise AutoparError(f"--tokens reads token ids; {type(model).__name__} reads images",
                           where="--tokens", fix="drop --tokens: train.py then draws synthetic "
                           "images and labels (autopar.models.training.synthetic_inputs)")
    mesh = device_mesh(plan, device.type)
    program = materialize(parallelize(model, plan, mesh, device), spec, args.seed,
                          weights=args.init_from)
    memory = [None] * dist.get_world_size()
    dist.all_gather_object(memory, {"rank": dist.get_rank(), "held_bytes": held_bytes(program),
                                    "rss_before_build_bytes": before_build,
                                    "peak_rss_after_init_bytes": peak_rss_bytes()})
    optimizers = [optimizer(list(m.parameters())) for m in program.modules]
    ckpt = Checkpointer(program.modules, optimizers, program.scaler, tied)

    train_spec, c = plan.train, plan.config
    rows = train_spec.global_batch // c.dp
    mine = slice(program.dp_rank * rows, (program.dp_rank + 1) * rows)
    logs = (program.holds_last and program.dp_rank == 0
            and mesh[MeshAxis.TP.value].get_local_rank() == 0
            and mesh[MeshAxis.CP.value].get_local_rank() == 0)
    data = TokenFile(args.tokens, args.tokens_dtype, vocab_size(model)) if args.tokens else None
    ckpt_dir = Path(args.checkpoint_dir)

    def log(record: dict) -> None:
        if logs:
            line = json.dumps(record)
            print(line, flush=True)
            with open(args.log_file, "a", encoding="utf-8") as f:
                f.write(line + "\n")

    start = 1
    if args.resume:
        source = latest_checkpoint(ckpt_dir) if args.resume == "latest" else Path(args.resume)
        if source is None or not (source / ".metadata").exists():
            raise AutoparError(f"no complete checkpoint at {source or ckpt_dir}",
                               where="--resume", fix="pass --checkpoint-dir of an earlier run "
                               "or a step-<N> folder in it, or drop --resume")
        done = ckpt.load(source)
        start = done + 1
        log({"event": "resume", "checkpoint": str(source), "step": done,
             "plan": plan.summary(), "memory": memory})
    else:
        log({"event": "start", "plan": plan.summary(), "world_size": dist.get_world_size(),
             "init_from": args.init_from, "memory": memory})

    tokens_per_step = train_spec.global_batch * train_spec.seq_len
    timed_from, timed_steps = time.perf_counter(), 0
    for step in range(start, args.steps + 1):
        if data is None:
            tokens, targets = synthetic_inputs(model, step - 1, train_spec.global_batch,
                                               train_spec.seq_len, args.seed)
        else:
            tokens, targets = data.batch(step - 1, train_spec.global_batch, train_spec.seq_len)
        loss = program.step(tokens[mine], targets[mine])
        program.optimizer_step(optimizers)  # fp16: through the loss scaler
        timed_steps += 1
        if step % args.log_every == 0 or step == args.steps:
            mean = global_mean(loss, program) if program.holds_last else None
            elapsed = time.perf_counter() - timed_from
            log({"step": step, "loss": None if mean is None else float(mean),
                 "tokens_per_s": tokens_per_step * timed_steps / elapsed})
            timed_from, timed_steps = time.perf_counter(), 0
        if args.save_every and (step % args.save_every == 0 or step == args.steps):
            ckpt.save(ckpt_dir / f"step-{step}", step)
            log({"event": "checkpoint", "step": step, "path": str(ckpt_dir / f"step-{step}")})


def main() -> None:
    args = parse_args()
    torch.set_flush_denormal(True)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    code = 0
    try:
        train(args)
    except AutoparError as err:
        print(f"train.py rank {dist.get_rank()}: error: {err.paragraph()}", file=sys.stderr)
        code = 2
    except BaseException:
        traceback.print_exc()
        code = 1
    end_rank(code)


if __name__ == "__main__":
    main()
