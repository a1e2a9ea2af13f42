"""Hold the cost model to published mixture-of-experts training runs (``tests/data/moe_runs.json``).

Each run is re-created as it ran: its model (the zoo family its architecture belongs to, with
the run's shape: ``moe_model_spec``), its GPUs (``hgx-h100-80g`` nodes of 8), its batch and
sequence, and its parallel layout as autopar expresses it (``run_config``):

* tp, pp, cp, ep, etp as printed; dp = GPUs / (tp x pp x cp); sequence parallelism as printed
  (Megatron-Core requires it with MoE under tp > 1): the experts' mesh then folds over the tp
  ranks, so ep 32 with tp 2 and dp 16 is expressible;
* Megatron's distributed optimizer -> ZeRO 1, Megatron-FSDP -> ZeRO 3;
* the gradients' dtype (``grad_dtype_of``): bf16 where the run states bf16 main gradients
  (Megatron-LM's precision-aware optimizer, ``--grad-reduce-in-bf16``; NeMo 1's
  ``distributed_fused_adam`` with ``grad_sync_dtype: bf16``, Apex's gradient buckets and their
  reduction in that dtype) or runs Megatron-FSDP
  (whose main gradients take the compute dtype unless set: ``megatron_fsdp_main_grads_dtype``
  None in Megatron-Core 0.19's ``DistributedDataParallelConfig``), else fp32, Megatron-LM's
  default under ``--bf16`` (``accumulate_allreduce_grads_in_fp32``). The precision-aware
  optimizer's bf16 moments are priced as fp32 ones: autopar's engine has no such optimizer;
* the virtual pipeline size -> the interleaved schedule with that many chunks per rank; the
  stages cut as Megatron-LM cuts them, evenly (``validation.run_partition``), or as the run's
  Megatron-Core layout places the layers where it states one (``train.pipeline_layout``,
  ``core.stages.layout_stage_blocks``: DeepSeek-V3's ``Et|(tt|)*30mL``, the embedding and one
  dense layer in the first chunk, the multi-token prediction layer and the loss in the last,
  which autopar's model has not: its MTP layer is not priced);
* recomputation: Megatron's ``full`` -> ``full``; its selective module ``moe`` (the whole MoE
  layer) -> ``moe``, the same policy; its other selective modules (``layernorm``,
  ``moe_act``, ``mla_up_proj``: a few element-wise ops and up-projections rerun) and none ->
  ``selective``, the policy whose time is theirs to within those reruns, and which keeps what
  they drop: Megatron's linears keep a column-parallel input as its sequence shard under any
  recomputation (``Checkpoint.regathers``), and with the fused attention these runs ran
  ``selective`` recomputes nothing else (``recompute_policy``);
* what the engines ran that autopar's engine does not, as the priced fusions that name it
  (``core.specs.MOE_FUSIONS``): the fused token permutation (``moe_permute``, unless the run
  states ``moe_permute_fusion=false``: ``train.permute_fusion``), DeepEP's or HybridEP's
  dispatch (``deepep``) and the all-to-all overlapped with another micro-batch's compute
  (``ep_a2a_overlap``);
* the fused norm and activation the run's engine ran (Transformer Engine's, or torch.compile's
  in a compiled torchtitan run) as autopar's kernels of those names (``ENGINE_KERNELS``);
* the router's balance as the run states it (``train.router_balance``): forced
  (``--moe-router-force-load-balancing``) routes every expert the mean load, so the busiest
  rank's share is the mean (``Efficiency.moe_load_imbalance`` 1.0); natural routing or none
  stated takes the default imbalance.

Nothing is fitted per run: every run is priced with the same ``Efficiency``. A run whose model
or layout autopar cannot express is reported with the reason (``MoERunCheck.refused``) and
counted as a miss by the callers. Used by ``tests/unit/measure/test_moe_runs.py`` (which
asserts) and ``bench/validate_moe.py`` (which prints the table).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import ClusterSpec
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency

if TYPE_CHECKING:
    from autopar.analysis.graph import GraphIR
    from autopar.costmodel.pipeline import StagePartition

CLUSTER = {"H100-SXM-80GB": "hgx-h100-80g", "H100-80GB": "hgx-h100-80g",
           "H200-SXM-141GB": "hgx-h200", "B200-180GB": "dgx-b200", "B200-GB200": "gb200-nvl72"}
"""The cluster preset of each GPU the runs name."""


MODEL_OPTIONS = ("attention_sinks", "sliding_window", "sliding_window_pattern", "attention_bias",
                 "expert_bias", "swiglu_limit", "swiglu_alpha")
"""The ``moe`` family's fields a run's model may set as they are (GPT-OSS's attention and
experts)."""


def load_runs(path: str | Path, precision: str | None = "bf16") -> list[dict]:
    """The runs of ``path`` trained in ``precision`` (``None``: all of them)."""
    return [r for r in json.loads(Path(path).read_text())["runs"]
            if precision is None or r["train"]["precision"] == precision]


def used_for_validation(run: dict) -> bool:
    """Whether the run counts in the mean error the tests hold: every run but those whose
    ``validation`` field says why not (a step that fixed overheads no cost model here prices
    dominate)."""
    return "validation" not in run


def measured_s(run: dict) -> float:
    """The run's step time: printed, or derived as its ``derivation`` field says."""
    m = run["measured"]
    return float(m.get("step_time_s_derived") or m["step_time_s"])


