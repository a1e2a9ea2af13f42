"""A plan as Megatron-Bridge (NeMo) recipe overrides: ``model.tensor_model_parallel_size=2 ...``.

Megatron-Bridge's recipes return a ``ConfigContainer`` whose sections are Megatron-Core's config
dataclasses, and its launcher takes Hydra-style ``section.field=value`` overrides
(``scripts/training/run_recipe.py``: the recipe, then
``megatron.bridge.training.utils.omegaconf_utils.process_config_with_overrides``, then
``pretrain``, whose first step, ``training/config.py:runtime_config_update``, resolves the
mixed precision and communication overlap into the model and validates). The fields are
Megatron-LM's, so the mapping is ``megatron``'s (``megatron_items``), placed in Bridge's
sections. Names and behaviour read from the ``megatron-bridge`` 0.6.2 release (PyPI, with
megatron-core 0.19.2), whose own code ``tests/unit/exports/test_bridge_runs.py`` runs on each
export: ``training/config.py``, ``training/utils/omegaconf_utils.py``,
``training/mixed_precision.py``, ``training/comm_overlap.py``, ``models/gpt_provider.py`` and the
recipes ``recipe_for`` names. The keys are also in ``tests/data/megatron_bridge_keys.json``.

A recipe's own setting survives wherever the overrides are silent, so besides the plan's
Megatron fields they write what the plan decides by Megatron's defaults (no interleaving, no
sequence parallelism, no recomputation: a switch false, a field ``null``), and what Bridge's
code derives otherwise:

* ``mixed_precision`` and ``comm_overlap`` are replaced whole: ``runtime_config_update`` copies
  them into the model, optimizer and DDP sections after the overrides, so a field override there
  does not last. ``mixed_precision`` is a recipe name where one is the plan's (``bf16_mixed``),
  else a ``MixedPrecisionConfig`` built by ``_target_`` (fp16 with autopar's loss scaling and
  fp32 gradient reduction, where ``fp16_mixed`` starts at 2^32 and reduces in fp16; fp8 on every
  layer, where ``bf16_with_fp8_current_scaling_mixed`` keeps the first and last in bf16);
  ``comm_overlap`` a ``CommOverlapConfig`` with the plan's TP overlap (a recipe's turns
  ``model.tp_comm_overlap`` back on). Each is written ``null`` first: Hydra merges a dict into a
  recipe's section, which the ``null`` removes.
* ``ddp.`` and ``optimizer.use_distributed_optimizer`` both (Bridge turns both on when either
  is: ZeRO-0 would run as ZeRO-1); both on under Megatron-FSDP, which Bridge requires; the
  sharding strategy ``no_shard`` without it.
* the pipeline's layout fields (``pipeline_model_parallel_layout``, the first and last stages'
  layers, the embedding and loss in the split): a recipe's layout (DeepSeek-V3's) would split the
  plan's layers its own way.
* the model's shape beyond Megatron-LM's flags: ``activation_func`` (a gated MLP's ``silu``, a
  GPT's ``gelu``), the norms' plain weight (the GPT-3 recipe's ``layernorm_zero_centered_gamma``
  stores it less one), ``kv_channels`` (a recipe's head width would stay), ``qk_layernorm`` and
  ``add_qkv_bias`` either way, the experts' count (``num_moe_experts``; ``null`` for a dense
  model), width, shared experts and ``moe_layer_freq`` as a list (Megatron-LM's
  ``([0]*3+[1]*58)`` is not Hydra's grammar), and ``mtp_num_layers=null`` (DeepSeek-V3's recipe
  adds a multi-token-prediction layer the plan does not have).
* the optimizer's dtypes fp32 and ``use_precision_aware_optimizer=false`` without offload
  (DeepSeek-V3's recipe keeps bf16 states and gradients: not the optimizer the plan priced).
* what autopar prices none of, off: CUDA graphs (``cuda_graph_impl=none``; Qwen3-MoE's recipe
  captures its MoE router, which Megatron refuses with the plan's MoE recomputation), and of the
  MoE engine's features those the plan's fusions do not name (permutation fusion and grouped
  GEMM, the DeepEP dispatcher for all-to-all, the EP overlap).

Precision is a recipe's or a ``MixedPrecisionConfig``, the virtual pipeline is
``model.virtual_pipeline_model_parallel_size``, and the Megatron-LM-only switches
(``--group-query-attention``, ``--swiglu``) have no field.
"""

