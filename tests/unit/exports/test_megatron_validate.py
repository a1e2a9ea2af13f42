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
from export_checks import megatron_dir, plan as _plan

H100, A100 = "hgx-h100-80g", "dgx-a100-80g"
CAPABILITY = {H100: (9, 0), A100: (8, 0)}
"""The compute capability of each cluster's GPU (NVIDIA's CUDA GPUs list: H100 9.0, A100
8.0), which the driver's stand-in CUDA device reports to Megatron."""


PLANS = {
    # the eight kinds
    "llama3-8b-tp2-pp2-selective": ("llama3-8b", H100, 1, dict(global_batch=64, seq_len=4096),
                                    dict(dp=2, tp=2, pp=2, micro_batch=1, zero=1,
                                         sequence_parallel=True, checkpoint="selective")),
    "llama3-70b-cp2-zero3-offload": ("llama3-70b", H100, 4, dict(global_batch=64, seq_len=8192),
                                     dict(dp=16, cp=2, zero=3, micro_batch=1, offload=True,
                                          checkpoint="full")),
    "mixtral-ep8-zero3": ("mixtral-8x7b", H100, 2, dict(global_batch=64, seq_len=4096),
                          dict(dp=16, ep=8, zero=3, micro_batch=1, checkpoint="full")),
    "gpt-175b-tp4-pp8-interleaved": ("gpt-175b", A100, 16, dict(global_batch=256,
                                                                seq_len=2048),
                                     dict(dp=4, tp=4, pp=8, micro_batch=1, zero=1,
                                          schedule="interleaved", virtual_stages=3,
                                          sequence_parallel=True, checkpoint="full")),
    "llama3-8b-cp2-tp2-zero3": ("llama3-8b", H100, 1, dict(global_batch=16, seq_len=8192),
                                dict(dp=2, cp=2, tp=2, zero=3, micro_batch=1,
                                     sequence_parallel=True, checkpoint="selective")),
    "gpt-18b-fp16-pp2": ("gpt-18b", A100, 1, dict(global_batch=32, seq_len=2048,
                                                    precision="fp16"),
                         dict(dp=4, pp=2, micro_batch=1, zero=1, checkpoint="full")),
    "llama3-70b-tp2-zero3-offload": ("llama3-70b", H100, 2, dict(global_batch=32, seq_len=4096),
                                     dict(dp=8, tp=2, zero=3, micro_batch=1, offload=True,
                                          sequence_parallel=True, checkpoint="full")),
    "gpt-7.5b-zero0-uneven-pp8": ("gpt-7.5b", A100, 1, dict(global_batch=32, seq_len=2048),
                                  dict(dp=1, pp=8, micro_batch=1, zero=0,
                                       checkpoint="none")),
    # the wave's MoE and FP8 plans
    "qwen3-30b-fold-tp2-ep8": ("qwen3-30b-a3b", H100, 2, dict(global_batch=32, seq_len=4096),
                               dict(dp=8, tp=2, ep=8, zero=1, micro_batch=1,
                                    sequence_parallel=True, checkpoint="moe")),
    "llama3-8b-fp8-tp2": ("llama3-8b", H100, 1, dict(global_batch=32, seq_len=4096,
                                                     precision="fp8"),
                          dict(dp=4, tp=2, zero=1, micro_batch=1, sequence_parallel=True)),
    # DeepSeek-V3's latent attention, shared expert and dense first layers
    "deepseek-v3-pp4-ep8": ("deepseek-v3", H100, 4, dict(global_batch=32, seq_len=4096),
                            dict(dp=8, pp=4, ep=8, zero=1, micro_batch=1)),
    # GPT-OSS's sinks, window and biases: refused by autopar before anything is written
    "gpt-oss-20b-ep4": ("gpt-oss-20b", H100, 1, dict(global_batch=16, seq_len=4096),
                        dict(dp=8, ep=4, zero=1, micro_batch=1)),
}


REFUSED = {"gpt-oss-20b-ep4": "attention sinks"}
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
                      "capability": CAPABILITY[cluster]})
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


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron_accepts_the_export_and_derives_the_plan(name: str, validated) -> None:
    plan, verdict = validated[name]
    if "export refused" in verdict:  # refused by autopar with the reason, before writing
        assert name in REFUSED and REFUSED[name] in verdict["export refused"]
        return
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