def run_model_spec(model: dict, seq_len: int) -> ModelSpec:
    """The zoo model of a run's architecture: a mixture of experts as ``moe_model_spec``; a
    dense decoder with a gated (SwiGLU) MLP and RMSNorm in the ``llama`` family; anything
    else ``AutoparError`` (Nemotron-4's squared-ReLU, un-gated MLP has no zoo family)."""
    if model.get("num_experts"):
        return moe_model_spec(model, seq_len)
    mlp = str(model.get("mlp") or "swiglu").lower()
    norm = str(model.get("normalization") or "RMSNorm").lower()
    if not mlp.startswith("swiglu") or norm != "rmsnorm":
        raise AutoparError(f"{model['name']}: a dense decoder with a {mlp} MLP and {norm}: no "
                           "zoo family has that block", where="model",
                           fix="give it as a FILE.py factory to price it")
    fields = dict(num_layers=model["num_layers"], hidden_size=model["hidden_size"],
                  num_heads=model["num_heads"], num_kv_heads=model["num_kv_heads"],
                  ffn_hidden_size=model["ffn_hidden_size"], vocab_size=model["vocab_size"],
                  seq_len=seq_len, tie_embeddings=bool(model.get("tie_embeddings", False)))
    return ModelSpec("llama", overrides=fields)


def fp8_recipe_of(text: str) -> str:
    """autopar's recipe for a run's FP8 recipe as its source names it (``Fp8Recipe``'s
    mapping): per-tensor scales (Transformer Engine's delayed and current scaling, torchao's
    tensorwise) -> ``tensorwise``; finer ones (rowwise, blockwise, MXFP8) -> ``rowwise``. The
    recipe named first decides (a note may name another after it)."""
    text = text.lower()
    finer = ("rowwise", "blockwise", "mxfp8", "fp8-mx", "subchannel")
    per_tensor = ("tensorwise", "per-tensor", "current", "delayed")
    first = {word: text.find(word) for word in finer + per_tensor if word in text}
    if not first:
        return "tensorwise"
    return "rowwise" if min(first, key=first.get) in finer else "tensorwise"