from __future__ import annotations

from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.core.specs import (ASYNC_TP, DEEPEP, EP_A2A_OVERLAP, MOE_PERMUTE, Fp8Recipe,
                                GradDtype, Precision)
from autopar.exports.mapping import Export, Fit, Row, plan_rows
from autopar.exports.megatron import Item, Setting, kv_channels, megatron_items
from autopar.models.shape import ModelShape, model_shape

VERSION = "0.6.2"
"""The megatron-bridge release the overrides are written for (PyPI, 2026-09)."""
SOURCE = (f"megatron-bridge {VERSION} (PyPI; with megatron-core 0.19.2): "
          "training/config.py, training/utils/omegaconf_utils.py, training/mixed_precision.py, "
          "training/comm_overlap.py, models/gpt_provider.py, recipes/")
OVERRIDES = "overrides.txt"

SECTION = {
    "micro_batch_size": "train", "global_batch_size": "train",
    "use_distributed_optimizer": "ddp", "use_megatron_fsdp": "ddp",
    "data_parallel_sharding_strategy": "ddp",
    "optimizer": "optimizer", "optimizer_cpu_offload": "optimizer",
    "use_precision_aware_optimizer": "optimizer", "optimizer_offload_fraction": "optimizer",
    "ckpt_format": "checkpoint",
}
"""Megatron field -> Bridge section; every other field is the model's (``model.``)."""
RENAMED = {"untie_embeddings_and_output_weights": ("share_embeddings_and_output_weights", False),
           "swiglu": ("gated_linear_unit", True)}
"""Megatron-LM flags whose Bridge field has another name (and the value it takes)."""
FIELD_NAMES = {"num_experts": "num_moe_experts", "norm_epsilon": "layernorm_epsilon",
               "use_rope_scaling": "rope_scaling"}
"""Megatron-LM arguments whose ``TransformerConfig`` field, which Bridge's ``model.`` section
is, has another name (the value kept)."""
NOT_FIELDS = frozenset({"group_query_attention", "vocab_size", "max_position_embeddings",
                        "num_layers_per_virtual_pipeline_stage"})
"""Megatron-LM flags with no Bridge field of that name: handled below, or said in the row."""

RECIPES = {"llama3-8b": "llama3_8b_pretrain_config", "llama3-70b": "llama3_70b_pretrain_config",
           "qwen3-30b-a3b": "qwen3_30b_a3b_pretrain_config",
           "deepseek-v3": "deepseek_v3_pretrain_config"}
"""Zoo models with a recipe of their own in Bridge 0.6.2, by the name ``run_recipe.py
--recipe`` looks up in ``megatron.bridge.recipes``."""
FAMILY_RECIPES = {
    "gpt": ("gpt3_175b_pretrain_32gpu_h100_bf16_config", "Bridge's GPT-3 recipe"),
    "llama": ("llama3_8b_pretrain_config", "Bridge's Llama 3 8B recipe"),
    "moe": ("qwen3_30b_a3b_pretrain_config", "Bridge 0.6.2 has no recipe of this model: its "
            "Qwen3-30B-A3B MoE recipe"),
    "deepseek": ("deepseek_v3_pretrain_config", "Bridge's DeepSeek-V3 recipe"),
}
"""The recipe a model of each family starts from where it has none of its own; the overrides
then set the plan's model's shape (``recipe_for``)."""

OPTIMIZER_DTYPES = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
"""The optimizer's gradient, main-weight and state dtypes: fp32 in every autopar plan (a recipe
may keep bf16 ones, DeepSeek-V3's)."""
MIXED_PRECISION = "megatron.bridge.training.mixed_precision.MixedPrecisionConfig"
COMM_OVERLAP = "megatron.bridge.training.comm_overlap.CommOverlapConfig"


