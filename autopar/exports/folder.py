"""``export_plan(plan, folder)``: a runnable training folder for a plan (``autopar export``).

The folder holds:

* ``plan.json`` -- the plan, as ``Plan.to_json`` writes it;
* ``model.json`` -- the ``ModelSpec`` every rank builds (``autopar.core.model_spec``: zoo name and
  overrides, a factory -- its file copied into the folder -- or a transformers config);
* ``train.py`` -- ``autopar/exports/train_template.py`` copied verbatim: builds the model on the meta
  device, applies the plan, gives each rank only its shards (drawn from the seed, or read from
  ``--init-from`` weights: ``passes/materialize.py``), trains on synthetic tokens or a token
  file, logs loss and tokens/s, saves and resumes ``torch.distributed.checkpoint`` checkpoints
  (its docstring says how);
* ``launch.sh`` -- the ``torchrun`` command for the plan's nodes and GPUs per node;
* ``README.md`` -- what the plan is and how to run, resume and go multi-node.

Export checks what it can before anyone launches: the model builds, and the plan passes the
admissibility check for it and the passes' own limits (``passes.mesh.check_executable``).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import replace
from pathlib import Path

from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec
from autopar.passes.mesh import executable_spec
from autopar.core.plan import Plan

TEMPLATE = Path(__file__).with_name("train_template.py")
FILES = ("plan.json", "model.json", "train.py", "launch.sh", "README.md")
"""What ``export_plan`` writes."""
GIB = 2**30


def export_plan(plan: Plan, folder: str | os.PathLike[str], model_spec: ModelSpec | None = None,
                *, overwrite: bool = False) -> Path:
    """Write the runnable folder for ``plan`` (see the module docstring) and return its path.

    The model is the one the plan records (``plan.model_spec``); ``model_spec`` names it for a
    plan that records none, and must agree with it otherwise. Refuses a folder that already
    holds files unless ``overwrite`` (which replaces the files above and leaves the others,
    checkpoints included, alone)."""
    spec = executable_spec(plan, model_spec)
    out = Path(folder)
    check_folder(out, overwrite)
    try:
        out.mkdir(parents=True, exist_ok=True)
        spec = _copy_model_file(spec, out)
        (out / "plan.json").write_text(replace(plan, model_spec=spec).to_json(),
                                       encoding="utf-8")
        (out / "model.json").write_text(json.dumps(spec.to_dict(), indent=1, sort_keys=True)
                                        + "\n", encoding="utf-8")
        shutil.copyfile(TEMPLATE, out / "train.py")
        launch = out / "launch.sh"
        launch.write_text(launch_script(plan), encoding="utf-8")
        launch.chmod(launch.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        (out / "README.md").write_text(readme(plan, spec), encoding="utf-8")
    except OSError as err:
        raise AutoparError(f"cannot write the export folder {out}: {err.strerror} "
                           f"({err.filename})", where="the export folder",
                           fix="pass a folder you can create and write to") from None
    return out


def check_folder(out: Path, overwrite: bool) -> None:
    """``AutoparError`` unless ``out`` is a folder to export into: missing, empty, or (with
    ``overwrite``) one whose exported files may be replaced."""
    if out.exists() and not out.is_dir():
        raise AutoparError(f"{out} is a file", where="the export folder",
                           fix="pass a folder path (it is created if missing)")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise AutoparError(f"{out} is not empty", where="the export folder",
                           fix="export into a new or empty folder, or pass --overwrite "
                               "(overwrite=True) to replace the exported files in it")


def _copy_model_file(spec: ModelSpec, out: Path) -> ModelSpec:
    """A factory's file copied into ``out``; the spec then names the copy, relative to
    ``out`` (``ModelSpec.resolved`` reads it back)."""
    source = spec.file
    if source is None:
        return spec
    target = out / source.name
    if source.resolve() != target.resolve():
        shutil.copyfile(source, target)
    return ModelSpec(factory=f"{source.name}:{spec.factory.rpartition(':')[2]}")


def launch_script(plan: Plan) -> str:
    """``launch.sh``: ``torchrun`` over the plan's nodes and GPUs per node."""
    return f"""#!/usr/bin/env bash
# Train under the plan in plan.json: {plan.summary()}
# {plan.nodes} node(s) x {plan.gpus_per_node} process(es) = {plan.config.world_size} ranks.
# Arguments are passed to train.py (python3 train.py --help), e.g.
#   bash launch.sh --steps 100 --save-every 50
#
# Multi-node: run this script once on every node, with the same MASTER_ADDR/MASTER_PORT and
# NODE_RANK = 0 .. NNODES-1. Under Slurm, e.g. in an sbatch script:
#   export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
#   srun --ntasks-per-node=1 bash -c 'NODE_RANK=$SLURM_NODEID bash launch.sh'
# On Kubernetes (e.g. a PyTorchJob or an indexed Job), MASTER_ADDR is the head pod's service
# name and NODE_RANK the pod's index (JOB_COMPLETION_INDEX).
set -euo pipefail
HERE="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"

# Nodes taking part; the plan needs exactly {plan.nodes}.
NNODES="${{NNODES:-{plan.nodes}}}"
# This node's index, 0 .. NNODES-1, different on every node (the c10d rendezvous assigns the
# ranks itself; torchrun still names its logs and error files by it).
NODE_RANK="${{NODE_RANK:-0}}"
# Host and port of the rendezvous: any one node's address that all nodes can reach (the one
# with NODE_RANK=0 by convention). 127.0.0.1 is right for one node only.
MASTER_ADDR="${{MASTER_ADDR:-127.0.0.1}}"
MASTER_PORT="${{MASTER_PORT:-29500}}"
# Names this job's rendezvous; jobs sharing MASTER_ADDR:MASTER_PORT need different ids.
RDZV_ID="${{RDZV_ID:-autopar}}"
# Processes per node: the plan's GPUs per node (on a machine without CUDA, CPU processes).
NPROC_PER_NODE={plan.gpus_per_node}
# CPU threads per process: the cores shared among the local processes (at least 1).
CORES="$(nproc 2>/dev/null || echo 1)"
THREADS=$(( CORES / NPROC_PER_NODE > 0 ? CORES / NPROC_PER_NODE : 1 ))
export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-$THREADS}}"
TORCHRUN="${{TORCHRUN:-torchrun}}"

exec "$TORCHRUN" \\
    --nnodes "$NNODES" \\
    --nproc-per-node "$NPROC_PER_NODE" \\
    --node-rank "$NODE_RANK" \\
    --rdzv-backend c10d \\
    --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \\
    --rdzv-id "$RDZV_ID" \\
    --max-restarts 0 \\
    "$HERE/train.py" "$@"
"""