def moe_model_spec(model: dict, seq_len: int) -> ModelSpec:
    """The zoo model of a run's architecture: DeepSeek-style (shared experts, dense first
    layers, MLA) in the ``deepseek`` family, the others in ``moe``; ``AutoparError`` for an
    architecture neither expresses."""
    common = dict(num_layers=model["num_layers"], hidden_size=model["hidden_size"],
                  num_heads=model["num_heads"], num_kv_heads=model["num_kv_heads"],
                  vocab_size=model["vocab_size"], num_experts=model["num_experts"],
                  top_k=model["top_k"], capacity_factor=None, seq_len=seq_len,
                  tie_embeddings=bool(model.get("tie_embeddings", False)))
    common.update({k: model[k] for k in MODEL_OPTIONS if k in model})
    if model.get("router_group_topk"):
        common.update(router_groups=int(model["router_groups"]),
                      router_group_topk=int(model["router_group_topk"]))
    if model.get("head_dim") and model["head_dim"] * model["num_heads"] != model["hidden_size"]:
        common["head_size"] = model["head_dim"]
    shared = int(model.get("num_shared_experts") or 0)
    dense = int(model.get("first_k_dense") or 0)
    if shared or dense or model.get("attention") == "mla":
        fields = dict(common, ffn_hidden_size=model["ffn_hidden_size"],
                      moe_ffn_hidden_size=model["moe_ffn_hidden_size"],
                      num_shared_experts=shared, first_k_dense=dense)
        if model.get("attention") == "mla":
            fields.update(mla_fields(model))
        return ModelSpec("deepseek", overrides=fields)
    return ModelSpec("moe", overrides=dict(common, ffn_hidden_size=model["moe_ffn_hidden_size"]))


def mla_fields(model: dict) -> dict:
    """The ``deepseek`` family's multi-head latent attention fields of a run's model; the
    family's grouped-query attention (all heads) where it has no MLA."""
    from autopar.models.deepseek.model import DeepSeekConfig

    names = {f for f in DeepSeekConfig.__dataclass_fields__}
    mla = model["mla"]
    if "kv_lora_rank" not in names:
        return {"num_kv_heads": model["num_heads"]}
    return {"attention": "mla", **{k: mla[k] for k in ("q_lora_rank", "kv_lora_rank",
                                                     "qk_nope_head_dim", "qk_rope_head_dim",
                                                     "v_head_dim")}}


TORCH_NATIVE = re.compile(r"torchao|torchtitan", re.IGNORECASE)
"""A run of torch's own stack (torchtitan, torchao's float8 linears) where its source, notes or
FP8 recipe name it; any other run is Megatron's (Megatron-Core, NeMo, Megatron-Bridge) on
Transformer Engine (``engine_of``)."""


ENGINE_KERNELS = ("rms_norm", "layer_norm", "swiglu", "gelu")
"""The fused kernels of autopar's (``core.specs.KERNEL_FUSIONS``) that the runs' engines ran in
their place, priced as autopar's kernels of those names (what they save for backward: a norm's
input and statistics, an activation's inputs; their time: one memory-bound pass):

* Transformer Engine's normalization (Megatron-Core, NeMo, Megatron-Bridge: its
  ``LayerNormLinear``/``TENorm`` run the norm as one kernel) and Megatron's bias-activation
  fusion (``bias_swiglu_fusion``/``bias_gelu_fusion``: on unless ``--no-bias-swiglu-fusion``
  in Megatron-LM's arguments; ``bias_activation_fusion`` on in the NeMo and Bridge model
  providers these runs used);
* torchtitan's runs under ``torch.compile`` (Inductor fuses the norm's and the activation's
  element-wise ops); an eager torchtitan run gets none.

The rotary fusion is left out: the sources do not state it for every run (Megatron-LM's
``apply_rope_fusion`` default differs from the providers'). A name a model has no op of (``gelu``
on a SwiGLU model) matches nothing and prices nothing."""


def engine_of(run: dict) -> tuple[bool, bool]:
    """(torch's own stack, compiled) for ``run``: ``TORCH_NATIVE`` in its source's title, its
    notes or its FP8 recipe; ``torch.compile`` in its notes."""
    t = run["train"]
    notes = str(t.get("other") or "")
    text = f"{run['source']['title']} {notes} {t.get('fp8_recipe') or ''}"
    return TORCH_NATIVE.search(text) is not None, "torch.compile" in notes


