"""``autopar export --format megatron|deepspeed|torchtitan|bridge``: each target's files, field by
field, checked against the target's own names.

* Megatron-LM: the script's arguments parsed by a parser built from every option of
  Megatron-LM's own parser (``tests/data/megatron_lm_args.json``: NVIDIA/Megatron-LM
  ``megatron/training/arguments.py``, ``add_megatron_arguments``, at
  d98e8a64ddf34856e74b24714e3bedb2f5a39553).
* DeepSpeed: the JSON loaded by DeepSpeed's own ``deepspeed.runtime.config.DeepSpeedConfig``
  (``deepspeed==0.19.8``; skipped when deepspeed is not installed).
* torchtitan: keys against the config classes' fields (``tests/data/torchtitan_config_fields.json``:
  pytorch/torchtitan ``torchtitan/config/configs.py``, ``torchtitan/trainer.py``,
  ``torchtitan/distributed/activation_checkpoint.py``,
  ``torchtitan/components/optimizer/optimizer.py``, ``torchtitan/models/llama3/__init__.py`` at
  b5bcd76c66d0acb1a08b176d9639425bc55e0b2a), schedules against torch's own classes.
* Megatron-Bridge: override keys against its config sections
  (``tests/data/megatron_bridge_keys.json``: NVIDIA-NeMo/Megatron-Bridge
  ``src/megatron/bridge/training/config.py``, ``models/gpt_provider.py``,
  ``training/mixed_precision.py`` at 067f987df03b8355b03192d88d70f1709fedf51a, and the
  Megatron-Core classes of its sections at the Megatron-LM commit above); Bridge 0.6.2's own
  code applies and validates them in ``test_bridge_runs.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import ast
import json
import math
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
import torch

import autopar
from autopar import AutoparError, ParallelConfig, TrainSpec
from autopar.cli.main import main
from autopar.exports import FORMATS, TARGETS, export_formats, export_target
from autopar.exports.mapping import Fit
from autopar.exports.megatron import layout_string
from autopar.exports.torchtitan import LLAMA3_FLAVORS
import export_checks as checks
from export_checks import H100, plan as _plan, torchtitan_configs

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.fixture(scope="module")
def llama_interleaved_fp16():
    return checks.llama_interleaved("fp16")


@pytest.fixture(scope="module")
def gpt175b():
    return checks.gpt175b()


@pytest.fixture(scope="module")
def llama_zero3_offload():
    return checks.llama_zero3_offload()


@pytest.fixture(scope="module")
def llama_uneven_blocks():
    return checks.llama_uneven_blocks()


# ----- Megatron-LM -----

def _megatron_parser() -> argparse.ArgumentParser:
    """Megatron-LM's options (the fixture): switches, values, lists, choices."""
    table = json.loads((DATA / "megatron_lm_args.json").read_text())
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    for flag, spec in table["options"].items():
        if flag == "--help":
            continue
        kwargs: dict = {"dest": spec["dest"]}
        if spec["kind"] == "switch":  # unset: None; given: what the flag stores
            kwargs.update(action="store_const", const=spec["stores"])
        else:
            kwargs["nargs"] = {"list": "+", "value": None}.get(spec["kind"],
                                                                 spec["kind"].lstrip("n"))
            if kwargs["nargs"] not in (None, "+"):
                kwargs["nargs"] = int(kwargs["nargs"])
            if "choices" in spec:
                kwargs["choices"] = spec["choices"]
        p.add_argument(flag, **kwargs)
    return p


def _megatron_args(plan, tmp_path) -> argparse.Namespace:
    """The script's MEGATRON_ARGS as bash expands them, parsed with Megatron-LM's options."""
    folder = export_formats(plan, tmp_path / "megatron", "megatron")["megatron"]
    script = folder / "megatron_args.sh"
    words = subprocess.run(["bash", "-c", f'source "{script}"; printf "%s\\n" '
                                          '"${MEGATRON_ARGS[@]}"'],
                           capture_output=True, text=True, check=True).stdout.split("\n")[:-1]
    args, unknown = _megatron_parser().parse_known_args(words)
    assert not unknown, f"not Megatron-LM options: {unknown}"
    return args


def test_megatron_options_fixture_rejects_what_megatron_lm_does_not_take():
    parser = _megatron_parser()
    _, unknown = parser.parse_known_args(["--tensor-parallel-size", "2"])  # not its spelling
    assert unknown == ["--tensor-parallel-size", "2"]
    with pytest.raises(argparse.ArgumentError):
        parser.parse_known_args(["--recompute-granularity", "block"])  # not one of its choices