def recipe_for(plan: Plan) -> tuple[str, str]:
    """(the Bridge recipe to run the overrides on, why that one): the model's own where Bridge
    has it, else its family's (a Llama-style transformers model: Llama's, or Qwen3-MoE's with
    experts), else a placeholder the README asks to fill."""
    own = RECIPES.get(plan.model)
    if own:
        return own, "the model's own recipe"
    shape = model_shape(plan.model_spec or ModelSpec.zoo(plan.model))
    if shape is None:
        return "<model>_pretrain_config", "a recipe of your model (its shape is not recorded)"
    family = shape.family if shape.family in FAMILY_RECIPES else (
        "moe" if shape.num_experts else "llama")
    name, why = FAMILY_RECIPES[family]
    return name, f"{why}, reshaped by the overrides"


def _value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _dtype(name: str) -> str:
    """A ``torch.dtype`` in a ``_target_`` dict: the object itself (``_call_: false``)."""
    return f"{{_target_:torch.{name},_call_:false}}"


def _replace(section: str, target: str, fields: dict[str, object]) -> list[str]:
    """``section`` replaced by ``target(**fields)``: ``null`` first, since Hydra merges a dict
    into the recipe's section (and refuses its new ``_target_`` key), then the dict, which
    Bridge's ``_apply_overrides`` instantiates."""
    body = ",".join(f"{k}:{v if isinstance(v, str) and v.startswith('{') else _value(v)}"
                    for k, v in fields.items())
    return [f"{section}=null", f"{section}={{_target_:{target},{body}}}"]


def overrides_of(settings: tuple[Setting, ...]) -> list[str]:
    """Bridge overrides of Megatron settings (those with a Bridge field)."""
    out = []
    for name, value in settings:
        if name in NOT_FIELDS:
            continue
        if name in RENAMED:
            name, value = RENAMED[name]
        name = FIELD_NAMES.get(name, name)
        out.append(f"{SECTION.get(name, 'model')}.{name}={_value(value)}")
    return out


def _precision(plan: Plan) -> tuple[list[str], Fit, str]:
    """``mixed_precision``: Bridge's ``bf16_mixed`` where it is the plan's, else a
    ``MixedPrecisionConfig`` with the plan's fields."""
    from autopar.models.training import LOSS_SCALING

    p = plan.train.precision
    fp32_grads = plan.train.grad_dtype is GradDtype.FP32
    if p is Precision.BF16 and fp32_grads:
        return (["mixed_precision=bf16_mixed"], Fit.EXACT,
                "bf16_mixed: bf16 compute on fp32 main weights, gradients reduced in fp32")
    if p is Precision.BF16:
        fields = {"bf16": True, "params_dtype": _dtype("bfloat16"),
                  "pipeline_dtype": _dtype("bfloat16"), "grad_reduce_in_fp32": False}
        return (_replace("mixed_precision", MIXED_PRECISION, fields), Fit.EXACT,
                "bf16_mixed's fields, the gradients accumulated and reduced in bf16 "
                "(grad_reduce_in_fp32 false)")
    if p is Precision.FP16:
        fields = {"fp16": True, "params_dtype": _dtype("float16"),
                  "pipeline_dtype": _dtype("float16"), "grad_reduce_in_fp32": fp32_grads,
                  "initial_loss_scale": LOSS_SCALING["init_scale"],
                  "loss_scale_window": LOSS_SCALING["growth_interval"], "hysteresis": 1}
        return (_replace("mixed_precision", MIXED_PRECISION, fields), Fit.EXACT,
                "dynamic loss scaling as autopar's engine runs it (from 2^16, halved at every "
                "overflow, doubled after 2000 clean steps) and gradients reduced in "
                f"{plan.train.grad_dtype}: Bridge's fp16_mixed would start at 2^32 and reduce "
                "them in fp16")
    if p is Precision.FP8:
        tensorwise = plan.train.fp8_recipe is Fp8Recipe.TENSORWISE
        gather = tensorwise and plan.config.zero >= 1
        fields = {"bf16": True, "params_dtype": _dtype("bfloat16"),
                  "pipeline_dtype": _dtype("bfloat16"), "grad_reduce_in_fp32": fp32_grads,
                  "fp8": "hybrid", "fp8_recipe": "tensorwise" if tensorwise else "blockwise",
                  "fp8_param_gather": gather, "first_last_layers_bf16": False}
        return (_replace("mixed_precision", MIXED_PRECISION, fields), Fit.CLOSE,
                "Transformer Engine's FP8 (e4m3 forward, e5m2 gradients) on every layer's "
                "linears, experts included (autopar keeps routers and experts bf16), with "
                + ("current per-tensor scales" if tensorwise else
                   "1 x 128 block scales standing for autopar's per-row ones")
                + ("; the weights all-gathered in FP8" if gather else "")
                + "; Bridge's bf16_with_fp8_current_scaling_mixed would keep the first and "
                "last layer in bf16")
    fields = {"fp32": True, "params_dtype": _dtype("float32"),
              "pipeline_dtype": _dtype("float32"), "grad_reduce_in_fp32": True}
    return _replace("mixed_precision", MIXED_PRECISION, fields), Fit.EXACT, "fp32 throughout"


