"""A plan as Megatron-Bridge (NeMo) recipe overrides: ``model.tensor_model_parallel_size=2 ...``.

Megatron-Bridge's recipes return a ``ConfigContainer`` whose sections are Megatron-Core's config
dataclasses, and its launchers take Hydra-style ``section.field=value`` overrides
(``scripts/training/run_recipe.py``, ``megatron.bridge.training.utils.omegaconf_utils.
parse_hydra_overrides``). The fields are Megatron-LM's, so the mapping is ``megatron``'s
(``megatron_items``), placed in Bridge's sections. Names read from NVIDIA-NeMo/Megatron-Bridge at
067f987df03b8355b03192d88d70f1709fedf51a (2026-08-22): ``src/megatron/bridge/training/config.py``
(``ConfigContainer``: ``model``, ``train``, ``ddp``, ``optimizer``, ``dataset``,
``mixed_precision``), ``src/megatron/bridge/training/mixed_precision.py`` (``bf16_mixed``,
``fp16_mixed``), ``src/megatron/bridge/models/gpt_provider.py`` (``seq_length``,
``share_embeddings_and_output_weights``), ``docs/recipe-usage.md``; and from Megatron-LM at
d98e8a64ddf34856e74b24714e3bedb2f5a39553 for the Megatron-Core classes those sections are. The
keys Bridge accepts are in ``tests/data/megatron_bridge_keys.json``.

Where Bridge differs from Megatron-LM's command line: precision is a recipe name
(``mixed_precision=bf16_mixed``; its loss scaling is Megatron's default, from 2^32, close), the
virtual pipeline is ``model.virtual_pipeline_model_parallel_size``, a gated MLP's activation is
``model.activation_func=silu`` (else the recipe's provider's stays: a GPT recipe's GELU), the
experts' count is ``model.num_moe_experts`` and their width always written
(``moe_ffn_hidden_size``: a recipe's own would stay), and the Megatron-LM-only switches
(``--group-query-attention``, ``--swiglu``) have no field. What the plan decides by Megatron's
defaults -- no interleaving, the distributed optimizer or Megatron-FSDP off, no sequence
parallelism, no TP communication overlap, no recomputation -- is written too, so a recipe's
own setting does not survive: the Megatron items carry the switches off and the fields unset
(``None``: ``null``), which Megatron's command line leaves out (``megatron.flags``).
"""

from __future__ import annotations

from autopar.core.plan import Plan
from autopar.core.specs import Fp8Recipe, Precision
from autopar.exports.mapping import Export, Fit, Row, plan_rows
from autopar.exports.megatron import Item, Setting, megatron_items

SOURCE = ("NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/config.py, "
          "training/mixed_precision.py, models/gpt_provider.py, docs/recipe-usage.md at "
          "067f987df03b8355b03192d88d70f1709fedf51a; NVIDIA/Megatron-LM megatron/core config "
          "classes at d98e8a64ddf34856e74b24714e3bedb2f5a39553")
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
NOT_FIELDS = frozenset({"group_query_attention", "fp16", "bf16", "initial_loss_scale",
                        "accumulate_allreduce_grads_in_fp32",
                        "loss_scale_window", "hysteresis", "vocab_size",
                        "max_position_embeddings", "num_layers_per_virtual_pipeline_stage"})
"""Megatron-LM flags with no Bridge field of that name: handled below, or said in the row."""


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


def _bridge_item(item: Item, plan: Plan) -> tuple[list[str], Fit, str]:
    """(overrides, fit, note) of one Megatron item in Bridge's terms."""
    names = {n for n, _ in item.settings}
    extra: list[str] = []
    fit, note = item.fit, item.note
    if item.field == "train.seq_len":
        extra = [f"dataset.seq_length={plan.train.seq_len}"]
    elif item.field == "config.virtual_stages":  # null without interleaving: a recipe's goes
        c = plan.config
        interleaved = c.schedule.value == "interleaved" and c.virtual_stages > 1
        extra = ["model.virtual_pipeline_model_parallel_size="
                 + (str(c.virtual_stages) if interleaved else "null")]
    elif item.field == "train.precision":
        p = plan.train.precision
        if p is Precision.BF16:
            extra = ["mixed_precision=bf16_mixed"]
        elif p is Precision.FP8:
            recipe = ("bf16_with_fp8_current_scaling_mixed"
                      if plan.train.fp8_recipe is Fp8Recipe.TENSORWISE
                      else "bf16_with_fp8_subchannel_scaling_mixed")
            extra = [f"mixed_precision={recipe}"]
            fit, note = Fit.CLOSE, (f"{recipe}: Transformer Engine's FP8 on every layer's "
                                    "linears (experts included; autopar keeps routers and "
                                    "experts bf16)"
                                    + ("" if plan.train.fp8_recipe is Fp8Recipe.TENSORWISE
                                       else "; sub-channel (1 x 128) scales stand for "
                                            "autopar's per-row ones"))
        elif p is Precision.FP16:
            extra = ["mixed_precision=fp16_mixed"]
            fit, note = Fit.CLOSE, ("fp16_mixed's dynamic loss scaling starts at 2^32 "
                                    "(Megatron's default) where autopar's starts at 2^16 and "
                                    "grows every 2000 clean steps, and it reduces gradients in "
                                    "fp16 where autopar reduces them in fp32; set "
                                    "mixed_precision.initial_loss_scale and "
                                    "grad_reduce_in_fp32 in Python to match")
        else:
            extra = ["mixed_precision=null"]
    elif item.field == "model.vocab_size":
        fit, note = Fit.NONE, ("the recipe's tokenizer sets the vocabulary "
                               f"(tokenizer.vocab_size={item.value} with the "
                               "NullTokenizer)")
    elif item.field == "model.max_positions":
        fit, note = Fit.NONE, "the recipe's model provider sets the position table"
    elif item.field == "model.family" and "swiglu" in names:
        # the gated MLP's activation: a recipe of another architecture (a GPT one's GELU)
        # would otherwise keep its own
        extra = ["model.activation_func=silu"]
    elif item.field == "model.family":
        fit, note = Fit.CLOSE, ("choose a GPT recipe: its provider sets the GELU activation "
                                "the plan's model runs; the overrides here set the rest of the "
                                "shape")
    return overrides_of(item.settings) + extra, fit, note


def export(plan: Plan, allow_approximate: bool = False) -> Export:
    """``overrides.txt``: one override a line, the order of the plan's fields; what the plan
    turns off (a switch false, a field null) written too, which the Megatron command line
    leaves to its defaults, so that a recipe's own setting does not survive."""
    rows, lines = {}, []
    for item in megatron_items(plan, allow_approximate):
        overrides, fit, note = _bridge_item(item, plan)
        rows[item.field] = Row(item.field, item.value, " ".join(overrides), fit, note)
        lines += overrides
    text = "\n".join(lines) + "\n"
    usage = f"""`{OVERRIDES}` holds one Hydra-style override a line for a Megatron-Bridge recipe of
this model (`docs/recipe-usage.md`), e.g.

    torchrun --nnodes {plan.nodes} --nproc-per-node {plan.gpus_per_node} \\
        scripts/training/run_recipe.py --recipe <model>_pretrain_config \\
        $(cat {OVERRIDES})

or in Python: `parse_hydra_overrides(omega_conf, open("{OVERRIDES}").read().split())`.
Data, tokenizer, steps and learning rate stay the recipe's or yours."""
    return Export("Megatron-Bridge", {OVERRIDES: text}, plan_rows(plan, rows), SOURCE, usage)