def test_megatron_interleaved_fp16_plan_field_by_field(llama_interleaved_fp16, tmp_path):
    plan = llama_interleaved_fp16
    a = _megatron_args(plan, tmp_path)
    c = plan.config
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size,
            a.context_parallel_size, a.expert_model_parallel_size) == ("2", "2", "1", "1")
    assert a.num_layers_per_virtual_pipeline_stage == str(32 // (c.pp * c.virtual_stages))
    assert a.sequence_parallel and a.use_distributed_optimizer and not a.use_megatron_fsdp
    assert a.recompute_granularity == "selective" and a.recompute_modules == ["core_attn"]
    assert a.recompute_method is None and a.recompute_num_layers is None
    assert (a.micro_batch_size, a.global_batch_size, a.seq_length) == ("1", "64", "4096")
    assert a.fp16 and not a.bf16 and a.initial_loss_scale == "65536" and a.hysteresis == "1"
    assert a.optimizer == "adam"
    assert (a.num_layers, a.hidden_size, a.ffn_hidden_size, a.num_attention_heads) == \
        ("32", "4096", "14336", "32")
    assert a.group_query_attention and a.num_query_groups == "8"
    assert a.swiglu and a.normalization == "RMSNorm" and a.position_embedding_type == "rope"
    assert a.untie_embeddings_and_output_weights and a.add_bias_linear is False  # no biases
    rows = {r.field: r for r in export_target(plan, "megatron").rows}
    assert rows["config.checkpoint"].fit is Fit.EXACT  # Korthikanti et al.'s policy itself
    assert rows["config.virtual_stages"].fit is Fit.EXACT


def test_matmuls_maps_close_to_megatron_selective_and_torchtitan_selective_ac(
        llama_interleaved_fp16, tmp_path, monkeypatch):
    plan = _plan("llama3-8b", H100, 2, TrainSpec(global_batch=64, seq_len=4096),
                 **{**llama_interleaved_fp16.config.to_dict(), "checkpoint": "matmuls"})
    a = _megatron_args(plan, tmp_path)
    assert a.recompute_granularity == "selective" and a.recompute_modules == ["core_attn",
                                                                               "layernorm"]
    rows = {r.field: r for r in export_target(plan, "megatron").rows}
    assert rows["config.checkpoint"].fit is Fit.CLOSE  # Megatron keeps the MLP activation
    rows = {r.field: r for r in export_target(plan, "torchtitan").rows}
    assert rows["config.checkpoint"].fit is Fit.CLOSE and "matmuls" in rows[
        "config.checkpoint"].note
    rows = {r.field: r for r in export_target(plan, "deepspeed").rows}
    assert rows["config.checkpoint"].fit is Fit.NONE


def test_torchtitan_selective_ac_is_another_policy_than_korthikantis(llama_interleaved_fp16):
    bf16 = _plan("llama3-8b", H100, 2, TrainSpec(global_batch=64, seq_len=4096),
                 **llama_interleaved_fp16.config.to_dict())
    row = {r.field: r for r in export_target(bf16, "torchtitan").rows}["config.checkpoint"]
    assert row.fit is Fit.CLOSE and "another policy" in row.note


def test_megatron_gpt175b_full_recompute_and_gpt_shape(gpt175b, tmp_path):
    a = _megatron_args(gpt175b, tmp_path)
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size) == ("8", "8")
    assert a.num_layers_per_virtual_pipeline_stage == "4"  # 96 layers / (8 x 3) chunks
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == \
        ("full", "uniform", "1")
    assert a.bf16 and not a.fp16 and a.global_batch_size == "1536"
    assert a.normalization == "LayerNorm" and a.position_embedding_type == "learned_absolute"
    assert not a.swiglu and not a.untie_embeddings_and_output_weights  # GPT: tied, GELU
    assert not a.group_query_attention


def test_megatron_uneven_stages_are_a_layout_and_block_recompute_is_exact(
        llama_uneven_blocks, tmp_path):
    plan = llama_uneven_blocks
    assert plan.stage_blocks == (11, 11, 10)
    a = _megatron_args(plan, tmp_path)
    layout = a.pipeline_model_parallel_layout
    assert layout == layout_string([11, 11, 10]) == "E" + "t" * 11 + "|" + "t" * 11 + "|" + \
        "t" * 10 + "L"
    assert a.num_layers_per_virtual_pipeline_stage is None
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == \
        ("full", "block", "4")
    rows = {r.field: r for r in export_target(plan, "megatron").rows}
    assert rows["config.checkpoint"].fit is Fit.EXACT


def test_megatron_zero3_is_megatron_fsdp_and_offload_the_cpu_optimizer(llama_zero3_offload,
                                                                       tmp_path):
    a = _megatron_args(llama_zero3_offload, tmp_path)
    assert a.use_megatron_fsdp and a.data_parallel_sharding_strategy == "optim_grads_params"
    assert a.optimizer_cpu_offload and a.use_precision_aware_optimizer
    assert a.optimizer_offload_fraction == "1"


def test_megatron_and_bridge_refuse_bf16_pure(llama_zero3_offload):
    from dataclasses import replace

    pure = replace(llama_zero3_offload, train=TrainSpec(global_batch=64, seq_len=4096,
                                                        precision="bf16-pure"))
    for target in ("megatron", "bridge"):
        with pytest.raises(AutoparError, match="main-params-dtype"):
            export_target(pure, target)


# ----- DeepSpeed -----