def _zero(plan: Plan) -> list[str]:
    """Both sections' distributed-optimizer switch: Bridge turns both on when either is on
    (``_validate_and_sync_distributed_optimizer_settings``), and Megatron-FSDP needs it."""
    on = "true" if plan.config.zero >= 1 else "false"
    out = [f"ddp.use_distributed_optimizer={on}", f"optimizer.use_distributed_optimizer={on}"]
    if plan.config.zero <= 1:  # without Megatron-FSDP: a recipe's FSDP strategy would linger
        out.append("ddp.data_parallel_sharding_strategy=no_shard")
    return out


def _moe_layer_freq(n: int, first_dense: int) -> list[int]:
    return [0] * first_dense + [1] * (n - first_dense)


def _shape(shape: ModelShape | None) -> list[str]:
    """What a recipe's model keeps unless written: activation, head width, q/k norm and
    biases, the experts (or none), multi-token prediction."""
    if shape is None:
        return []
    out = ["model.activation_func=" + ("silu" if shape.gated else "gelu"),
           "model.layernorm_zero_centered_gamma=false"]  # the GPT-3 recipe's: 1 + gamma
    if not shape.gated:
        out += ["model.gated_linear_unit=false", "model.add_bias_linear=true"]
    if not shape.mla and not kv_channels(shape):  # else Megatron-LM's item writes it
        out.append(f"model.kv_channels={shape.hidden_size // shape.num_heads}")
    if not shape.mla:  # switches on are Megatron-LM's items
        out += [f"model.{name}=false" for name, on in (("qk_layernorm", shape.qk_norm),
                                                        ("add_qkv_bias", shape.qkv_bias))
                if not on]
    if not shape.num_experts:
        out.append("model.num_moe_experts=null")
    else:
        if not shape.shared_expert_size:
            out.append("model.moe_shared_expert_intermediate_size=null")
        if not shape.first_k_dense:
            out.append("model.moe_layer_freq=1")
    return out + ["model.mtp_num_layers=null"]


def _moe_engine(plan: Plan, shape: ModelShape | None) -> list[str]:
    """The MoE engine's features the plan did not price, off (a recipe's permutation fusion,
    grouped GEMM, DeepEP dispatcher or EP overlap would stay): all-to-all dispatch, autopar's."""
    if shape is None or not shape.num_experts:
        return []
    fusions = plan.config.fusions
    out = []
    if MOE_PERMUTE not in fusions:
        out += ["model.moe_permute_fusion=false", "model.moe_grouped_gemm=false"]
    if DEEPEP not in fusions:
        out.append("model.moe_token_dispatcher_type=alltoall")
    if EP_A2A_OVERLAP not in fusions:
        out.append("model.overlap_moe_expert_parallel_comm=false")
    return out


