"""``materialize(program, spec, seed)``: a program built on the meta device gets its weights,
each rank only its own shards; and ``for_save``/``for_load``, the state a checkpoint of such a
program hands DCP (the end of the module says why).

The flow of a sharded start (``train.py``, the ranks of ``autopar verify``)::

    model = spec.build("meta")                          # shapes only: no memory, no init
    program = parallelize(model, plan, mesh, device)     # stages, tp DTensors, FSDP2 shards:
                                                         # still on meta, the schedule for device
    materialize(program, spec, seed)                     # allocate and fill this rank's shards

``materialize`` allocates every stage module of the rank on the program's device (``to_empty``:
FSDP2 re-creates its sharded storage, DTensors their local shards; the modules stay the same
objects, so the pipeline schedule ``parallelize`` built for them runs them) and fills it:

* **parameters**, one at a time in the model's named order: the whole parameter is drawn on the
  CPU from its own random stream (``autopar.models.init``: a generator seeded from the seed and
  the parameter's name, the family's law), this rank's slice of it is copied into the local
  shard -- the slice DTensor's own layout gives (``compute_local_shape_and_global_offset`` of
  ``torch.distributed.tensor._utils``, which ``torch.distributed.checkpoint`` reads shards by
  too; FSDP2's uneven last shard and its strided shards of tp shards included; the public
  ``distribute_tensor(src_data_rank=None)`` slices the same but first moves the whole
  parameter to the mesh's device) -- and the whole parameter is freed before the next. The
  one-process build (``ModelSpec.build("cpu", seed)``) draws each parameter the same way, so
  the shards equal the corresponding slices of that model bit for bit. A weight tied to
  another (GPT's head) takes the value of its first name, so a pipeline stage holding only the
  head gets the embedding's values, and a tie inside a stage stays one parameter (``to_empty``
  swaps tensors into the existing parameter objects).
* **buffers** (RoPE tables, causal masks) are computed on every rank, whole.
* or, with ``weights=DIR``, the parameters are **read from a checkpoint**, each rank reading
  only the slices it holds (``torch.distributed.checkpoint``): a DCP folder as ``train.py``
  saves it (a ``.metadata`` file; keys ``model.<name>``), or a transformers folder of
  safetensors files as ``save_pretrained`` writes them (``model.safetensors`` or several
  shards with ``model.safetensors.index.json``; keys are the parameter names, which a
  ``hf-llama`` model shares with transformers, and a zoo model's ``state_dict`` saved with
  ``safetensors.torch.save_file`` loads too). Missing, unexpected or mis-shaped keys are an
  ``AutoparError`` naming them.

**Memory, stated:** while ``materialize`` runs, a rank holds at most its shards, plus ONE whole
parameter in fp32 on the CPU (the largest is the bound: the embedding or the head, vocabulary x
hidden x 4 bytes), plus the buffers; nothing else grows with the model (on an accelerator the
copy of a slice may stage through one shard-sized host buffer). A model whose family has
no per-parameter init scheme, or a factory's model (``FILE.py:FACTORY``: its own code decides
its init), is the exception: it is built whole once on the CPU (``spec.build("cpu", seed)``),
its slices copied, and then freed -- the memory of the whole model, for the time of the copy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec
from autopar.models.init import InitScheme, keeping_parameters, scheme_of, tied_groups
from autopar.passes.program import ParallelProgram
from autopar.passes.tensor_parallel import is_sectioned

DCP_PREFIX = "model."
"""Prefix of the model's keys in a DCP checkpoint ``train.py`` saves (its ``model`` entry)."""


class _WholeModel:
    """The values of a model built whole once on the CPU: for a model whose init autopar cannot
    draw one parameter at a time (a factory's, a family without a scheme)."""

    def __init__(self, spec: ModelSpec, seed: int) -> None:
        model = spec.build("cpu", seed)
        self.params = dict(model.named_parameters(remove_duplicate=False))
        self.buffers = dict(model.named_buffers(remove_duplicate=False))

    def value(self, name: str, seed: int) -> torch.Tensor:
        return self.params[name].detach()

    def buffer(self, name: str) -> torch.Tensor:
        return self.buffers[name]


