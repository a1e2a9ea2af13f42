"""The Megatron-LM export held by Megatron-LM's own code: each plan kind's ``megatron_args.sh``,
sourced as its README says, parsed and validated by ``megatron.training.arguments``
(``parse_args`` + ``validate_args``) of megatron-core 0.19.2 -- the release users install --
on the plan's world size; what Megatron derives reads back equal to the plan. A plan Megatron
cannot run as planned is refused by ``autopar export`` before it writes anything.

Megatron's code is fetched by ``scripts/fetch_frameworks.py`` (``scripts/install.sh test``
runs it); the test is skipped, saying so, where it has not been. The stand-ins its driver
uses (``megatron_validate_run.py``) are named there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import autopar
from autopar import AutoparError, TrainSpec
from autopar.exports import export_formats
from autopar.exports.mapping import Fit
from autopar.exports.megatron import flag_of, megatron_items
import export_checks as checks
from export_checks import A100, H100, megatron_dir, plan as _plan

CAPABILITY = {H100: (9, 0), A100: (8, 0)}
"""The compute capability of each cluster's GPU (NVIDIA's CUDA GPUs list: H100 9.0, A100
8.0), which the driver's stand-in CUDA device reports to Megatron."""


PLANS = checks.ISSUE_KINDS
"""Issue 33's plan kinds, as every target's run test takes them."""

REFUSED = checks.refused_for("megatron")
"""Plan kinds the export refuses, and a word of the reason it gives."""