def _bridge_item(item: Item, plan: Plan, shape: ModelShape | None) -> tuple[list[str], Fit, str]:
    """(overrides, fit, note) of one Megatron item in Bridge's terms."""
    settings = item.settings
    extra: list[str] = []
    fit, note = item.fit, item.note
    if item.field == "config.zero":
        settings = tuple(s for s in settings if s[0] != "use_distributed_optimizer")
        extra = _zero(plan)
        if plan.config.zero >= 2:
            note += "; Bridge turns its distributed optimizer on with Megatron-FSDP"
    elif item.field == "train.seq_len":
        extra = [f"dataset.seq_length={plan.train.seq_len}"]
    elif item.field == "config.virtual_stages":  # null without interleaving: a recipe's goes
        c = plan.config
        interleaved = c.schedule.value == "interleaved" and c.virtual_stages > 1
        extra = ["model.virtual_pipeline_model_parallel_size="
                 + (str(c.virtual_stages) if interleaved else "null")]
    elif item.field == "stage_blocks":  # a recipe's layout or uneven stages go
        if not any(name == "pipeline_model_parallel_layout" for name, _ in settings):
            extra = ["model.pipeline_model_parallel_layout=null"]
        extra += ["model.num_layers_in_first_pipeline_stage=null",
                  "model.num_layers_in_last_pipeline_stage=null",
                  "model.account_for_embedding_in_pipeline_split=false",
                  "model.account_for_loss_in_pipeline_split=false"]
    elif item.field == "config.offload":  # fp32 states, as priced (a recipe's may be bf16)
        extra = [] if plan.config.offload else ["optimizer.optimizer_cpu_offload=false",
                                                "optimizer.use_precision_aware_optimizer=false"]
        extra += [f"optimizer.{name}=torch.float32" for name in OPTIMIZER_DTYPES]
    elif item.field == "config.fusions":
        extra = ["model.cuda_graph_impl=none", *_moe_engine(plan, shape)] + _replace(
            "comm_overlap", COMM_OVERLAP, {"tp_comm_overlap": ASYNC_TP in plan.config.fusions})
        note += ("; no CUDA graphs (autopar prices none; a recipe's would stay); "
                 "comm_overlap replaced by a CommOverlapConfig with only the TP overlap "
                 "set (a recipe's user-buffer tuning and its TP overlap go; Bridge derives the "
                 "pipeline and data-parallel overlaps from the parallelism)")
    elif item.field == "train.precision":
        return _precision(plan)
    elif item.field == "train.grad_dtype":  # mixed_precision's grad_reduce_in_fp32
        return [], fit, "with train.precision: mixed_precision's grad_reduce_in_fp32"
    elif item.field == "model.vocab_size":
        fit, note = Fit.NONE, ("the recipe's tokenizer sets the vocabulary "
                               f"(tokenizer.vocab_size={item.value} with the "
                               "NullTokenizer)")
    elif item.field == "model.max_positions":
        fit, note = Fit.NONE, "the recipe's model provider sets the position table"
    elif item.field == "model.family":
        extra = _shape(shape)
    elif item.field == "model.num_experts" and shape is not None:
        settings = tuple(s for s in settings if s[0] != "moe_layer_freq")
        if shape.first_k_dense:  # Hydra's list, not Megatron-LM's expression
            extra = [f"model.moe_layer_freq="
                     f"{_value(_moe_layer_freq(shape.num_layers, shape.first_k_dense))}"]
    return overrides_of(settings) + extra, fit, note


def export(plan: Plan, allow_approximate: bool = False) -> Export:
    """``overrides.txt``: one override a line, the order of the plan's fields; what the plan
    turns off (a switch false, a field null) written too, which the Megatron command line
    leaves to its defaults, so that a recipe's own setting does not survive."""
    shape = model_shape(plan.model_spec or ModelSpec.zoo(plan.model))
    rows, lines = {}, []
    for item in megatron_items(plan, allow_approximate):
        overrides, fit, note = _bridge_item(item, plan, shape)
        rows[item.field] = Row(item.field, item.value, " ".join(overrides), fit, note)
        lines += overrides
    text = "\n".join(lines) + "\n"
    recipe, why = recipe_for(plan)
    unset = ("    unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP refuses 1\n"
             if plan.config.zero >= 2 else "")
    usage = f"""`{OVERRIDES}` holds one Hydra-style override a line for Megatron-Bridge
{VERSION}'s recipe `{recipe}` ({why}), e.g.

{unset}    torchrun --nnodes {plan.nodes} --nproc-per-node {plan.gpus_per_node} \\
        scripts/training/run_recipe.py --recipe {recipe} \\
        $(cat {OVERRIDES})

or in Python: `process_config_with_overrides(config, cli_overrides=open("{OVERRIDES}")
.read().split())` on the recipe's `ConfigContainer`. `mixed_precision` and `comm_overlap` are
written `null` and then whole (Hydra would merge a dict into the recipe's). Data, tokenizer,
steps and learning rate stay the recipe's or yours."""
    return Export("Megatron-Bridge", {OVERRIDES: text}, plan_rows(plan, rows), SOURCE, usage)