def _deepspeed_config(plan, monkeypatch):
    """The export loaded by DeepSpeed's own parser as ``deepspeed.initialize`` loads it when
    launched as the export's README says, on the plan's world: without an ``mpu`` (AutoTP
    gives none) it counts the whole world as data parallel; a ``PipelineModule`` hands it
    its grid, whose data-parallel size DeepSpeed's ``PipeDataParallelTopology`` gives. Only
    the process group is a stand-in: its rank and world size, the plan's."""
    ds_config = pytest.importorskip(
        "deepspeed.runtime.config",
        reason="deepspeed is not installed (pip install deepspeed==0.19.8; DS_BUILD_OPS=0)")
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology

    world, pp = plan.config.world_size, plan.config.pp
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_config.dist, "get_world_size", lambda *a, **k: world)
    mpu = None
    if pp > 1:
        topology = PipeDataParallelTopology(num_pp=pp, num_dp=world // pp)

        class Grid:  # the PipelineModule's grid: its data-parallel size from the topology
            def get_data_parallel_world_size(self) -> int:
                return topology.get_dim("data")

        mpu = Grid()
    text = export_target(plan, "deepspeed").files["ds_config.json"]
    return json.loads(text), ds_config.DeepSpeedConfig(json.loads(text), mpu=mpu)


def test_deepspeed_parser_rejects_a_wrong_key(llama_zero3_offload, monkeypatch):
    raw, _ = _deepspeed_config(llama_zero3_offload, monkeypatch)
    from deepspeed.runtime.config import DeepSpeedConfig

    raw["zero_optimization"]["stagee"] = 1
    with pytest.raises(Exception, match="stagee"):
        DeepSpeedConfig(raw)


def test_deepspeed_fp16_pipeline_plan_loads_in_deepspeeds_parser(llama_interleaved_fp16,
                                                                   monkeypatch):
    plan = llama_interleaved_fp16
    raw, ds = _deepspeed_config(plan, monkeypatch)
    m = plan.estimate.num_microbatches
    # DeepSpeed counts the two tp ranks' identical micro-batches apart: 2 x 64
    assert (ds.train_batch_size, ds.train_micro_batch_size_per_gpu,
            ds.gradient_accumulation_steps) == (2 * 64, 1, m)
    assert ds.communication_data_type == torch.float32  # reduced as autopar's engine reduces
    assert ds.zero_optimization_stage == 1 and ds.zero_config.offload_optimizer is None
    assert ds.float16_config.enabled and ds.float16_config.loss_scale == 0  # dynamic
    assert ds.float16_config.initial_scale_power == 16 and not ds.bfloat16_config.enabled
    assert ds.tensor_parallel_config.autotp_size == 2
    assert "activation_checkpointing" not in raw  # selective: no DeepSpeed equivalent
    rows = {r.field: r for r in export_target(plan, "deepspeed").rows}
    assert rows["config.checkpoint"].fit is Fit.NONE
    assert rows["config.schedule"].fit is Fit.CLOSE  # no interleaving in DeepSpeed
    assert rows["config.pp"].target.startswith("PipelineModule(")


def test_deepspeed_zero3_offload_and_bf16(llama_zero3_offload, monkeypatch):
    raw, ds = _deepspeed_config(llama_zero3_offload, monkeypatch)
    assert ds.zero_optimization_stage == 3
    assert ds.zero_config.offload_optimizer.device == "cpu"
    assert ds.zero_config.offload_param is None  # autopar offloads no parameters
    assert ds.bfloat16_config.enabled and not ds.float16_config.enabled
    assert ds.train_batch_size == 64 and ds.gradient_accumulation_steps == 4
    assert ds.communication_data_type == torch.float32
    assert "activation_checkpointing" in raw and "tensor_parallel" not in raw
    assert ds.optimizer_name == "adamw"


def test_deepspeed_gpt175b_full_recompute_under_pipelining(gpt175b, monkeypatch):
    raw, ds = _deepspeed_config(gpt175b, monkeypatch)
    assert ds.train_batch_size == 8 * 1536 and ds.gradient_accumulation_steps == 96
    assert ds.pipeline["activation_checkpoint_interval"] == 1
    assert ds.tensor_parallel_config.autotp_size == 8


def test_deepspeed_refuses_context_parallel_and_zero3_pipelines(llama_interleaved_fp16):
    cp = _plan("llama3-8b", H100, 1, TrainSpec(global_batch=8, seq_len=8192),
               dp=4, cp=2, zero=1, micro_batch=1)
    with pytest.raises(AutoparError, match="Ulysses"):
        export_target(cp, "deepspeed")
    pp_zero3 = _plan("llama3-8b", H100, 1, TrainSpec(global_batch=16, seq_len=4096),
                     dp=4, pp=2, zero=3, micro_batch=1)
    with pytest.raises(AutoparError, match="ZeRO-2 and ZeRO-3"):
        export_target(pp_zero3, "deepspeed")


@pytest.mark.parametrize("kind", list(checks.ISSUE_KINDS))
def test_deepspeed_parses_each_issue_kind_at_its_world_size(kind, monkeypatch):
    """Each of issue 33's plan kinds (``export_checks.ISSUE_KINDS``) in DeepSpeed's own parser
    on the plan's whole world, as ``deepspeed.initialize`` builds it (``_deepspeed_config``;
    ``tests/dist/test_deepspeed_initialize.py`` runs the engine itself on 2-GPU plans): its
    batch check passes and what it derives is the plan's, or the export refuses with the
    reason (``export_checks.REFUSED``)."""
    plan, word = checks.issue_plan(kind), checks.REFUSED.get((kind, "deepspeed"))
    if word is not None:
        with pytest.raises(AutoparError, match=word):
            export_target(plan, "deepspeed")
        return
    c, t = plan.config, plan.train
    raw, ds = _deepspeed_config(plan, monkeypatch)
    # DeepSpeed's data-parallel count: the world (AutoTP's tp ranks, which read the same
    # micro-batches, counted apart), or a PipelineModule grid's world / pp
    assert ds.world_size == c.dp * c.tp
    assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == \
        (c.micro_batch, plan.estimate.num_microbatches)
    assert ds.train_batch_size == t.global_batch * c.tp  # the plan's sequences, tp times over
    assert ds.zero_optimization_stage == c.zero
    assert (ds.zero_config.offload_optimizer is not None) == c.offload
    if c.offload:
        assert ds.zero_config.offload_optimizer.device == "cpu"
    precision = t.precision.value
    assert (ds.bfloat16_config.enabled, ds.float16_config.enabled) == \
        (precision == "bf16", precision == "fp16")
    if precision == "fp16":  # autopar's loss scaling (models/training.py LOSS_SCALING)
        f16 = ds.float16_config
        assert (f16.loss_scale, f16.initial_scale_power, f16.loss_scale_window,
                f16.hysteresis) == (0, 16, 2000, 1)
    assert ds.optimizer_name == t.optimizer.value
    reduced = t.grad_dtype.value if t.grad_dtype.value == "fp32" else precision
    assert ds.communication_data_type == {"fp32": torch.float32, "bf16": torch.bfloat16,
                                          "fp16": torch.float16}[reduced]
    assert ds.tensor_parallel_config.autotp_size == (c.tp if c.tp > 1 else 0)
    ep = ds.expert_parallel_config  # AutoEP, as DeepSpeed parsed it
    assert (ep.enabled, ep.autoep_size) == (c.ep > 1, c.ep)
    if c.pp > 1 and c.checkpoint == "full":
        assert ds.pipeline["activation_checkpoint_interval"] == 1


# ----- torchtitan -----

TITAN = json.loads((DATA / "torchtitan_config_fields.json").read_text())


def _titan(plan) -> tuple[dict, ast.Module]:
    files = export_target(plan, "torchtitan").files
    return json.loads(files["autopar_plan_config.json"]), ast.parse(files["autopar_plan.py"])


def _call_keywords(tree: ast.Module, name: str) -> dict[str, object]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == name:
            return {k.arg: ast.unparse(k.value) for k in node.keywords}
    raise AssertionError(f"no call of {name}")


def test_torchtitan_keys_are_its_config_fields(llama_interleaved_fp16, gpt175b,
                                               llama_zero3_offload):
    bf16 = _plan("llama3-8b", H100, 2, TrainSpec(global_batch=64, seq_len=4096),
                 **llama_interleaved_fp16.config.to_dict())
    for plan in (bf16, llama_zero3_offload, gpt175b):
        saved, tree = _titan(plan)
        classes = TITAN["classes"]
        assert set(saved) <= set(classes["Trainer.Config"])
        assert set(saved["training"]) <= set(classes["TrainingConfig"])
        assert set(saved["parallelism"]) <= set(classes["ParallelismConfig"])
        assert set(_call_keywords(tree, "TrainingConfig")) <= set(classes["TrainingConfig"])
        assert set(_call_keywords(tree, "ParallelismConfig")) <= \
            set(classes["ParallelismConfig"])
        assert set(_call_keywords(tree, "Trainer.Config")) <= set(classes["Trainer.Config"])
        assert set(_call_keywords(tree, "ParamGroupConfig")) <= set(classes["ParamGroupConfig"])


def test_torchtitan_pipeline_fields_and_token_counts(gpt175b):
    from torch.distributed.pipelining.schedules import get_schedule_class

    saved, _ = _titan(gpt175b)
    par, training = saved["parallelism"], saved["training"]
    assert get_schedule_class(par["pipeline_parallel_schedule"]).__name__ == \
        "ScheduleInterleaved1F1B"
    parts = par["module_fqns_per_model_part"]
    assert len(parts) == 8 * 3 and parts[0][0] == "tok_embeddings"
    assert parts[-1][-2:] == ["norm", "lm_head"]
    layers = [m for part in parts for m in part if m.startswith("layers.")]
    assert layers == [f"layers.{i}" for i in range(96)]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"],
            par["tensor_parallel_degree"], par["enable_sequence_parallel"]) == (16, 1, 8, True)
    # torchtitan 0.3.0's trainer.py: accumulation = global_batch_size / (local_batch_size x
    # dp); pipeline micro-batches = local_batch_size / pipeline_parallel_microbatch_size --
    # one pipeline run of 96 per step; CUDA graphs off, which it requires under pipelining
    accumulation = training["global_batch_size"] // (training["local_batch_size"] * 16)
    assert training["global_batch_size"] % (training["local_batch_size"] * 16) == 0
    pp_microbatches = training["local_batch_size"] // par["pipeline_parallel_microbatch_size"]
    assert accumulation == 1 and pp_microbatches == 96
    assert training["seq_len"] == 2048 and training["disable_cuda_graphs"] is True
    assert training["mixed_precision_param"] == "bfloat16"
    assert saved["activation_checkpoint"] == {"preserve_rng_state": True,
                                              "determinism_check": "default", "debug": False}