@pytest.fixture(scope="module")
def validated(tmp_path_factory) -> dict[str, tuple[object, dict]]:
    """Per plan kind: (the plan, Megatron's verdict: its derived arguments, or why it refused
    them), or (the plan, {"export refused": reason})."""
    megatron = megatron_dir()  # skips, saying so, where it is not fetched
    tmp = tmp_path_factory.mktemp("megatron")
    plans, cases, out = {}, [], {}
    for name, (model, cluster, nodes, train, config) in PLANS.items():
        plan = _plan(model, cluster, nodes, TrainSpec(**train), **config)
        plans[name] = plan
        try:
            folder = export_formats(plan, tmp / name, "megatron")["megatron"]
        except AutoparError as err:
            out[name] = (plan, {"export refused": str(err)})
            continue
        cases.append({"name": name, "script": str(folder / "megatron_args.sh"),
                      "world_size": plan.config.world_size,
                      "capability": CAPABILITY[cluster],
                      "read": sorted({flag_of(n) for n, _ in exact_settings(plan)})})
    (tmp / "cases.json").write_text(json.dumps(cases))
    done = subprocess.run([sys.executable, str(Path(__file__).with_name(
        "megatron_validate_run.py")), str(megatron), str(tmp / "cases.json")],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            result = json.loads(line)
            out[result["name"]] = (plans[result["name"]], result)
    return out


def exact_settings(plan) -> list[tuple[str, object]]:
    """The Megatron arguments the export's rows marked exact set, with their values
    (``megatron_items``: each row's settings, as ``flags`` writes them)."""
    return [(name, value) for item in megatron_items(plan) if item.fit is Fit.EXACT
            for name, value in item.settings if value is not None]


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_parses_every_exact_row_as_written(name: str, validated) -> None:
    """Every setting of every row the export's README calls exact is, after Megatron's
    ``parse_args`` and ``validate_args``, the value the export wrote."""
    plan, verdict = validated[name]
    if "export refused" in verdict:
        return
    derived = verdict["flags"]
    wrong = {}
    for name, value in exact_settings(plan):
        flag = flag_of(name)
        if _as_parsed(name, value) != derived[flag]:
            wrong[flag] = (value, derived[flag])
    assert not wrong, f"written -> derived: {wrong}"


def _as_parsed(name: str, value: object) -> object:
    """A setting as Megatron's parser stores it (and the driver writes it back,
    ``megatron_validate_run._plain``): a layer pattern's expression as its list (Megatron's
    ``moe_freq_type`` evaluates it)."""
    if name == "moe_layer_freq" and isinstance(value, str):
        return eval(value, {"__builtins__": {}})  # noqa: S307 - the export's own pattern
    if isinstance(value, tuple):
        return list(value)
    return value


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_accepts_the_export_and_derives_the_plan(name: str, validated) -> None:
    plan, verdict = validated[name]
    if "export refused" in verdict:  # refused by autopar with the reason, before writing
        assert name in REFUSED and REFUSED[name] in verdict["export refused"]
        return
    assert name not in REFUSED, "the export wrote what it should refuse"
    assert "refused" not in verdict, verdict.get("refused")
    a, c, t = verdict["args"], plan.config, plan.train
    assert (a["world_size"], a["data_parallel_size"]) == (c.world_size, c.dp)
    assert (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"],
            a["context_parallel_size"], a["expert_model_parallel_size"]) == \
        (c.tp, c.pp, c.cp, c.ep)
    assert (a["micro_batch_size"], a["global_batch_size"], a["seq_length"]) == \
        (c.micro_batch, t.global_batch, t.seq_len)
    interleaved = c.schedule.value == "interleaved" and c.virtual_stages > 1
    assert a["virtual_pipeline_model_parallel_size"] == (c.virtual_stages if interleaved
                                                        else None)
    assert bool(a["sequence_parallel"]) == c.sequence_parallel
    layers = verdict["layers_per_rank"]
    model = autopar.models.build(plan.model).config
    per_rank = list(plan.stage_blocks)  # the first stage runs DeepSeek's dense layers first
    per_rank[0] += getattr(model, "first_k_dense", 0)
    if len(set(per_rank)) > 1 or layers is not None:  # a layout: Megatron's split
        assert layers == per_rank
    else:  # Megatron's even split
        assert a["num_layers"] % c.pp == 0 and [a["num_layers"] // c.pp] * c.pp == per_rank
    if c.zero >= 2:
        assert a["use_megatron_fsdp"] and a["ckpt_format"] == "fsdp_dtensor"
        assert a["data_parallel_sharding_strategy"] == ("optim_grads" if c.zero == 2
                                                        else "optim_grads_params")
    else:
        assert not a["use_megatron_fsdp"]
        assert bool(a["use_distributed_optimizer"]) == (c.zero == 1)
    assert (a["num_layers"], a["hidden_size"], a["num_attention_heads"]) == \
        (model.num_layers, model.hidden_size, model.num_heads)
    if getattr(model, "num_experts", 0):  # the experts' shape as the plan priced it
        width = getattr(model, "moe_ffn_hidden_size", 0) or model.ffn_hidden_size
        assert (a["num_experts"], a["moe_router_topk"], a["moe_ffn_hidden_size"]) == \
            (model.num_experts, model.top_k, width)
        assert a["expert_tensor_parallel_size"] == c.etp
    if getattr(model, "num_shared_experts", 0):
        assert a["moe_shared_expert_intermediate_size"] == \
            model.num_shared_experts * model.moe_ffn_hidden_size
    if str(getattr(model, "attention", "")) == "mla":  # DeepSeek's latent attention
        assert a["multi_latent_attention"] and a["rope_type"] == "rope"
        assert (a["q_lora_rank"], a["kv_lora_rank"], a["qk_head_dim"],
                a["qk_pos_emb_head_dim"], a["v_head_dim"]) == \
            (model.q_lora_rank, model.kv_lora_rank, model.qk_nope_head_dim,
             model.qk_rope_head_dim, model.v_head_dim)
    precision = t.precision.value
    assert bool(a["fp16"]) == (precision == "fp16")
    assert bool(a["bf16"]) == (precision in ("bf16", "fp8"))
    assert bool(a["fp8"]) == (precision == "fp8")
    if precision in ("bf16", "fp16", "fp8") and c.zero < 2:  # reduced in fp32, as autopar's
        assert a["accumulate_allreduce_grads_in_fp32"]
    policy = c.checkpoint if isinstance(c.checkpoint, str) else None
    if policy == "full":
        assert a["recompute_granularity"] == "full"
    elif policy == "none":
        assert a["recompute_granularity"] is None
    elif policy in ("selective", "moe"):
        assert a["recompute_granularity"] == "selective"
        assert a["recompute_modules"] == (["core_attn"] if policy == "selective" else ["moe"])