def local_slice(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The part of ``full`` that ``param`` holds on this rank: a view (no copy) for a DTensor
    (its layout's local shape and global offset), ``full`` itself for a plain tensor."""
    if not isinstance(param, DTensor):
        return full
    if is_sectioned(param):
        return _sectioned_slice(full, param)
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh,
                                                          param.placements)
    out = full
    for dim, (start, length) in enumerate(zip(offset, shape)):
        out = out.narrow(dim, start, length)
    return out


def _sectioned_slice(full: torch.Tensor, param: DTensor) -> torch.Tensor:
    """The rank's part of a fused projection's weight or bias whose sections are each split
    over the tp ranks (the last mesh dimension: ``passes/tensor_parallel.
    SectionedColwiseParallel``), no single slice of ``full``: the tp placement's own split,
    then FSDP2's even chunks of that along each dp dimension that shards it (how FSDP2 stores
    a tp shard, whatever placement it records for the pair)."""
    mesh, placements = param.device_mesh, param.placements
    coordinate = mesh.get_coordinate()
    assert coordinate is not None  # a rank holding a shard is in the mesh
    shards, _ = placements[-1]._split_tensor(full, mesh.size(mesh.ndim - 1),
                                             with_padding=False)
    out = shards[coordinate[-1]]
    for i, placement in enumerate(placements[:-1]):
        if isinstance(placement, (Shard, _StridedShard)):
            chunks = torch.chunk(out, mesh.size(i), dim=placement.dim)
            out = chunks[coordinate[i]] if coordinate[i] < len(chunks) else out[:0]
    return out


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


@torch.no_grad()
def materialize(program: ParallelProgram, spec: ModelSpec, seed: int = 0, *,
                weights: str | Path | None = None) -> ParallelProgram:
    """Allocate this rank's shards of ``program`` (``parallelize`` of ``spec``'s model built on
    the meta device) on the program's device and fill them: drawn from ``seed`` exactly as
    ``spec.build("cpu", seed)`` draws the whole model, or read from the checkpoint folder
    ``weights``; buffers computed. Returns ``program``. See the module docstring for the
    memory this takes."""
    meta_model = spec.build("meta")
    scheme = scheme_of(meta_model)
    with keeping_parameters():  # ties, and the program's references (TiedWeights), kept
        for module in program.modules:
            module.to_empty(device=program.device)  # FSDP2 re-creates its sharded parameters
    # a factory's own code decides its init: only a whole build reproduces it (read weights
    # need the scheme's buffers only)
    draws = scheme is not None and (weights is not None or not spec.factory)
    source: InitScheme | _WholeModel = scheme if draws else _WholeModel(spec, seed)
    for module in program.modules:
        for name, buf in module.named_buffers(remove_duplicate=False):
            buf.copy_(source.buffer(name))
    if weights is not None:
        load_weights(program, meta_model, weights)
    else:
        for name, param in program.named_parameters():
            local = _local(param)
            if local.numel() == 0:  # a zero-size weight (Qwen2-MoE without a shared expert):
                continue  # no values; FSDP2 keeps its shard as (0, 0), not the layout's shape
            full = source.value(name, seed)
            local.copy_(local_slice(full, param))
            del full  # one whole parameter at a time
    return program


# ----- reading weights -----
def checkpoint_reader(folder: str | Path) -> tuple[dcp.StorageReader, str]:
    """The reader of the checkpoint folder ``folder`` and the prefix of the model's keys in it:
    DCP (a ``.metadata`` file) or transformers safetensors (``*.safetensors`` files)."""
    path = Path(folder)
    where = "--init-from"
    if not path.is_dir():
        raise AutoparError(f"{folder} is not a folder", where=where,
                           fix="pass a transformers model folder (save_pretrained) or a DCP "
                               "checkpoint folder (train.py's checkpoints/step-<N>)")
    if (path / ".metadata").is_file():
        return dcp.FileSystemReader(str(path)), DCP_PREFIX
    if any(path.glob("*.safetensors")):
        return dcp.HuggingFaceStorageReader(str(path)), ""
    steps = sorted(p.name for p in path.glob("step-*") if (p / ".metadata").is_file())
    hint = f"; it holds the checkpoints {', '.join(steps)}: pass one of them" if steps else ""
    raise AutoparError(f"{folder} holds neither a DCP checkpoint (.metadata) nor safetensors "
                       f"files{hint}", where=where,
                       fix="pass a folder save_pretrained wrote (model.safetensors) or a "
                           "step-<N> folder of train.py's --checkpoint-dir")


def check_checkpoint(model: nn.Module, folder: str | Path
                     ) -> tuple[dcp.StorageReader, str, dict[str, str]]:
    """The reader of ``folder``, the prefix of the model's keys in it and the key to read each
    parameter name from, once the checkpoint is known to fit ``model`` (built on meta): every
    parameter there (a tied one under any of its names; a transformers checkpoint of tied
    embeddings holds no ``lm_head.weight``) with its shape, and no key the model lacks. An
    ``AutoparError`` names what differs."""
    reader, prefix = checkpoint_reader(folder)
    try:
        saved = {k[len(prefix):]: tuple(v.size) for k, v in
                 reader.read_metadata().state_dict_metadata.items()
                 if k.startswith(prefix) and hasattr(v, "size")}
    except Exception as err:  # noqa: BLE001 - an unreadable file, reported in one line
        raise AutoparError(f"cannot read the checkpoint {folder}: {type(err).__name__}: "
                           f"{err}", where="--init-from",
                           fix="pass a complete checkpoint folder") from None
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters(
        remove_duplicate=False)}
    tied = tied_groups(model)
    in_tied = {name for group in tied for name in group}
    key_of: dict[str, str] = {}
    missing = []
    for group in [*tied, *([name] for name in shapes if name not in in_tied)]:
        present = [n for n in group if n in saved]
        if not present:
            missing.append(group[0])
        for name in group:
            key_of[name] = name if name in saved else (present or group)[0]
    known = set(shapes) | {n for n, _ in model.named_buffers()}
    unexpected = sorted(k for k in saved if k not in known)
    wrong = sorted(f"{n} {saved[n]} (the model's {shapes[n]})" for n in shapes
                   if n in saved and saved[n] != shapes[n])
    problems = [f"missing {', '.join(missing)}" if missing else "",
                f"not in the model {', '.join(unexpected)}" if unexpected else "",
                f"of another shape {', '.join(wrong)}" if wrong else ""]
    problems = [p for p in problems if p]
    if problems:
        raise AutoparError(f"the checkpoint {folder} does not fit the "
                           f"{type(model).__name__}: {'; '.join(problems)}",
                           where="--init-from",
                           fix="pass a checkpoint of this model (the same architecture and "
                               "shape), or export a plan of the model the checkpoint holds")
    return reader, prefix, key_of


