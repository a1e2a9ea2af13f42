"""The Megatron-Bridge export run by Megatron-Bridge 0.6.2's own code (on megatron-core 0.19.2),
reading back what it derives.

For each plan kind the exported ``overrides.txt`` goes onto the recipe the export names
(``autopar.exports.bridge.recipe_for``, the README's ``--recipe``) as Bridge's
``scripts/training/run_recipe.py`` puts it there: the recipe function from
``megatron.bridge.recipes``, ``process_config_with_overrides`` (Hydra's override parser, then
Bridge's ``_apply_overrides`` onto the ``ConfigContainer``), then ``pretrain``'s first step,
``runtime_config_update`` (mixed precision and communication overlap resolved into the model,
the data-parallel size from the plan's ``WORLD_SIZE``, ``ConfigContainer.validate``: each
section's ``finalize`` and Megatron-Core's checks), and ``initialize``'s micro-batch calculator
(``bridge_recipe_run.py``, in a process of its own: Bridge pins a transformers older than this
environment's). What Bridge derived must be the plan's: the data-parallel size, the degrees,
micro-batches, virtual pipeline, each pipeline rank's chunks and their layers, ZeRO as the
distributed optimizer or Megatron-FSDP, offload, which layers are recomputed and how, the
parameter, pipeline and gradient-reduction dtypes and loss scaling, FP8, TP overlap, and the
model's shape (heads and their width, norms, activation, experts and their width, latent
attention) -- nothing of the recipe's where the plan decided otherwise.

Bridge's code, megatron-core and Bridge's dependencies are fetched by
``scripts/fetch_frameworks.py`` (``scripts/install.sh test`` runs it); the test is skipped,
saying so, where they are not. The recipes read their models' Hugging Face configs, shipped in
``tests/data/megatron_bridge_hf_configs.json`` and laid out here as an offline hub cache. What
this machine cannot answer as the plan's cluster would is stood in for in the driver, each named
in its docstring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import yaml

import export_checks as checks
from autopar import AutoparError, TrainSpec
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ASYNC_TP, Checkpoint
from autopar.core.stages import stage_chunks
from autopar.exports import export_formats, export_target
from autopar.exports.mapping import Fit
from autopar.exports.bridge import OVERRIDES, recipe_for
from autopar.models.shape import model_shape

DATA = Path(__file__).resolve().parents[2] / "data"

CASES = {
    # gpt175b (tp 8, pp 8 interleaved v 3) on the GPT-3 recipe, whose vp 6, TP overlap and
    # fp16-reduced gradients must not survive; mixtral_ep8 on Qwen3-30B-A3B's recipe (Bridge
    # 0.6.2 has no Mixtral's), reshaped: experts, their width, no q/k norm
    **checks.FIXTURES,
    # fp16: autopar's loss scaling and fp32 gradient reduction, not fp16_mixed's
    "llama_interleaved_fp16": lambda: checks.llama_interleaved("fp16"),
    # latent attention, shared expert, 3 dense layers, uneven stages: the recipe's layout and
    # multi-token prediction must not survive; the gradients reduced in bf16
    "deepseek_v3_pp4_ep8": lambda: checks.plan(
        "deepseek-v3", checks.H100, 4, TrainSpec(global_batch=32, seq_len=4096,
                                                 grad_dtype="bf16"),
        dp=8, pp=4, ep=8, zero=1, micro_batch=1),
    # async TP: Bridge's TP communication overlap on, by the CommOverlapConfig written
    "gpt_7.5b_tp4_async_tp": lambda: checks.plan(
        "gpt-7.5b", checks.A100, 1, TrainSpec(global_batch=16, seq_len=2048),
        dp=2, tp=4, sequence_parallel=True, zero=1, micro_batch=1, fusions=("async_tp",)),
    # issue 33's plan kinds (export_checks.ISSUE_KINDS), each run or refused; among them the
    # experts folded over tp (Qwen3's heads 128 wide over hidden 2048 / 32 heads), tp 2 on the
    # 70B recipe (whose TP overlap and vp 5 must not survive), ZeRO-0 (the recipe's distributed
    # optimizer must go) over uneven stages of a GPT
    **{kind: partial(checks.issue_plan, kind) for kind in checks.ISSUE_KINDS},
}

REFUSED = checks.refused_for("bridge")
"""The cases ``autopar export`` refuses for Bridge, and a word of the reason it gives."""


def _hub(root: Path) -> Path:
    """The shipped configs as a Hugging Face hub cache: ``models--ORG--NAME/snapshots/REV``
    for each revision a recipe asks for, ``refs/main`` naming a snapshot for 'main'."""
    models = json.loads((DATA / "megatron_bridge_hf_configs.json").read_text())["models"]
    for repo, entry in models.items():
        folder = root / f"models--{repo.replace('/', '--')}"
        for revision in entry["revisions"]:
            commit = "0" * 40 if revision == "main" else revision  # a local stand-in commit
            if revision == "main":
                (folder / "refs").mkdir(parents=True, exist_ok=True)
                (folder / "refs" / "main").write_text(commit)
            snapshot = folder / "snapshots" / commit
            snapshot.mkdir(parents=True, exist_ok=True)
            (snapshot / "config.json").write_text(json.dumps(entry["config"]))
    return root


def _bridge_verdicts(tmp: Path) -> dict[str, tuple[object, str, dict]]:
    """Per plan kind: (the plan, its README, Bridge's verdict: what it derived, or why it
    refused), from one Bridge process for every case (its import is most of the time)."""
    dirs = checks.bridge_dirs()  # skips, saying so, where Bridge is not fetched
    plans, cases = {}, []
    for name, make in CASES.items():
        plan = make()
        if name in REFUSED:  # refused by autopar with the reason, before anything is written
            with pytest.raises(AutoparError, match=REFUSED[name]):
                export_formats(plan, tmp / name, "bridge")
            continue
        folder = export_formats(plan, tmp / name, "bridge")["bridge"]
        plans[name] = (plan, (folder / "README.md").read_text())
        cases.append({"name": name, "recipe": recipe_for(plan)[0],
                      "overrides": (folder / OVERRIDES).read_text().split(),
                      "world_size": plan.config.world_size})
    (tmp / "cases.json").write_text(json.dumps(cases))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CUDA_DEVICE_MAX_CONNECTIONS", "WORLD_SIZE", "RANK")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp / "hf"),
               HF_HUB_CACHE=str(_hub(tmp / "hf" / "hub")))
    done = subprocess.run([sys.executable, str(Path(__file__).with_name(
        "bridge_recipe_run.py")), str(tmp / "cases.json"), *map(str, dirs)],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            out[result["name"]] = (*plans[result["name"]], result)
    assert set(out) == set(CASES) - set(REFUSED)
    return out


FIELD_BY_FIELD = {"mixed_precision"}
"""Overrides naming a config object (Bridge's mixed-precision recipe, or its fields as a
``_target_`` mapping) rather than a value: what the object sets is read back field by field
in ``_check`` (params and pipeline dtypes, fp16/bf16/fp8, the gradients' reduction dtype, loss
scaling)."""


def _check_exact_rows(plan, overridden: dict[str, object]) -> None:
    """Every override of every row the export's README calls exact holds, after Bridge applied
    the overrides and its runtime update, the value written (parsed as OmegaConf parses an
    override's value)."""
    wrong = {}
    for row in export_target(plan, "bridge").rows:
        if row.fit is not Fit.EXACT:
            continue
        for override in row.target.split():
            key, _, text = override.partition("=")
            if key in FIELD_BY_FIELD:
                continue
            written = yaml.safe_load(text)
            if isinstance(written, str):  # OmegaConf reads 1e-05 as a float, YAML 1.1 not
                try:
                    written = float(text)
                except ValueError:
                    pass
            if overridden[key] != written:
                wrong[key] = (text, overridden[key])
    assert not wrong, f"written -> derived: {wrong}"


def _policies(plan, dense: int) -> list[Checkpoint]:
    """The plan's checkpoint policy of every layer: its blocks', and before them its ``dense``
    leading layers' (DeepSeek's), which a single policy covers too."""
    c = plan.config
    if isinstance(c.checkpoint, tuple):
        assert dense == 0  # no case plans per-block policies for a model with dense layers
        return list(c.checkpoint)
    return [Checkpoint(c.checkpoint)] * (dense + sum(plan.stage_blocks))


def _recomputed_whole(d: dict, chunks: list[int]) -> list[bool]:
    """Which layers Megatron recomputes whole under the derived recompute fields: every layer
    (``uniform``, 1 layer a group), or the first N of each chunk (``block``)."""
    if d["model.recompute_granularity"] != "full":
        return [False] * sum(chunks)
    method, n = d["model.recompute_method"], d["model.recompute_num_layers"]
    if method == "uniform":
        assert n == 1  # each layer its own recompute group: what autopar's full policy runs
        return [True] * sum(chunks)
    assert method == "block"
    return [i < n for size in chunks for i in range(size)]


DTYPE = {"bf16": "torch.bfloat16", "fp8": "torch.bfloat16", "fp16": "torch.float16",
         "fp32": "torch.float32"}


def test_bridge_062_takes_each_export_and_derives_the_plan(tmp_path: Path) -> None:
    """One test over every case (one Bridge process, on one worker); each case's mismatches
    are reported by name."""
    failures = {}
    for name, (plan, readme, verdict) in _bridge_verdicts(tmp_path).items():
        try:
            _check(plan, readme, verdict)
        except AssertionError as err:
            failures[name] = str(err)
    assert not failures, "\n\n".join(f"{name}: {err}" for name, err in failures.items())


def _check(plan, readme: str, verdict: dict) -> None:
    """What Bridge derived against the plan, field by field."""
    assert "refused" not in verdict, verdict.get("refused")
    _check_exact_rows(plan, verdict["overridden"])
    d, c, t = verdict["derived"], plan.config, plan.train
    s = model_shape(plan.model_spec or ModelSpec.zoo(plan.model))
    recipe, _ = recipe_for(plan)
    assert f"--recipe {recipe}" in readme

    # the world and the batch
    assert d["data_parallel_size"] == c.dp == c.world_size // (c.tp * c.pp * c.cp)
    assert (d["model.tensor_model_parallel_size"], d["model.pipeline_model_parallel_size"],
            d["model.context_parallel_size"], d["model.expert_model_parallel_size"],
            d["model.expert_tensor_parallel_size"]) == (c.tp, c.pp, c.cp, c.ep, c.etp)
    assert d["model.sequence_parallel"] == c.sequence_parallel
    assert (d["train.micro_batch_size"], d["train.global_batch_size"]) == \
        (c.micro_batch, t.global_batch)
    assert d["num_microbatches"] == plan.estimate.num_microbatches
    assert d["model.seq_length"] == d["dataset.seq_length"] == t.seq_len

    # the pipeline: each rank's chunks and their layers, in the plan's layer order
    interleaved = c.schedule.value == "interleaved" and c.virtual_stages > 1
    v = c.virtual_stages if interleaved else 1
    assert d["model.virtual_pipeline_model_parallel_size"] == (v if interleaved else None)
    chunks = stage_chunks(plan.stage_blocks, c.virtual_stages)
    chunks[0] += s.first_k_dense  # DeepSeek's dense layers: the first stage runs them first
    assert d["layers"] == [[chunks[k * c.pp + r] for k in range(v)] for r in range(c.pp)]

    # ZeRO and offload
    if c.zero >= 2:
        assert d["ddp.use_megatron_fsdp"] and d["dist.use_megatron_fsdp"]
        assert d["ddp.data_parallel_sharding_strategy"] == ("optim_grads" if c.zero == 2
                                                            else "optim_grads_params")
        assert d["checkpoint.ckpt_format"] == "fsdp_dtensor"
        # Megatron-FSDP refuses 1: the README unsets it, and Bridge ran without it
        assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in readme
        assert d["CUDA_DEVICE_MAX_CONNECTIONS"] is None
    else:
        assert not d["ddp.use_megatron_fsdp"]
        assert d["ddp.data_parallel_sharding_strategy"] == "no_shard"
        assert d["ddp.use_distributed_optimizer"] == (c.zero == 1)
        assert d["optimizer.use_distributed_optimizer"] == (c.zero == 1)
    assert d["optimizer.optimizer_cpu_offload"] == c.offload
    assert d["optimizer.use_precision_aware_optimizer"] == c.offload
    if c.offload:
        assert d["optimizer.optimizer_offload_fraction"] == 1.0

    # recomputation: the layers recomputed whole, and the modules of a selective policy
    policies = _policies(plan, s.first_k_dense)
    assert _recomputed_whole(d, chunks) == [p is Checkpoint.FULL for p in policies]
    kinds = set(policies)
    if kinds in ({Checkpoint.SELECTIVE}, {Checkpoint.MOE}):
        assert d["model.recompute_granularity"] == "selective"
        assert d["model.recompute_modules"] == (["core_attn"] if Checkpoint.SELECTIVE in kinds
                                                else ["moe"])
    elif kinds == {Checkpoint.NONE}:
        assert d["model.recompute_granularity"] is None

    # precision
    precision = t.precision.value
    assert d["model.params_dtype"] == d["model.pipeline_dtype"] == DTYPE[precision]
    assert (d["model.fp16"], d["model.bf16"]) == (precision == "fp16",
                                                   precision in ("bf16", "fp8"))
    # the gradients accumulated and reduced as the plan's (fp32 by default), the optimizer's
    # shard in fp32 either way
    assert d["ddp.grad_reduce_in_fp32"] == (t.grad_dtype.value == "fp32")
    assert d["optimizer.main_grads_dtype"] == d["optimizer.main_params_dtype"] == \
        d["optimizer.exp_avg_dtype"] == d["optimizer.exp_avg_sq_dtype"] == "torch.float32"
    if precision == "fp16":  # autopar's loss scaling (models/training.py LOSS_SCALING)
        assert (d["optimizer.initial_loss_scale"], d["optimizer.loss_scale_window"],
                d["optimizer.hysteresis"]) == (2**16, 2000, 1)
    if precision == "fp8":
        tensorwise = t.fp8_recipe.value == "tensorwise"
        assert d["model.fp8"] == "hybrid"
        assert d["model.fp8_recipe"] == ("tensorwise" if tensorwise else "blockwise")
        assert d["model.fp8_param"] == (tensorwise and c.zero >= 1)
        assert d["model.first_last_layers_bf16"] is False  # every layer, as planned
    else:
        assert d["model.fp8"] is None
    assert d["model.tp_comm_overlap"] == (ASYNC_TP in c.fusions)
    assert bool(d["comm_overlap.tp_comm_overlap"]) == (ASYNC_TP in c.fusions)

    # the model's shape
    assert (d["model.num_layers"], d["model.hidden_size"], d["model.ffn_hidden_size"],
            d["model.num_attention_heads"]) == \
        (s.num_layers, s.hidden_size, s.ffn_hidden_size, s.num_heads)
    assert d["model.share_embeddings_and_output_weights"] == s.tied
    assert d["model.gated_linear_unit"] == s.gated
    assert d["model.activation_func"] == ("silu" if s.gated else "gelu")
    assert d["model.layernorm_zero_centered_gamma"] is False
    if s.gated:
        assert (d["model.normalization"], d["model.position_embedding_type"],
                d["model.add_bias_linear"]) == ("RMSNorm", "rope", False)
        assert d["model.rotary_base"] == int(s.rope_theta)
    else:
        assert (d["model.normalization"], d["model.position_embedding_type"],
                d["model.add_bias_linear"]) == ("LayerNorm", "learned_absolute", True)
    if s.norm_eps:
        assert d["model.layernorm_epsilon"] == s.norm_eps
    if s.mla:
        mla = dict(s.mla)
        assert d["model.multi_latent_attention"]
        assert (d["model.q_lora_rank"], d["model.kv_lora_rank"], d["model.qk_head_dim"],
                d["model.qk_pos_emb_head_dim"], d["model.v_head_dim"]) == \
            (mla["q_lora_rank"], mla["kv_lora_rank"], mla["qk_nope_head_dim"],
             mla["qk_rope_head_dim"], mla["v_head_dim"])
    else:
        assert d["model.num_query_groups"] == s.num_kv_heads
        assert d["model.kv_channels"] == (s.head_size or s.hidden_size // s.num_heads)
        assert (d["model.qk_layernorm"], d["model.add_qkv_bias"]) == (s.qk_norm, s.qkv_bias)
    assert d["model.mtp_num_layers"] is None
    if s.num_experts:
        assert (d["model.num_moe_experts"], d["model.moe_router_topk"]) == \
            (s.num_experts, s.top_k)
        assert d["model.moe_ffn_hidden_size"] == (s.moe_ffn_hidden_size or s.ffn_hidden_size)
        assert d["model.moe_shared_expert_intermediate_size"] == (s.shared_expert_size or None)
        assert d["model.moe_expert_capacity_factor"] == s.capacity_factor
        freq = d["model.moe_layer_freq"]
        assert (freq if isinstance(freq, list) else [1] * s.num_layers) == \
            [0] * s.first_k_dense + [1] * (s.num_layers - s.first_k_dense)
    else:
        assert d["model.num_moe_experts"] is None
