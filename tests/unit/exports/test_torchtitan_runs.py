"""torchtitan 0.3.0's own code run on each torchtitan export, reading back what it derives.

For each plan the exported ``autopar_plan.py`` is imported as torchtitan's launcher would (the
unpacked 0.3.0 wheel on ``sys.path``, ``scripts/fetch_frameworks.py``; its trainer's light
dependencies from the ``test`` extra) and its ``autopar_plan()`` called: a real
``Trainer.Config`` with its checks, whose ``to_dict()`` must hold the exported JSON. Then, as
``Trainer.__init__`` does, on the first rank of every pipeline stage of the plan's world under
the fake process group (the mesh on "cuda", as on the plan's cluster):

* ``ParallelDims.from_config`` (its checks) and ``build_mesh``: the degrees and each mesh axis's
  ranks (rank 0's groups) against the plan's ``ParallelConfig`` and autopar's strides
  (``autopar.core.mesh``), the experts' mesh included; the sequence against its
  ``seq_len_divisor``;
* the model built from the export's ``MODEL_SPEC`` on the meta device (the module names the
  pipeline split names; llama3's FlexAttention under cp; the float8 linears under fp8), the
  loss built (``config.loss.build``);
* under pipelining the model spec's ``pipelining_fn`` (llama3's ``pipeline_llm``): the
  schedule class, its micro-batches, each rank's stages and each stage's layers, against the
  plan's schedule, micro-batches and blocks per chunk.

What this machine cannot answer as the plan's cluster would is stood in for, each where it is
made, saying what and why.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

import export_checks as checks
from autopar import AutoparError, ClusterSpec, TrainSpec
from autopar.core.mesh import expert_sizes, expert_strides, mesh_sizes, mesh_strides
from autopar.core.stages import stage_chunks
from autopar.exports import export_target
from autopar.exports.torchtitan import JSON, MODULE, SCHEDULES

CASES = {
    **checks.FIXTURES,
    "llama_interleaved_bf16": lambda: checks.llama_interleaved("bf16"),
    # context parallelism with tp and sequence parallelism: torchtitan's seq_len_divisor
    "llama_cp2_tp2": lambda: checks.plan(
        "llama3-8b", checks.H100, 1, TrainSpec(global_batch=16, seq_len=8192),
        dp=2, cp=2, tp=2, sequence_parallel=True, zero=1, checkpoint="full"),
    # ep over tp ranks: under sequence parallelism the plan's experts fold over them too
    "mixtral_tp2_sp_ep4": lambda: checks.plan(
        "mixtral-8x7b", checks.H100, 2, TrainSpec(global_batch=64, seq_len=4096),
        dp=8, tp=2, sequence_parallel=True, ep=4, zero=1, micro_batch=1),
    # issue 33's plan kinds (export_checks.ISSUE_KINDS), each run or refused
    **{kind: partial(checks.issue_plan, kind) for kind in checks.ISSUE_KINDS},
}

REFUSED = checks.refused_for("torchtitan")
"""The cases ``autopar export`` refuses for torchtitan, and a word of the reason it gives."""

CUDA_CAPABILITY = {"A100": (8, 0), "H100": (9, 0), "H200": (9, 0), "H800": (9, 0),
                   "B200": (10, 0)}
"""The compute capability of the presets' GPUs (NVIDIA's CUDA GPU list,
developer.nvidia.com/cuda-gpus), by the start of ``GPUSpec.name``."""


@contextmanager
def fake_world(rank: int, world: int):
    """The default process group as ``rank`` of ``world`` under the fake backend (no
    communication), destroyed on leaving: the test's worker runs other tests after."""
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _capability(plan) -> tuple[int, int]:
    gpu = ClusterSpec.preset(plan.cluster, nodes=plan.nodes).gpu.name
    return next(cc for name, cc in CUDA_CAPABILITY.items() if gpu.startswith(name))


@pytest.fixture(autouse=True)
def _inductor_flag():
    """torchtitan's rowwise float8 converter sets ``torch._inductor.config
    .emulate_precision_casts`` for the whole process (pytorch/pytorch#150859): put back after
    each test, by assignment -- other tests share the worker, and torch's config module hides a
    name deleted from it (pytest 9's monkeypatch undoes a module attribute by deleting it, after
    which every ``torch.export`` in the worker fails)."""
    inductor = importlib.import_module("torch._inductor.config")
    saved = inductor.emulate_precision_casts
    yield
    inductor.emulate_precision_casts = saved