def test_torchtitan_zero3_offload_and_llama3_flavor(llama_zero3_offload):
    saved, tree = _titan(llama_zero3_offload)
    assert saved["model_spec"] == {"name": "llama3", "flavor": "8B"}
    assert saved["parallelism"]["fsdp_reshard_after_forward"] == "always"
    assert saved["training"]["enable_cpu_offload"] is True
    # without pipelining torchtitan 0.3.0 accumulates local batches x dp up to the step
    t = saved["training"]
    assert t["global_batch_size"] // (t["local_batch_size"] * 16) \
        == llama_zero3_offload.estimate.num_microbatches
    assert "FullAC" in _call_keywords(tree, "Trainer.Config")["activation_checkpoint"]


def test_torchtitan_llama3_flavors_match_its_model_registry():
    def ffn(dim: int, multiplier: float, multiple_of: int) -> int:  # llama3's rule
        hidden = int(multiplier * int(2 * 4 * dim / 3))
        return multiple_of * math.ceil(hidden / multiple_of)

    source = TITAN["llama3_flavors"]
    for flavor, f in LLAMA3_FLAVORS.items():
        s = source["_" + flavor.lower()]
        assert (f["num_layers"], f["hidden_size"], f["num_heads"], f["num_kv_heads"],
                f["vocab_size"]) == (s["n_layers"], s["dim"], s["n_heads"], s["n_kv_heads"],
                                     s["vocab_size"])
        assert f["ffn_hidden_size"] == ffn(s["dim"], s["ffn_dim_multiplier"], s["multiple_of"])