def run_fusions(run: dict) -> tuple[str, ...]:
    """The priced fusions naming what the run's engine did that autopar's does not: the fused
    norm and activation (``ENGINE_KERNELS``) of Transformer Engine or of a compiled torchtitan
    run; Megatron-Core's activations (``mcore_activations``: the pipeline outputs freed once
    sent, the context-parallel attention's output in place) on every engine built on it; torch's micro-pipeline TP (``async TP`` in the run's notes) as ``async_tp``; FP8's
    casts as Transformer Engine fuses them (``fp8_fused_casts``) or as Inductor compiles
    torchao's (``fp8_compiled_casts``; eager: autopar's engine's, no fusion)."""
    train = run["train"]
    native, compiled = engine_of(run)
    out = list(ENGINE_KERNELS) if compiled or not native else []
    if train.get("permute_fusion", True) is not False:
        out.append("moe_permute")
    if "async tp" in str(train.get("other") or "").lower() and int(train.get("tp") or 1) > 1:
        out.append("async_tp")
    if not native:  # Megatron-Core's pipeline outputs and context-parallel attention
        out.append("mcore_activations")
    if train.get("precision") == "fp8":
        if not native:
            out.append("fp8_fused_casts")  # Transformer Engine's FP8 (Megatron, NeMo, Bridge)
        elif compiled:
            out.append("fp8_compiled_casts")
    dispatcher = str(train.get("dispatcher") or "")
    if "deepep" in dispatcher or "hybridep" in dispatcher:
        out.append("deepep")
    if train.get("a2a_overlap"):
        out.append("ep_a2a_overlap")
    return tuple(out)


BF16_GRADS = re.compile(r"bf16[^;]*main grad|main grads? (in )?bf16|grad[-_]reduce[-_]in[-_]bf16"
                        r"|grad_sync_dtype bf16|megatron-fsdp", re.IGNORECASE)
"""What in a run's optimizer notes (``train.zero``, ``train.other``) says its gradients are
accumulated and reduced in bf16 (module docstring)."""


def grad_dtype_of(run: dict) -> str:
    """``TrainSpec.grad_dtype`` of ``run`` (module docstring)."""
    t = run["train"]
    text = f"{t.get('zero') or ''}; {t.get('other') or ''}"
    return "bf16" if t["precision"] in ("bf16", "fp8") and BF16_GRADS.search(text) else "fp32"


def recompute_policy(recompute: str) -> str:
    """autopar's checkpoint policy for a run's recomputation as its source states it
    (module docstring)."""
    text = recompute.lower()
    if text.startswith("full"):
        return "full"
    if "per-op" in text or "'op'" in text:  # torchtitan's per-op SAC: the matmuls kept
        return "matmuls"
    modules = {m.strip(" ,;:()[]'\"") for m in text.replace(",", " ").split()}
    return "moe" if "moe" in modules else "selective"


def run_stages(run: dict, config: ParallelConfig, graph: GraphIR) -> StagePartition | None:
    """The run's blocks per pipeline rank (module docstring): its stated layout's, else
    Megatron-LM's even cut."""
    from autopar.core.stages import layout_chunks, layout_stage_blocks
    from autopar.costmodel.pipeline import StagePartition
    from autopar.measure.validation import run_partition

    layout = run["train"].get("pipeline_layout")
    if not layout or config.pp == 1:
        return run_partition(config, graph)
    chunks = len(layout_chunks(layout))
    if chunks != config.pp * config.virtual_stages:
        raise AutoparError(f"pipeline layout {layout!r}: {chunks} chunks for pp={config.pp} x "
                           f"{config.virtual_stages} virtual stages", where="train.pipeline_layout",
                           fix="give the run's layout as it ran")
    return StagePartition(layout_stage_blocks(layout, config.pp, graph.num_blocks))