def _exported_module(plan, files: dict[str, str], tmp_path: Path, monkeypatch) -> ModuleType:
    """The exported ``autopar_plan.py``, imported (its ``MODEL_SPEC`` is built at import)."""
    # GPU-only probe: torchtitan's float8 converter asks torch.cuda whether the GPU is SM 8.9 or
    # later (tools/utils.py:has_cuda_capability); this machine has no CUDA, so it is answered
    # as the plan's cluster's GPU would
    float8 = importlib.import_module("torchtitan.components.quantization.float8")
    major_minor = _capability(plan)
    monkeypatch.setattr(float8, "has_cuda_capability",
                        lambda major, minor: major_minor >= (major, minor))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    spec = importlib.util.spec_from_file_location(f"autopar_plan_{id(plan)}", tmp_path / MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stand_in_model(plan):
    """Stand-in for a model torchtitan has none of (GPT-3's learned positions and GELU MLP,
    Mixtral's experts): the export leaves ``MODEL_SPEC`` for the user to set, saying so in its
    model row. torchtitan's llama3 debug model with the plan's number of blocks stands in: it
    has the module names every torchtitan decoder has (``tok_embeddings``, ``layers.<i>``,
    ``norm``, ``lm_head``), which are what the pipeline split and the mesh checks read."""
    llama3 = importlib.import_module("torchtitan.models.llama3")
    spec = llama3.model_registry("debugmodel")
    blocks = sum(plan.stage_blocks)
    return replace(spec, model=replace(spec.model, layers=[spec.model.layers[0]] * blocks))


def _holds(saved, derived, where: str = "") -> None:
    """Every field of the exported JSON is in torchtitan's ``to_dict()`` with that value."""
    if isinstance(saved, dict):
        for key, value in saved.items():
            assert isinstance(derived, dict) and key in derived, f"{where}.{key} not written"
            _holds(value, derived[key], f"{where}.{key}")
    elif isinstance(saved, list):
        assert isinstance(derived, list) and len(saved) == len(derived), where
        for i, (a, b) in enumerate(zip(saved, derived)):
            _holds(a, b, f"{where}[{i}]")
    else:
        assert saved == derived, f"{where}: exported {saved!r}, torchtitan {derived!r}"


def _group(mesh) -> list[int]:
    return mesh.mesh.flatten().tolist()


def _check_mesh(plan, dims) -> None:
    """torchtitan's degrees and rank 0's group on each mesh axis against the plan's."""
    c = plan.config
    replicate, shard = (c.dp, 1) if c.zero == 0 else (1, c.dp)
    assert (dims.pp, dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp, dims.ep) == \
        (c.pp, replicate, shard, c.cp, c.tp, c.ep)
    sizes, strides = mesh_sizes(c), mesh_strides(c)
    for axis, size in sizes.items():
        mesh = dims.get_optional_mesh(axis.value, include_singleton_axes=True)
        assert _group(mesh) == [i * strides[axis] for i in range(size)], axis
    # the experts: torchtitan's sparse mesh (pp, dp_replicate, efsdp, ep), ep innermost, carved
    # from dp_shard x cp x tp; it has no expert tensor-parallel axis, so only etp = 1 is
    # carried (the export's etp row says so otherwise)
    assert c.etp == 1
    ep = dims.get_optional_mesh("ep", include_singleton_axes=True)
    assert _group(ep) == [i * expert_strides(c)["ep"] for i in range(c.ep)]
    if c.ep > 1:
        efsdp = dims.get_optional_mesh("efsdp", include_singleton_axes=True)
        assert efsdp.size() == expert_sizes(c)["edp"]
    assert plan.train.seq_len % dims.seq_len_divisor == 0


@pytest.mark.parametrize("case", list(CASES))
def test_torchtitan_030_runs_each_export_and_derives_the_plan(case, tmp_path, monkeypatch):
    checks.torchtitan_package()
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.distributed import ParallelDims
    from torchtitan.tools.utils import set_default_dtype

    plan = CASES[case]()
    c, world = plan.config, plan.nodes * plan.gpus_per_node
    if case in REFUSED:  # refused by autopar with the reason, before anything is written
        with pytest.raises(AutoparError, match=REFUSED[case]):
            export_target(plan, "torchtitan")
        return
    files = export_target(plan, "torchtitan").files
    module = _exported_module(plan, files, tmp_path, monkeypatch)
    if module.MODEL_SPEC is None:
        monkeypatch.setattr(module, "MODEL_SPEC", _stand_in_model(plan))
    config = module.autopar_plan()  # Trainer.Config: its __post_init__'s checks ran
    saved = json.loads(files[JSON])
    if saved["model_spec"] is None:
        del saved["model_spec"]  # the stand-in's, not the export's
    _holds(saved, config.to_dict())

    # the trainer's model: its config told the run's settings, built on meta in training dtype
    spec = config.model_spec
    spec.model.update_from_config(config=config)
    with torch.device("meta"), set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
        model = spec.model.build()
    loss_fn = config.loss.build(compile_config=config.compile)
    names = {name for name, _ in model.named_modules()}
    parts = config.parallelism.module_fqns_per_model_part
    if parts is not None:
        assert {n for part in parts for n in part} <= names
    if c.cp > 1:  # the export's cp row: FlexAttention, keys and values all-gathered
        from torchtitan.models.common.attention import FlexAttention
        assert isinstance(model.layers["0"].attention.inner_attention, FlexAttention)
    if plan.train.precision.value == "fp8":  # the blocks' linears, not the head
        from torchtitan.components.quantization.float8 import Float8Linear
        float8 = {n for n, m in model.named_modules() if isinstance(m, Float8Linear)}
        assert float8 and all(n.startswith("layers.") for n in float8), sorted(float8)[-3:]

    stages: dict[int, tuple[int, list[str]]] = {}
    for pp_rank in range(c.pp):
        rank = pp_rank * (world // c.pp)  # the first rank of each pipeline stage
        with fake_world(rank, world):
            dims = ParallelDims.from_config(config.parallelism, world)  # as init_distributed
            dims.build_mesh()
            if pp_rank == 0:
                _check_mesh(plan, dims)
            if c.pp == 1:
                continue
            # stand-in: each chunk's tensor and data parallelism (llama3's parallelize_fn)
            # is left out, the chunk returned as it is: its fully_shard asks torch.cuda for
            # the current device, which this machine has not (and on a cpu mesh torch 2.13's
            # fully_shard refuses the plain tensors 0.3.0's default spmd_types backend leaves
            # as parameters); the mesh it would shard over is checked above
            schedule, chunks, _, _ = spec.pipelining_fn(
                model, parallel_dims=dims, training=config.training,
                parallelism=config.parallelism, compile_config=config.compile,
                ac_config=config.activation_checkpoint, dump_folder=str(tmp_path),
                device=torch.device("cuda", rank % plan.gpus_per_node),  # LOCAL_RANK's
                model_config=spec.model,
                parallelize_fn=lambda chunk, **_: chunk, loss_fn=loss_fn)
            assert type(schedule).__name__ == f"Schedule{SCHEDULES[c.schedule]}"
            assert schedule._n_microbatches == plan.estimate.num_microbatches
            local = getattr(schedule, "_stages", None) or [schedule._stage]
            assert len(local) == len(chunks) == c.virtual_stages
            for stage, chunk in zip(local, chunks):
                assert stage.num_stages == c.pp * c.virtual_stages
                stages[stage.stage_index] = (
                    pp_rank, [n for n, _ in chunk.named_children()]
                    + [f"layers.{i}" for i in chunk.layers])
    if c.pp > 1:  # every chunk on the rank the plan puts it on, with the plan's blocks
        blocks = stage_chunks(plan.stage_blocks, c.virtual_stages)
        assert sorted(stages) == list(range(len(blocks)))
        for index, (owner, held) in stages.items():
            assert owner == index % c.pp
            assert sum(n.startswith("layers.") for n in held) == blocks[index]
        assert "tok_embeddings" in stages[0][1] and "lm_head" in stages[len(blocks) - 1][1]


def test_torchtitan_030_puts_ep_on_the_tp_ranks_so_ep_with_tp_needs_sequence_parallelism():
    """Without sequence parallelism the plan's experts fold over the dp x cp ranks (ep groups
    ``tp`` ranks apart); torchtitan's ``ParallelDims`` carves ep from dp_shard x cp x tp with
    the tp ranks innermost, so its ep groups are neighbouring tp ranks: the export refuses."""
    checks.torchtitan_package()
    from torchtitan.distributed import ParallelDims

    plan = checks.plan("mixtral-8x7b", checks.H100, 2, TrainSpec(global_batch=64, seq_len=4096),
                       dp=8, tp=2, ep=2, zero=1, micro_batch=1)
    with fake_world(0, 16):
        dims = ParallelDims(dp_replicate=1, dp_shard=8, cp=1, tp=2, pp=1, ep=2, world_size=16)
        titan = _group(dims.get_optional_mesh("ep"))
    assert titan == [0, 1] != [i * expert_strides(plan.config)["ep"] for i in range(2)]
    with pytest.raises(AutoparError, match="no sequence parallelism"):
        export_target(plan, "torchtitan")