def test_torchtitan_refuses_fp16(llama_interleaved_fp16):
    with pytest.raises(AutoparError, match="bfloat16 or float32"):
        export_target(llama_interleaved_fp16, "torchtitan")


# ----- Megatron-Bridge -----

BRIDGE = json.loads((DATA / "megatron_bridge_keys.json").read_text())


def _overrides(plan) -> dict[str, str]:
    text = export_target(plan, "bridge").files["overrides.txt"]
    return dict(line.split("=", 1) for line in text.splitlines())


@pytest.fixture(scope="module")
def mixtral_ep8():
    return checks.mixtral_ep8()


def test_bridge_overrides_are_fields_of_its_config_sections(llama_interleaved_fp16, gpt175b,
                                                            llama_zero3_offload,
                                                            llama_uneven_blocks, mixtral_ep8):
    for plan in (llama_interleaved_fp16, gpt175b, llama_zero3_offload, llama_uneven_blocks,
                 mixtral_ep8):
        for key, value in _overrides(plan).items():
            section, _, name = key.rpartition(".")
            assert name in BRIDGE["sections"][section], key
            if key == "mixed_precision":  # a recipe, or a MixedPrecisionConfig in whole
                assert value in BRIDGE["mixed_precision_recipes"] or value.startswith(
                    "{_target_:megatron.bridge.training.mixed_precision.MixedPrecisionConfig,")


def test_bridge_values_field_by_field(llama_interleaved_fp16, gpt175b):
    o = _overrides(llama_interleaved_fp16)
    assert o["model.tensor_model_parallel_size"] == "2"
    assert o["model.pipeline_model_parallel_size"] == "2"
    assert o["model.virtual_pipeline_model_parallel_size"] == "2"
    assert o["model.sequence_parallel"] == "true"
    assert o["model.recompute_granularity"] == "selective"
    assert o["model.recompute_modules"] == "[core_attn]"
    assert o["ddp.use_distributed_optimizer"] == "true"
    assert (o["train.micro_batch_size"], o["train.global_batch_size"]) == ("1", "64")
    assert o["dataset.seq_length"] == o["model.seq_length"] == "4096"
    assert o["model.num_query_groups"] == "8"
    assert "fp16:true" in o["mixed_precision"] and "grad_reduce_in_fp32:true" in \
        o["mixed_precision"] and "initial_loss_scale:65536" in o["mixed_precision"]
    g = _overrides(gpt175b)
    assert g["model.virtual_pipeline_model_parallel_size"] == "3"
    assert (g["model.recompute_granularity"], g["model.recompute_method"],
            g["model.recompute_num_layers"]) == ("full", "uniform", "1")
    assert g["mixed_precision"] == "bf16_mixed"
    rows = {r.field: r for r in export_target(llama_interleaved_fp16, "bridge").rows}
    assert rows["train.precision"].fit is Fit.EXACT  # autopar's loss scaling, not fp16_mixed's


# ----- every target: the table, the folder, the command line -----

def test_every_plan_field_is_a_row_of_every_target(gpt175b):
    names = {f"config.{f.name}" for f in fields(ParallelConfig)} | \
        {f"train.{f.name}" for f in fields(TrainSpec)} | {"stage_blocks"}
    for target in TARGETS:
        export = export_target(gpt175b, target)
        rows = {r.field: r for r in export.rows}
        assert names <= set(rows), (target, names - set(rows))
        assert all(r.note != "not carried to this target" for r in rows.values()), target