def run_config(run: dict) -> ParallelConfig:
    """The run's parallel layout as autopar expresses it (module docstring)."""
    t, gpus = run["train"], run["cluster"]["num_gpus"]
    tp, pp, cp = int(t["tp"]), int(t["pp"]), int(t.get("cp") or 1)
    text = str(t.get("zero", "")).lower()
    zero = 3 if "fsdp" in text and not re.search(r"fsdp\s*[=:]?\s*0\b", text) else 1
    recompute = str(t.get("recompute") or "none").lower()
    vpp = int(t.get("vpp") or 1)
    return ParallelConfig(
        dp=gpus // (tp * pp * cp), tp=tp, pp=pp, cp=cp, ep=int(t["ep"]),
        etp=int(t.get("etp") or 1), zero=zero, micro_batch=int(t["micro_batch"]),
        schedule="interleaved" if vpp > 1 else "1f1b", virtual_stages=vpp,
        # Megatron-Core runs a mixture of experts under tp > 1 with sequence parallelism only
        sequence_parallel=tp > 1,
        checkpoint=recompute_policy(recompute),
        fusions=run_fusions(run))


@dataclass(frozen=True)
class MoERunCheck:
    run: dict
    measured_s: float
    predicted_s: float | None
    """``None`` where the run was refused."""
    peak_gib: float | None = None
    usable_gib: float | None = None
    refused: str = ""
    """Why autopar cannot express the run (its ``AutoparError``), or empty."""

    @property
    def error(self) -> float | None:
        if self.predicted_s is None:
            return None
        return self.predicted_s / self.measured_s - 1.0

    @property
    def fits(self) -> bool:
        return self.peak_gib is not None and self.peak_gib <= (self.usable_gib or 0.0)


def check_moe_run(run: dict, *, efficiency: Efficiency = DEFAULT_EFFICIENCY,
                  graphs: dict | None = None) -> MoERunCheck:
    """Price ``run`` as ``autopar.estimate`` does; ``graphs`` memoises the models' facts and
    traces by (architecture, sequence length) across calls."""
    from autopar.analysis.admissibility import check, facts_of
    from autopar.analysis.tracing import trace
    from autopar.costmodel.step import check_world
    from autopar.search.planner import plan_config

    measured = measured_s(run)
    try:
        gpu = run["cluster"]["gpu"]
        if gpu not in CLUSTER:
            raise AutoparError(f"no cluster preset for {gpu}", where="cluster.gpu",
                               fix=f"use one of {', '.join(CLUSTER)}")
        gpus = int(run["cluster"]["num_gpus"])
        preset = ClusterSpec.preset(CLUSTER[gpu])
        cluster = preset.with_nodes(gpus // preset.gpus_per_node)
        t = run["train"]
        fp8 = t["precision"] == "fp8"
        train = TrainSpec(global_batch=int(t["global_batch"]), seq_len=int(t["seq_len"]),
                          precision=t["precision"],
                          fp8_recipe=fp8_recipe_of(str(t.get("fp8_recipe"))) if fp8
                          else "tensorwise", grad_dtype=grad_dtype_of(run))
        config = run_config(run)
        spec = run_model_spec(run["model"], train.seq_len)
        key = (json.dumps(spec.overrides, sort_keys=True), spec.name, train.seq_len)
        graphs = {} if graphs is None else graphs
        if key not in graphs:
            model = spec.build(device="meta")
            graphs[key] = (facts_of(model), trace(model, train))
        facts, graph = graphs[key]
        if t.get("router_balance") == "forced":
            efficiency = replace(efficiency, moe_load_imbalance=1.0)
        # autopar.estimate's path (api.plan_for, split_weights off), the trace shared by runs
        check_world(config, cluster)
        check(facts, config, train)
        est = plan_config(graph, facts, run["model"]["name"], cluster, train, config,
                          efficiency=efficiency, split_weights=False, spec=spec,
                          partition=run_stages(run, config, graph)).estimate
    except AutoparError as err:
        return MoERunCheck(run, measured, None, refused=str(err))
    gib = 2.0 ** 30
    return MoERunCheck(run, measured, est.step_time_s, est.peak_memory_bytes / gib,
                       cluster.usable_hbm_bytes / gib)