def readme(plan: Plan, spec: ModelSpec) -> str:
    """The folder's ``README.md``."""
    est = plan.estimate
    if plan.nodes == 1:
        nodes = ("This plan runs on one node. For a plan over several nodes, `launch.sh` runs "
                 "on each node with")
    else:
        nodes = f"Run `launch.sh` on each of the {plan.nodes} nodes with"
    return f"""# {spec.label}: {plan.summary()}

The plan for {plan.nodes} node(s) x {plan.gpus_per_node} GPUs of `{plan.cluster}`: global batch
{plan.train.global_batch} sequences of {plan.train.seq_len} tokens, precision
{plan.train.precision}, exported by autopar.

Predicted by autopar's cost model for those GPUs: **{est.step_time_s:.4g} s per step**
({est.tokens_per_s:,.0f} tokens/s, MFU {est.mfu:.1%}) and **{est.peak_memory_bytes / GIB:.2f} GiB**
peak memory on the most loaded GPU ({'fits' if est.fits else 'does NOT fit'}).

```
{plan.report(width=100).rstrip()}
```

## Files

| file | what |
|---|---|
| `plan.json` | the plan (`autopar.Plan.from_json`) |
| `model.json` | the model every rank builds (`autopar.core.model_spec.ModelSpec`; a factory's file is copied beside it) |
| `train.py` | the training script; `python3 train.py --help` |
| `launch.sh` | `torchrun` for this plan; arguments go to `train.py` |

## Run

    bash launch.sh --steps 100 --log-every 10 --save-every 50

starts {plan.gpus_per_node} process(es) on this node. Each rank builds the model on the meta
device (shapes only), applies the plan there, and then allocates and initialises only its own
shards from `--seed`: each parameter is drawn whole from its own random stream, this rank's
slice kept and the rest freed, one parameter at a time, so the shards equal the slices of the
one-process model `ModelSpec.build("cpu", seed)` bit for bit. **Memory while starting: at most
this rank's shards plus one whole parameter in fp32 (the largest, the embedding or the head,
bounds it) plus the buffers**; a model given as `FILE.py:FACTORY` is the exception, built whole
once on the CPU because its own code decides its init. The log's first record gives each
rank's resident memory before the build, its peak after its weights are in, and the bytes it
holds. The rank holding the last
pipeline stage with data- and tensor-parallel rank 0 prints one JSON line per logged step
(step, loss over the global batch, tokens/s) and appends it to `train_log.jsonl`
(`--log-file`). Without CUDA the ranks run on the CPU with gloo: fine for small models, and
its tokens/s say nothing about the prediction above.

## Data

Without `--tokens` the script trains on uniform random tokens
(`autopar.models.training.synthetic_batch`, drawn from `--seed`). `--tokens FILE` reads a flat array
of token ids: a `.npy` file, or a raw binary file of `uint16` (nanoGPT's `.bin`) or `int32`
(`--tokens-dtype int32`). Step `s` reads rows `(s - 1) * {plan.train.global_batch}` onwards,
consecutive windows of {plan.train.seq_len} + 1 tokens. Ids must be below the model's vocabulary
size.

## Checkpoints and resuming

`--save-every N` writes `torch.distributed.checkpoint` checkpoints to `--checkpoint-dir`
(default `checkpoints/`) as `step-<N>/`, the state after N steps. `--resume` continues from the
latest complete one there, `--resume PATH` from a given one, at step N+1; `--steps` is the step
to stop at, counted from 1 across resumes. Pass the same `--seed` and data when resuming.
Checkpoints are keyed by the model's parameter names, not by the plan, so one saved under this
plan loads under any other plan of the same model (export the other plan and pass
`--resume PATH`): the checkpoint library reshards model and optimizer state.

## Starting from given weights

    bash launch.sh --init-from DIR --steps 100

reads the weights from `DIR` instead of drawing them, each rank reading only the slices it
holds (`torch.distributed.checkpoint`): a transformers folder (`save_pretrained`'s
`model.safetensors`, or its shards with `model.safetensors.index.json`; the keys are the
parameter names, which a transformers Llama shares, and a zoo model's `state_dict` saved with
`safetensors.torch.save_file` loads too), or a checkpoint this script saved (`step-<N>/`, under
any plan of the same model). Missing, unexpected or mis-shaped keys stop the run with what
differs. Training then starts at step 1 with a fresh optimizer; to continue a run with its
optimizer state use `--resume` instead.

## Several nodes

{nodes} `NNODES` set to the node count, a different `NODE_RANK` (0, 1, ...) on each node and
the same `MASTER_ADDR`/`MASTER_PORT` (an address of one node that all can reach); the comments
in `launch.sh` show Slurm and Kubernetes. The checkpoint folder must be on storage all nodes
share.
"""