def test_readme_lists_what_does_not_map_first(gpt175b, tmp_path):
    out = export_formats(gpt175b, tmp_path / "ds", "deepspeed")["deepspeed"]
    readme = (out / "README.md").read_text()
    head, table = readme.split("## Every plan field")
    assert "## What does not map exactly" in head
    assert "**config.virtual_stages = 3** (no equivalent)" in head
    assert "| config.zero | 1 | zero_optimization.stage = 1 | exact |" in table


def test_cli_exports_all_formats_into_folders(llama_zero3_offload, tmp_path):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(llama_zero3_offload.to_json())
    assert main(["export", str(plan_file), str(tmp_path / "all"), "--format", "all"]) == 0
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == sorted(FORMATS)
    assert (tmp_path / "all" / "megatron" / "megatron_args.sh").stat().st_mode & 0o100
    assert main(["export", str(plan_file), str(tmp_path / "one"), "--format", "bridge"]) == 0
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["README.md",
                                                                    "overrides.txt"]


def test_cli_refusals_and_bad_formats_exit_2_and_write_nothing(llama_interleaved_fp16,
                                                               tmp_path, capsys):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(llama_interleaved_fp16.to_json())  # fp16: torchtitan refuses it
    out = tmp_path / "out"
    assert main(["export", str(plan_file), str(out), "--format", "megatron,torchtitan"]) == 2
    err = capsys.readouterr().err
    assert "torchtitan export" in err and "leave torchtitan out" in err and not out.exists()
    assert main(["export", str(plan_file), str(out), "--format", "megatron-lm"]) == 2
    assert "unknown export format megatron-lm" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "none.json"), str(out), "--format", "deepspeed"]) == 2


@pytest.mark.parametrize("model,fit", [("tiny-moe", Fit.EXACT), ("tiny-deepseek", Fit.CLOSE)])
def test_moe_maps_to_megatron_recompute_modules_moe_and_the_nearest_elsewhere(model, fit,
                                                                            tmp_path):
    from autopar.costmodel.cluster import process_cluster

    plan = autopar.plan_for(autopar.models.build(model, device="meta"), process_cluster(2),
                            TrainSpec(global_batch=4, seq_len=32),
                            ParallelConfig(dp=2, ep=2, zero=1, checkpoint="moe"), name=model)
    a = _megatron_args(plan, tmp_path)
    assert a.recompute_granularity == "selective" and a.recompute_modules == ["moe"]
    rows = {r.field: r for r in export_target(plan, "megatron").rows}
    # DeepSeek's shared experts sit beside the layer here, inside Megatron's MoE layer
    assert rows["config.checkpoint"].fit is fit
    rows = {r.field: r for r in export_target(plan, "torchtitan").rows}
    assert rows["config.checkpoint"].fit is Fit.CLOSE and "FullAC" in rows[
        "config.checkpoint"].target
    rows = {r.field: r for r in export_target(plan, "deepspeed").rows}
    assert rows["config.checkpoint"].fit is Fit.NONE


# ----- FP8 -----

@pytest.fixture(scope="module")
def llama_fp8():
    return checks.llama_fp8()


def test_megatron_carries_fp8_as_its_flags(llama_fp8, tmp_path):
    a = _megatron_args(llama_fp8, tmp_path)
    assert (a.fp8, a.fp8_recipe, a.fp8_param_gather, a.bf16) == ("hybrid", "tensorwise", True,
                                                                  True)
    rowwise = dataclasses.replace(llama_fp8, train=dataclasses.replace(
        llama_fp8.train, fp8_recipe="rowwise"))
    b = _megatron_args(rowwise, tmp_path / "rowwise")
    assert (b.fp8_recipe, b.fp8_param_gather) == ("blockwise", None)  # the nearest, said CLOSE


def test_gradients_reduced_in_bf16_are_each_targets_switch(gpt175b, tmp_path, monkeypatch):
    """``grad_dtype='bf16'``: Megatron-LM's --grad-reduce-in-bf16, Bridge's
    grad_reduce_in_fp32 false, DeepSpeed's communication_data_type bf16 (read by their own
    parsers); torchtitan 0.3.0 reduces in float32 only, said CLOSE. The default is fp32
    everywhere (Megatron's under --bf16: no flag)."""
    bf16 = dataclasses.replace(gpt175b, train=dataclasses.replace(gpt175b.train,
                                                                  grad_dtype="bf16"))
    assert _megatron_args(bf16, tmp_path / "bf16").grad_reduce_in_bf16
    assert not _megatron_args(gpt175b, tmp_path / "fp32").grad_reduce_in_bf16
    mixed = _overrides(bf16)["mixed_precision"]
    assert "bf16:true" in mixed and "grad_reduce_in_fp32:false" in mixed
    _, ds = _deepspeed_config(bf16, monkeypatch)
    assert ds.communication_data_type == torch.bfloat16
    rows = {t: {r.field: r for r in export_target(bf16, t).rows} for t in TARGETS}
    assert rows["torchtitan"]["train.grad_dtype"].fit is Fit.CLOSE
    assert all(rows[t]["train.grad_dtype"].fit is Fit.EXACT
               for t in ("megatron", "bridge", "deepspeed"))
    assert "grads:bf16" in bf16.summary() and "grads:" not in gpt175b.summary()