def load_weights(program: ParallelProgram, model: nn.Module, folder: str | Path) -> None:
    """Read this rank's slices of every parameter from the checkpoint ``folder`` into its
    allocated shards (``check_checkpoint`` first: ``model`` is the program's model on meta);
    every rank calls it, and each reads only what it holds."""
    reader, prefix, key_of = check_checkpoint(model, folder)
    targets: dict[str, torch.Tensor] = {}
    for name, param in program.named_parameters():
        key = key_of[name]
        if key in targets:  # a tied weight in two stage modules of one rank, sharded apart
            raise AutoparError(f"this rank holds {key} twice, as separate shards",
                               where="--init-from",
                               fix="load the checkpoint under a plan that keeps the tied "
                                   "weights on different pipeline ranks")
        targets[key] = param.detach()
    state, fill = for_load({"model": targets} if prefix == DCP_PREFIX else targets)
    dcp.load(state, storage_reader=reader)
    fill()


# ---- checkpoints: a fused projection's sectioned shards cross DCP whole ----------------------
# ``torch.distributed.checkpoint`` describes every rank's piece of a tensor as one block (an
# offset and a size). A sectioned DTensor (``passes/tensor_parallel.is_sectioned``: q, k and v
# each split over tp) is ``s`` blocks on a rank, so DCP refused to save it ("has overlapping
# chunks", nanoGPT under tp 2 x dp 2 ZeRO-3: ``tests/dist/test_export_generic.py``) and would
# read one into the wrong rows. ``for_save`` gathers each (``full_tensor``, a collective of its
# mesh; DCP writes one copy of the replicated value); ``for_load`` hands DCP an empty whole
# tensor, then copies this rank's ``local_slice`` of it into the shard. A checkpoint so holds
# the model's global tensor under any plan. The cost: one whole fused weight (or moment) at a
# time on each rank of its mesh, while saving or loading.


def for_save(state: dict) -> dict:
    """``state`` (nested dicts of tensors and values) with each sectioned DTensor replaced by
    its whole tensor. Every rank of a tensor's mesh must call it, in the same key order (a
    state dict's own)."""
    return {k: for_save(v) if isinstance(v, dict)
            else v.full_tensor() if is_sectioned(v) else v for k, v in state.items()}


def for_load(state: dict) -> tuple[dict, Callable[[], None]]:
    """(``state`` with each sectioned DTensor replaced by an empty whole tensor for
    ``dcp.load`` to fill, the function that then copies this rank's slice of each into the
    DTensor's local shard and puts the DTensor back in its place in the returned dict)."""
    fills: list[tuple[dict, str, DTensor]] = []

    def walk(d: dict) -> dict:
        out = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out[k] = walk(v)
            elif is_sectioned(v):
                out[k] = torch.empty(v.shape, dtype=v.dtype, device=v.to_local().device)
                fills.append((out, k, v))
            else:
                out[k] = v
        return out

    @torch.no_grad()
    def fill() -> None:
        for where, key, shard in fills:
            shard.to_local().copy_(local_slice(where[key], shard))
            where[key] = shard

    return walk(state), fill