def test_bridge_and_torchtitan_carry_fp8_and_deepspeed_refuses_it(llama_fp8):
    fp8 = _overrides(llama_fp8)["mixed_precision"]  # every layer, where Bridge's keeps 2 bf16
    assert "fp8:hybrid,fp8_recipe:tensorwise" in fp8 and "first_last_layers_bf16:false" in fp8
    text = export_target(llama_fp8, "torchtitan").files["autopar_plan.py"]
    assert 'converters=[Float8LinearConverter.Config(recipe_name="rowwise"' in text
    with pytest.raises(AutoparError, match="no FP8 switch"):
        export_target(llama_fp8, "deepspeed")


# ----- a transformers model's rotary embedding -----

LLAMA31_T5 = {  # transformers 5 writes the rotary base and scaling into rope_parameters
    "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
    "max_position_embeddings": 131072,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}}


@pytest.mark.parametrize("config", [
    LLAMA31_T5,
    # transformers 4: rope_theta at the top, the scaling in rope_scaling
    {**{k: v for k, v in LLAMA31_T5.items() if k != "rope_parameters"}, "rope_theta": 500000.0,
     "rope_scaling": {k: v for k, v in LLAMA31_T5["rope_parameters"].items()
                      if k != "rope_theta"}},
], ids=["transformers5", "transformers4"])
def test_megatron_carries_a_transformers_llamas_rotary_base_and_scaling(config):
    from autopar.core.model_spec import ModelSpec
    from autopar.exports.megatron import _shape_items, flags
    from autopar.models.shape import model_shape

    shape = model_shape(ModelSpec("", transformers={"architecture": "LlamaForCausalLM",
                                                    "config": config}))
    assert shape.rope_theta == 500000.0
    family = next(i for i in _shape_items(shape, 1) if i.field == "model.family")
    words = flags(family.settings)
    assert words[words.index("--rotary-base") + 1] == "500000"
    assert float(words[words.index("--rope-scaling-factor") + 1]) == 8.0
    assert "--use-rope-scaling" in words and family.fit is Fit.EXACT
    # a scaling Megatron's switches cannot express is said so, not written as Llama 3's
    yarn = {**config, "rope_parameters": {"rope_type": "yarn", "rope_theta": 500000.0,
                                          "factor": 4.0}}
    yarn.pop("rope_scaling", None)
    shape = model_shape(ModelSpec("", transformers={"architecture": "LlamaForCausalLM",
                                                    "config": yarn}))
    family = next(i for i in _shape_items(shape, 1) if i.field == "model.family")
    assert family.fit is Fit.CLOSE and "yarn" in family.note
    assert "--use-rope-scaling" not in flags(family.settings)


def test_bridge_sets_the_experts_and_the_gated_activation(mixtral_ep8, gpt175b):
    """Mixtral on a recipe of another MoE: the experts' count under its TransformerConfig name
    and their width, which the recipe's would replace silently; SiLU for the gated MLP."""
    o = _overrides(mixtral_ep8)
    assert (o["model.num_moe_experts"], o["model.moe_ffn_hidden_size"]) == ("8", "14336")
    assert "model.num_experts" not in o
    assert o["model.activation_func"] == "silu" and o["model.gated_linear_unit"] == "true"
    assert _overrides(gpt175b)["model.activation_func"] == "gelu"  # a recipe's would stay


def test_bridge_overrides_every_recipe_default_the_plan_decides(llama_uneven_blocks,
                                                                mixtral_ep8):
    """A recipe's own virtual pipeline, distributed optimizer and TP communication overlap
    would survive overrides that only set what the plan turns on: a ZeRO-0 plan without
    pipelining, sequence parallelism or recomputation says each off."""
    zero0 = _plan("llama3-8b", H100, 1, TrainSpec(global_batch=16, seq_len=4096),
                  dp=8, zero=0, micro_batch=1, checkpoint="none")
    o = _overrides(zero0)
    assert o["model.virtual_pipeline_model_parallel_size"] == "null"
    assert (o["ddp.use_distributed_optimizer"], o["ddp.use_megatron_fsdp"]) == ("false", "false")
    assert (o["model.tp_comm_overlap"], o["model.sequence_parallel"]) == ("false", "false")
    assert o["model.recompute_granularity"] == "null"
    for key in o:
        section, _, name = key.rpartition(".")
        assert name in BRIDGE["sections"][section], key
    assert _overrides(mixtral_ep8)["ddp.use_distributed_optimizer"] == "true"


# ----- a transformers model's architecture, field by field -----

TINY_HF = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-6}


def _hf_family(architecture: str, config: dict, allow: bool = False):
    from autopar.core.model_spec import ModelSpec
    from autopar.exports.megatron import _shape_items
    from autopar.models.shape import model_shape

    shape = model_shape(ModelSpec("", transformers={"architecture": architecture,
                                                    "config": config}))
    return next(i for i in _shape_items(shape, 1, allow) if i.field == "model.family")


def test_qwen_attention_is_carried_and_other_architectures_are_refused():
    from autopar.exports.megatron import flags

    qwen2 = flags(_hf_family("Qwen2ForCausalLM", TINY_HF).settings)
    assert "--add-qkv-bias" in qwen2 and "--qk-layernorm" not in qwen2
    qwen3 = _hf_family("Qwen3ForCausalLM", TINY_HF)
    assert "--qk-layernorm" in flags(qwen3.settings) and qwen3.fit is Fit.EXACT
    assert "--add-qkv-bias" not in flags(qwen3.settings)
    eps = flags(qwen3.settings)
    assert float(eps[eps.index("--norm-epsilon") + 1]) == 1e-6
    # GPT-NeoX is not a Llama block: refused, or written anyway with what is not carried
    neox = {**TINY_HF, "hidden_act": "gelu"}
    with pytest.raises(AutoparError, match="GPTNeoXForCausalLM"):
        _hf_family("GPTNeoXForCausalLM", neox)
    item = _hf_family("GPTNeoXForCausalLM", neox, allow=True)
    assert item.fit is Fit.NONE and "not carried" in item.note
    # a Llama-style architecture with another activation or a sliding window is refused too
    with pytest.raises(AutoparError, match="activation gelu"):
        _hf_family("LlamaForCausalLM", {**TINY_HF, "hidden_act": "gelu"})
    with pytest.raises(AutoparError, match="sliding-window"):
        _hf_family("MistralForCausalLM", {**TINY_HF, "sliding_window": 4096})


def test_bridge_names_the_architecture_fields_as_its_provider_does():
    """Qwen3's q/k norm and epsilon and Llama 3.1's rotary scaling as Bridge overrides: each a
    field of its model section (``GPTModelProvider``/``TransformerConfig`` names)."""
    from autopar.exports.bridge import overrides_of

    qwen3 = overrides_of(_hf_family("Qwen3ForCausalLM", TINY_HF).settings)
    llama31 = overrides_of(_hf_family("LlamaForCausalLM", LLAMA31_T5).settings)
    assert "model.qk_layernorm=true" in qwen3 and "model.layernorm_epsilon=1e-06" in qwen3
    assert "model.rope_scaling=true" in llama31 and "model.rope_scaling_factor=8" in llama31
    for key in (o.split("=", 1)[0] for o in qwen3 + llama31):
        section, _, name = key.rpartition(".")
        assert name in BRIDGE["sections"][section], key


def test_torchtitan_030_builds_its_configs_from_each_export(gpt175b, llama_zero3_offload,
                                                             llama_uneven_blocks, mixtral_ep8):
    """torchtitan 0.3.0's own ``TrainingConfig`` and ``ParallelismConfig`` (keyword-only
    dataclasses: an unknown field is a TypeError, as the issue's first symptom was) take every
    export's fields, and hold the plan's batch: its trainer's accumulation and pipeline
    micro-batches (``trainer.py``) are the plan's."""
    configs = torchtitan_configs()
    for plan in (gpt175b, llama_zero3_offload, llama_uneven_blocks, mixtral_ep8):
        saved, _ = _titan(plan)  # (an fp16 plan is refused: torchtitan has no loss scaling)
        training = configs.TrainingConfig(**saved["training"])
        par = configs.ParallelismConfig(**saved["parallelism"])
        c, m = plan.config, plan.estimate.num_microbatches
        dp = par.data_parallel_replicate_degree * max(1, par.data_parallel_shard_degree)
        assert dp == c.dp and training.seq_len == plan.train.seq_len
        accumulation = training.global_batch_size // (training.local_batch_size * dp)
        assert training.global_batch_size == plan.train.global_batch
        if c.pp > 1:
            assert accumulation == 1 and training.disable_cuda_graphs
            assert training.local_batch_size // par.pipeline_parallel_microbatch_size == m
        else:
            assert accumulation == m


def test_torchtitan_compiles_float8_and_async_tp_as_its_0_3_0_config_takes_it():
    """An fp8 plan with async TP: ``compile`` on (torchtitan's float8 is built for
    torch.compile; autopar measured eager float8 slower than bf16) with
    ``enable_async_tensor_parallel``, a ``CompileConfig`` field in torchtitan 0.3.0 whose own
    check (async TP needs the model compiled) passes; the float8 converter told so; a bf16
    plan without async TP compiles nothing."""
    configs = torchtitan_configs()
    fp8 = _plan("llama3-8b", H100, 1, TrainSpec(global_batch=64, seq_len=4096, precision="fp8"),
                dp=4, tp=2, zero=3, micro_batch=1, sequence_parallel=True, fusions=("async_tp",))
    saved, tree = _titan(fp8)
    compiled = configs.CompileConfig(**saved["compile"])
    assert compiled.enable and compiled.enable_async_tensor_parallel
    assert "model" in compiled.components
    assert "compile" in _call_keywords(tree, "Trainer.Config")
    assert _call_keywords(tree, "Float8LinearConverter.Config")["model_compile_enabled"] == "True"
    bf16 = _plan("llama3-8b", H100, 1, TrainSpec(global_batch=64, seq_len=4096),
                 dp=8, zero=3, micro_batch=1)
    saved, tree = _titan(bf16)
    assert "compile" not in saved and "compile" not in _call_keywords(tree, "Trainer.Config")
