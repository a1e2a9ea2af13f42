"""A plan as Megatron-LM command-line arguments (``megatron_args.sh``).

Names and checks read from NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553
(2026-08-22): ``megatron/training/arguments.py`` (the parser and ``validate_args``),
``megatron/core/transformer/transformer_config.py`` (recompute fields),
``megatron/core/transformer/pipeline_parallel_layer_layout.py`` (the layout string). The flags
that parser accepts are in ``tests/data/megatron_lm_args.json``, which the tests parse the
script with; ``tests/unit/exports/test_megatron_validate.py`` runs the ``parse_args`` and
``validate_args`` of megatron-core 0.19.2 (PyPI, the release users install) on each plan kind's
script as its README launches it, and reads back what Megatron derives: every flag of every row
marked exact holds, in the argument Megatron's parser stores it into, the value written.

The mapping, field by field (``megatron_items`` builds it; Megatron-Bridge reuses it, since its
overrides are the same config fields):

=====================  ==============================================================  =======
plan field             Megatron-LM                                                     fit
=====================  ==============================================================  =======
nodes x gpus           ``torchrun --nnodes --nproc-per-node`` in the script              exact
dp                     derived: WORLD_SIZE / (tp * pp * cp)                              exact
tp, pp, cp, ep         ``--tensor-/--pipeline-model-parallel-size``,                     exact
                       ``--context-parallel-size``, ``--expert-model-parallel-size``
etp                    ``--expert-tensor-parallel-size`` (always set: Megatron's default  exact /
                       is tp); the plan's experts folded over tp under SP as Megatron   close
                       folds them; without SP autopar's whole experts per tp rank
zero 0 / 1             DDP / ``--use-distributed-optimizer``                             exact
zero 2 / 3             ``--use-megatron-fsdp --data-parallel-sharding-strategy``         exact
                       ``optim_grads`` / ``optim_grads_params``
micro_batch            ``--micro-batch-size``                                            exact
num_microbatches       derived: global / (micro * dp)                                    exact
schedule               1f1b, interleaved: Megatron's; gpipe: runs as 1F1B                exact /
                                                                                         close
virtual_stages,        ``--num-layers-per-virtual-pipeline-stage`` when the chunks are   exact
stage_blocks           even, else ``--pipeline-model-parallel-layout``
sequence_parallel      ``--sequence-parallel``                                           exact
checkpoint full        ``--recompute-granularity full --recompute-method uniform         exact
                       --recompute-num-layers 1``
checkpoint selective   ``--recompute-granularity selective --recompute-modules           exact
                       core_attn`` (Korthikanti et al. 2022, the same policy)
checkpoint matmuls     ``--recompute-granularity selective --recompute-modules           close
                       core_attn layernorm`` (+ ``moe_act``)
checkpoint moe         ``--recompute-granularity selective --recompute-modules moe``    exact /
                       (its MoE layer holds DeepSeek's shared experts: recomputed too)   close
per-block checkpoint   ``--recompute-method block --recompute-num-layers N`` when it is  exact /
                       "the first N blocks of each chunk"; else the nearest that keeps   close
                       no more
offload                ``--optimizer-cpu-offload --use-precision-aware-optimizer         exact
                       --optimizer-offload-fraction 1.0`` (refused without ZeRO >= 1)
fusions                Megatron's own fused kernels; ``--cross-entropy-loss-fusion``     close
                       ``moe_permute``: ``--moe-permute-fusion --moe-grouped-gemm``;
                       ``deepep``: ``--moe-token-dispatcher-type flex
                       --moe-flex-dispatcher-backend deepep``; ``ep_a2a_overlap``:
                       ``--overlap-moe-expert-parallel-comm``
global_batch, seq_len  ``--global-batch-size``, ``--seq-length``                         exact
precision              ``--bf16`` / ``--fp16`` with autopar's loss scaling / fp32        exact
                       default; bf16-pure refused (main params are fp32 or fp16)
grad_dtype             bf16: ``--grad-reduce-in-bf16``; fp32 under fp16:                 exact
                       ``--accumulate-allreduce-grads-in-fp32``; else the default
optimizer              adamw: ``--optimizer adam`` (decoupled decay); adam: close        exact /
                                                                                         close
model shape            ``--num-layers --hidden-size --ffn-hidden-size                    exact
                       --num-attention-heads --group-query-attention
                       --num-query-groups --max-position-embeddings``, the family's
                       switches, ``--kv-channels`` where a head is not hidden / heads
                       wide (Qwen3); a factory model's shape is not known
transformers model     Llama-style architectures (Llama, Mistral, Qwen2/3, Mixtral,      exact /
                       Qwen3-MoE) field by field: ``--rotary-base`` (transformers 5's    refused
                       ``rope_parameters`` too), Llama 3.x ``--use-rope-scaling``,
                       ``--add-qkv-bias``, ``--qk-layernorm``, ``--norm-epsilon``,
                       the experts' width; another architecture, activation, MLP
                       biases, a sliding window or a shared expert refused
                       (``ModelShape.unmapped``) unless ``--allow-approximate``
DeepSeek (zoo)         ``--multi-latent-attention`` with its ranks and head sizes,      exact
                       ``--rope-type rope`` (autopar's MLA runs plain RoPE)
GPT-OSS (zoo)          sinks, sliding window, biases, clamped SwiGLU: refused unless    refused
                       ``--allow-approximate``
=====================  ==============================================================  =======
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from autopar.core.estimate import checkpoint_text
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.core.specs import (ASYNC_TP, DEEPEP, EP_A2A_OVERLAP, MOE_PERMUTE, Checkpoint,
                                Fp8Recipe, GradDtype, Optimizer, Precision, Schedule)
from autopar.core.stages import stage_chunks
from autopar.exports.mapping import Export, Fit, Row, plan_rows, refuse
from autopar.models.shape import ModelShape, model_shape

SOURCE = ("NVIDIA/Megatron-LM megatron/training/arguments.py and "
          "megatron/core/transformer/transformer_config.py at "
          "d98e8a64ddf34856e74b24714e3bedb2f5a39553; accepted by parse_args and validate_args "
          "of megatron-core 0.19.2 (PyPI), the release the tests run")
SCRIPT = "megatron_args.sh"

Setting = tuple[str, object]
"""(Megatron config field, the argparse ``dest``; value): ``True`` is a switch given."""

FLAG_OF = {"add_bias_linear": "--disable-bias-linear", "fp8": "--fp8-format"}
"""Fields whose flag is not the field's name with dashes (the flag stores the value)."""


@dataclass(frozen=True)
class Item:
    """A plan field and the Megatron config fields it sets."""

    field: str
    value: str
    settings: tuple[Setting, ...]
    fit: Fit
    note: str = ""


def megatron_items(plan: Plan, allow_approximate: bool = False) -> list[Item]:
    """The plan as Megatron config fields, one ``Item`` per plan field (see the table in the
    module docstring); ``AutoparError`` for what Megatron cannot run, and for a model whose
    architecture the switches do not express (``ModelShape.unmapped``) unless
    ``allow_approximate``."""
    c, t = plan.config, plan.train
    shape = model_shape(plan.model_spec or ModelSpec.zoo(plan.model))
    items = [
        Item("nodes x gpus_per_node", f"{plan.nodes} x {plan.gpus_per_node}", (), Fit.EXACT,
             "the torchrun line of the script"),
        Item("config.dp", str(c.dp), (), Fit.EXACT,
             f"Megatron's data-parallel size is WORLD_SIZE / (tp * pp * cp) = "
             f"{c.world_size} / {c.tp * c.pp * c.cp}"),
        Item("config.tp", str(c.tp), (("tensor_model_parallel_size", c.tp),), Fit.EXACT),
        Item("config.pp", str(c.pp), (("pipeline_model_parallel_size", c.pp),), Fit.EXACT),
        Item("config.cp", str(c.cp), (("context_parallel_size", c.cp),), Fit.EXACT,
             "ring attention over load-balanced chunks (--cp-comm-type p2p, the default)"
             if c.cp > 1 else ""),
        Item("config.ep", str(c.ep), (("expert_model_parallel_size", c.ep),), Fit.EXACT,
             ("folded over the data-, context- and tensor-parallel ranks, as in autopar "
              "(Megatron-Core's MoE Parallel Folding)" if c.experts_fold_tp else
              "carved from the data- and context-parallel ranks, as in autopar")
             if c.ep > 1 else ""),
        _expert_tp(plan),
        _zero(plan),
        Item("config.micro_batch", str(c.micro_batch), (("micro_batch_size", c.micro_batch),),
             Fit.EXACT),
        Item("config.num_microbatches", str(plan.estimate.num_microbatches), (), Fit.EXACT,
             "derived by Megatron: global batch / (micro batch * dp)"),
        *_pipeline(plan, shape),
        Item("config.sequence_parallel", str(c.sequence_parallel),
             (("sequence_parallel", c.sequence_parallel),), Fit.EXACT),
        _checkpoint(plan, shape),
        _offload(plan),
        _fusions(plan),
        Item("train.global_batch", str(t.global_batch), (("global_batch_size", t.global_batch),),
             Fit.EXACT),
        Item("train.seq_len", str(t.seq_len), (("seq_length", t.seq_len),), Fit.EXACT),
        _precision(plan),
        _grad_dtype(plan),
        _optimizer(plan),
    ]
    return items + _shape_items(shape, c.tp, allow_approximate)


def _grad_dtype(plan: Plan) -> Item:
    """``train.grad_dtype``: Megatron-LM accumulates and reduces the gradients in fp32 under
    ``--bf16`` by default (``accumulate_allreduce_grads_in_fp32``), in bf16 with
    ``--grad-reduce-in-bf16``; in fp16 under ``--fp16`` by default, in fp32 with
    ``--accumulate-allreduce-grads-in-fp32``. bf16-pure and fp32 plans have none of their own."""
    t = plan.train
    value = str(t.grad_dtype)
    fp32 = t.grad_dtype is GradDtype.FP32
    if t.precision is Precision.FP16:
        return Item("train.grad_dtype", value,
                    (("accumulate_allreduce_grads_in_fp32", True),) if fp32 else (), Fit.EXACT,
                    "gradients accumulated and reduced in " + value
                    + ("" if fp32 else " (Megatron's default under --fp16)"))
    if t.precision not in (Precision.BF16, Precision.FP8):
        return Item("train.grad_dtype", f"{value} (unused)", (), Fit.EXACT,
                    "read only under bf16, fp8 and fp16: see train.precision's row")
    if not fp32:
        return Item("train.grad_dtype", value, (("grad_reduce_in_bf16", True),), Fit.EXACT,
                    "the gradient buffer accumulated and reduced in bf16")
    return Item("train.grad_dtype", value, (), Fit.EXACT,
                "Megatron-LM's default under --bf16: gradients accumulated and reduced in fp32")


def _zero(plan: Plan) -> Item:
    z = plan.config.zero
    value = str(z)
    if z == 0:
        return Item("config.zero", value, (("use_distributed_optimizer", False),
                                           ("use_megatron_fsdp", False)), Fit.EXACT,
                    "Megatron's DDP: gradients all-reduced, states replicated")
    if z == 1:
        return Item("config.zero", value, (("use_distributed_optimizer", True),
                                           ("use_megatron_fsdp", False)), Fit.EXACT,
                    "the distributed optimizer: fp32 main weights and optimizer states sharded "
                    "over the data-parallel ranks, gradients reduce-scattered")
    strategy = "optim_grads" if z == 2 else "optim_grads_params"
    return Item("config.zero", value, (("use_megatron_fsdp", True),
                                       ("data_parallel_sharding_strategy", strategy),
                                       ("ckpt_format", "fsdp_dtensor")),
                Fit.EXACT, "Megatron-FSDP (version 1 turns the distributed optimizer on; it "
                "saves only the fsdp_dtensor checkpoint format, and needs "
                "CUDA_DEVICE_MAX_CONNECTIONS unset, which the script does)")


def layout_string(chunks: list[int]) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for chunks in layer order: the embedding
    (``E``) on the first, the loss (``L``) on the last, ``t`` a transformer layer."""
    parts = [("t" * n) for n in chunks]
    parts[0] = "E" + parts[0]
    parts[-1] += "L"
    return "|".join(parts)


def _pipeline(plan: Plan, shape: ModelShape | None) -> list[Item]:
    c = plan.config
    schedule = c.schedule
    if c.pp == 1:
        note = "no pipeline (pp = 1)"
        sched = Item("config.schedule", str(schedule), (), Fit.EXACT, note)
    elif schedule is Schedule.GPIPE:
        sched = Item("config.schedule", str(schedule), (), Fit.CLOSE,
                     "Megatron-LM has no GPipe schedule and runs 1F1B: the same bubble, with at "
                     "most pp micro-batches in flight instead of all of them, so less "
                     "activation memory than the plan's")
    else:
        sched = Item("config.schedule", str(schedule), (), Fit.EXACT,
                     "Megatron's interleaved 1F1B" if schedule is Schedule.INTERLEAVED
                     else "Megatron's default 1F1B (PipeDream-Flush)")
    chunks = stage_chunks(plan.stage_blocks, c.virtual_stages)
    dense = shape.first_k_dense if shape is not None and c.pp > 1 else 0
    if dense:  # DeepSeek's dense layers: the first stage runs them before its blocks
        chunks[0] += dense
    v = c.virtual_stages
    blocks = str(list(plan.stage_blocks))
    if len(set(chunks)) == 1:
        if v > 1:
            virtual = Item("config.virtual_stages", str(v),
                           (("num_layers_per_virtual_pipeline_stage", chunks[0]),), Fit.EXACT,
                           f"{chunks[0]} layers per chunk, {v} chunks per pipeline rank")
        else:
            virtual = Item("config.virtual_stages", str(v), (), Fit.EXACT)
        stages = Item("stage_blocks", blocks, (), Fit.EXACT,
                      "Megatron's even split" if c.pp > 1 else "")
        return [sched, virtual, stages]
    layout = layout_string(chunks)
    virtual = Item("config.virtual_stages", str(v), (), Fit.EXACT,
                   f"in the layout: {len(chunks)} chunks over pp = {c.pp}")
    stages = Item("stage_blocks", blocks, (("pipeline_model_parallel_layout", layout),),
                  Fit.EXACT, f"uneven chunks {chunks} (layer order), embedding on the first, "
                  "loss on the last"
                  + (f"; the first chunk's count includes the {dense} dense layers the plan's "
                     "first stage runs before its blocks" if dense else ""))
    return [sched, virtual, stages]


def _checkpoint(plan: Plan, shape: ModelShape | None) -> Item:
    c = plan.config
    value = checkpoint_text(c.checkpoint)
    moe = shape is not None and shape.num_experts > 0
    if isinstance(c.checkpoint, Checkpoint):
        policy = c.checkpoint
        if policy is Checkpoint.NONE:
            return Item("config.checkpoint", value, (("recompute_granularity", None),),
                        Fit.EXACT, "nothing recomputed")
        if policy is Checkpoint.FULL:
            return Item("config.checkpoint", value, _FULL_ALL, Fit.EXACT,
                        "every layer recomputed from its input")
        if policy is Checkpoint.MOE:
            return _moe_layers(value, shape)
        if policy is Checkpoint.SELECTIVE:
            return Item("config.checkpoint", value, _CORE_ATTN, Fit.EXACT,
                        "the attention core recomputed, every other activation kept "
                        "(Korthikanti et al. 2022; with fused attention nothing is recomputed, "
                        "as in the plan)")
        return _matmuls(value, moe)
    policies = c.checkpoint
    if any(p in policies for p in (Checkpoint.MATMULS, Checkpoint.SELECTIVE, Checkpoint.MOE)):
        return Item("config.checkpoint", value, _FULL_ALL, Fit.CLOSE,
                    "Megatron cannot mix selective and full recomputation, or selective and "
                    "none, across layers: every layer recomputed in full, so less activation "
                    "memory and more recompute time than the plan's")
    n, exact = _first_full_per_chunk(policies, stage_chunks(plan.stage_blocks,
                                                            c.virtual_stages))
    if n == 0:
        return Item("config.checkpoint", value, (), Fit.EXACT, "nothing recomputed")
    settings = (("recompute_granularity", "full"), ("recompute_method", "block"),
                ("recompute_num_layers", n))
    if exact:
        return Item("config.checkpoint", value, settings, Fit.EXACT,
                    f"the first {n} layer(s) of each pipeline chunk recomputed in full")
    return Item("config.checkpoint", value, settings, Fit.CLOSE,
                f"Megatron recomputes the first N layers of each chunk; N = {n}, the most "
                "any chunk of the plan recomputes, so no less is recomputed than planned")


_FULL_ALL: tuple[Setting, ...] = (("recompute_granularity", "full"),
                                  ("recompute_method", "uniform"), ("recompute_num_layers", 1))


_CORE_ATTN: tuple[Setting, ...] = (("recompute_granularity", "selective"),
                                   ("recompute_modules", ["core_attn"]))


def _moe_layers(value: str, shape: ModelShape | None) -> Item:
    """``moe``: Megatron-Core's ``--recompute-modules moe`` checkpoints its ``MoELayer``
    (router, dispatch, experts, combine, and the shared experts it holds)."""
    settings = (("recompute_granularity", "selective"), ("recompute_modules", ["moe"]))
    if shape is not None and shape.shared_expert_size > 0:
        return Item("config.checkpoint", value, settings, Fit.CLOSE,
                    "each MoE layer recomputed from its input; Megatron's MoE layer holds the "
                    "shared experts and recomputes them with it, where the plan keeps their "
                    "activations (they sit beside the layer here): less activation memory, "
                    "more recompute than planned")
    return Item("config.checkpoint", value, settings, Fit.EXACT,
                "each MoE layer (router, dispatch, experts, combine) recomputed from its input, "
                "every other activation kept")


def _matmuls(value: str, moe: bool) -> Item:
    modules = ["core_attn", "layernorm"] + (["moe_act"] if moe else [])
    note = ("Megatron recomputes the listed modules (the attention core and the norms"
            + (", and the experts' activation, which needs --moe-grouped-gemm" if moe else "")
            + "); autopar's matmuls also recomputes the MLP's activation, RoPE and dropout, "
            "which Megatron keeps: more activation memory than the plan's")
    return Item("config.checkpoint", value,
                (("recompute_granularity", "selective"), ("recompute_modules", modules)),
                Fit.CLOSE, note)


def _first_full_per_chunk(policies: tuple[Checkpoint, ...], chunks: list[int]
                          ) -> tuple[int, bool]:
    """(N, exact): the most blocks any chunk recomputes in full, and whether every chunk
    recomputes exactly its first min(N, size) blocks (what ``--recompute-method block`` does)."""
    starts = [sum(chunks[:i]) for i in range(len(chunks))]
    full = [[p is Checkpoint.FULL for p in policies[s:s + n]] for s, n in zip(starts, chunks)]
    n = max(sum(chunk) for chunk in full)
    exact = all(chunk == [i < n for i in range(len(chunk))] for chunk in full)
    return n, exact


def _offload(plan: Plan) -> Item:
    c = plan.config
    if not c.offload:
        return Item("config.offload", "False", (), Fit.EXACT)
    if c.zero == 0:
        raise refuse("the plan offloads the optimizer with ZeRO-0; Megatron-LM's optimizer CPU "
                     "offload lives in its distributed optimizer", where="config.offload",
                     fix="re-plan with zero >= 1 (e.g. --zero 1 --offload)")
    return Item("config.offload", "True",
                (("optimizer_cpu_offload", True), ("use_precision_aware_optimizer", True),
                 ("optimizer_offload_fraction", 1.0)), Fit.EXACT,
                "optimizer states and fp32 main weights in CPU memory, the step on the CPU")


def _expert_tp(plan: Plan) -> Item:
    """Megatron-Core's expert tensor parallelism defaults to the attention's tp; the plan's is
    set explicitly (1: whole experts, each tp rank routing its own sequence shard)."""
    c = plan.config
    fit = Fit.EXACT if c.experts_fold_tp or c.tp == 1 or c.ep == 1 else Fit.CLOSE
    return Item("config.etp", str(c.etp), (("expert_tensor_parallel_size", c.etp),), fit,
                "" if fit is Fit.EXACT else
                "without sequence parallelism autopar's tp ranks each run their dp rank's "
                "experts whole on the same tokens; Megatron-Core requires sequence parallelism "
                "for a mixture of experts under tp and folds the experts over the tp ranks")


MOE_SETTINGS: dict[str, tuple[Setting, ...]] = {
    MOE_PERMUTE: (("moe_permute_fusion", True), ("moe_grouped_gemm", True)),
    DEEPEP: (("moe_token_dispatcher_type", "flex"), ("moe_flex_dispatcher_backend", "deepep")),
    EP_A2A_OVERLAP: (("overlap_moe_expert_parallel_comm", True),),
}
"""Megatron-LM's switches for the MoE engines' features autopar prices (``MOE_FUSIONS``)."""


def _fusions(plan: Plan) -> Item:
    fusions = plan.config.fusions
    settings: tuple[Setting, ...] = ()
    if "linear_cross_entropy" in fusions:
        settings = (("cross_entropy_loss_fusion", True),)
    settings = (*settings, ("tp_comm_overlap", ASYNC_TP in fusions))
    for name in fusions:
        settings = (*settings, *MOE_SETTINGS.get(name, ()))
    return Item("config.fusions", ", ".join(fusions) or "none", settings, Fit.CLOSE,
                "Megatron-LM applies its own fused kernels by default (bias-GELU or SwiGLU, "
                "bias-dropout-add, masked softmax, RoPE, Transformer Engine's norms); autopar's "
                "kernels are not chosen one by one"
                + ("; --cross-entropy-loss-fusion fuses the loss, not the head's GEMM"
                   if "linear_cross_entropy" in fusions else "")
                + ("; --tp-comm-overlap overlaps the sequence-parallel collectives with the "
                   "GEMMs through Transformer Engine's userbuffers, where autopar's async_tp "
                   "is PyTorch's micro-pipeline TP: the same overlap, another implementation"
                   if ASYNC_TP in fusions else ""))


def _precision(plan: Plan) -> Item:
    from autopar.models.training import LOSS_SCALING

    p = plan.train.precision
    if p is Precision.BF16:
        return Item("train.precision", str(p), (("bf16", True),), Fit.EXACT,
                    "bf16 compute on fp32 main weights")
    if p is Precision.FP16:
        return Item("train.precision", str(p),
                    (("fp16", True), ("initial_loss_scale", LOSS_SCALING["init_scale"]),
                     ("loss_scale_window", LOSS_SCALING["growth_interval"]),
                     ("hysteresis", 1)),
                    Fit.EXACT,
                    "dynamic loss scaling as autopar's engine runs it: from 2^16, halved at "
                    "every overflow (the step skipped), doubled after 2000 clean steps")
    if p is Precision.FP32:
        return Item("train.precision", str(p), (), Fit.EXACT, "Megatron-LM's default")
    if p is Precision.FP8:
        tensorwise = plan.train.fp8_recipe is Fp8Recipe.TENSORWISE
        gather = tensorwise and plan.config.zero >= 1
        settings: tuple[tuple[str, object], ...] = (
            ("bf16", True), ("fp8", "hybrid"),
            ("fp8_recipe", "tensorwise" if tensorwise else "blockwise"))
        if gather:
            settings += (("fp8_param_gather", True),)
        recipe = ("current per-tensor scales ('tensorwise')" if tensorwise else
                  "1 x 128 block scales ('blockwise', DeepSeek-V3's): Megatron has no per-row "
                  "recipe, this is the nearest finer-than-tensor one")
        return Item("train.precision", f"{p} ({plan.train.fp8_recipe})", settings, Fit.CLOSE,
                    "Transformer Engine runs the FP8 GEMMs (e4m3 forward, e5m2 gradients: "
                    f"'hybrid') with {recipe}"
                    + ("; the weights all-gathered in FP8 (--fp8-param-gather)" if gather
                       else "")
                    + "; TE converts every TransformerEngine linear of the layers, experts "
                    "included, where autopar's plan keeps routers and experts in bf16")
    raise refuse("precision bf16-pure keeps no fp32 master weights; Megatron-LM and "
                 "Megatron-Bridge keep their main parameters in fp32 or fp16 "
                 "(--main-params-dtype), never bf16",
                 where="train.precision",
                 fix="re-plan with --precision bf16 (fp32 master weights), or export to "
                     "torchtitan, whose training.dtype bfloat16 is this policy")


def _optimizer(plan: Plan) -> Item:
    o = plan.train.optimizer
    if o is Optimizer.SGD:
        return Item("train.optimizer", str(o), (("optimizer", "sgd"),), Fit.EXACT)
    if o is Optimizer.ADAMW:
        return Item("train.optimizer", str(o), (("optimizer", "adam"),), Fit.EXACT,
                    "Megatron's adam applies decoupled weight decay: AdamW")
    return Item("train.optimizer", str(o), (("optimizer", "adam"),), Fit.CLOSE,
                "Megatron's adam is AdamW (decoupled weight decay, not L2 in the gradient); the "
                "same states and time")


LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
"""The Llama 3.x rotary scaling Megatron-LM's ``--use-rope-scaling`` applies, its factor aside
(``megatron/core/models/common/embeddings/rotary_pos_embedding.py``: ``apply_rope_scaling``'s
fixed arguments)."""


def _rope_settings(scaling: tuple[tuple[str, object], ...]) -> tuple[tuple[Setting, ...], str]:
    """Megatron's switches for a model's rotary scaling (``ModelShape.rope_scaling``), and
    where they cannot express it the words saying what is not carried (else "")."""
    if not scaling:
        return (), ""
    fields = dict(scaling)
    if fields.get("rope_type") == "llama3" and all(
            float(fields.get(k, -1)) == v for k, v in LLAMA3_ROPE.items()):
        return ((("use_rope_scaling", True),
                 ("rope_scaling_factor", float(fields.get("factor", 8.0)))), "")
    return (), (f"the rotary scaling {fields} is not carried: Megatron's --use-rope-scaling is "
                "Llama 3.x's with its fixed frequency factors")


def kv_channels(s: ModelShape) -> tuple[Setting, ...]:
    """``--kv-channels`` where a head is not ``hidden_size / num_heads`` wide (Qwen3's 128 over
    2048 / 32), which Megatron derives otherwise; latent attention sizes its heads itself."""
    if s.mla or not s.head_size or s.head_size * s.num_heads == s.hidden_size:
        return ()
    return (("kv_channels", s.head_size),)


def _shape_items(shape: ModelShape | None, tp: int, allow_approximate: bool = False
                 ) -> list[Item]:
    if shape is None:
        return [Item("model", "not recorded", (), Fit.NONE,
                     "the plan's model is a factory or unknown: add --num-layers, --hidden-size, "
                     "--num-attention-heads, --ffn-hidden-size and your model's switches")]
    s = shape
    items = [Item("model.num_layers", str(s.num_layers), (("num_layers", s.num_layers),),
                  Fit.EXACT),
             Item("model.hidden_size", str(s.hidden_size), (("hidden_size", s.hidden_size),),
                  Fit.EXACT),
             Item("model.ffn_hidden_size", str(s.ffn_hidden_size),
                  (("ffn_hidden_size", s.ffn_hidden_size),), Fit.EXACT),
             Item("model.num_heads", str(s.num_heads), (("num_attention_heads", s.num_heads),
                                                        *kv_channels(s)), Fit.EXACT)]
    if s.num_kv_heads != s.num_heads:
        items.append(Item("model.num_kv_heads", str(s.num_kv_heads),
                          (("group_query_attention", True), ("num_query_groups", s.num_kv_heads)),
                          Fit.EXACT))
    items.append(Item("model.vocab_size", str(s.vocab_size), (("vocab_size", s.vocab_size),),
                      Fit.CLOSE, f"Megatron pads the vocabulary to a multiple of 128 * tp = "
                      f"{128 * tp} (--make-vocab-size-divisible-by); the tokenizer sets it "
                      "unless --vocab-size is used with the NullTokenizer"))
    items.append(Item("model.max_positions", str(s.max_positions),
                      (("max_position_embeddings", s.max_positions),), Fit.EXACT))
    if s.gated:
        arch: tuple[Setting, ...] = (("swiglu", True), ("normalization", "RMSNorm"),
                                     ("position_embedding_type", "rope"),
                                     ("add_bias_linear", False))
        if s.rope_theta:
            arch += (("rotary_base", int(s.rope_theta)),)
        note = "SwiGLU, RMSNorm, RoPE, no biases"
        if s.qkv_bias:
            arch += (("add_qkv_bias", True),)
            note = "SwiGLU, RMSNorm, RoPE, biases on q, k and v only"
        if s.qk_norm:
            arch += (("qk_layernorm", True),)
            note += ", RMSNorm on q and k"
        if s.norm_eps:
            arch += (("norm_epsilon", s.norm_eps),)
        if s.mla:  # DeepSeek's attention; autopar's runs plain RoPE, Megatron's MLA YaRN
            mla = dict(s.mla)
            arch += (("multi_latent_attention", True), ("rope_type", "rope"),
                     *((("q_lora_rank", mla["q_lora_rank"]),) if mla["q_lora_rank"] else ()),
                     ("kv_lora_rank", mla["kv_lora_rank"]),
                     ("qk_head_dim", mla["qk_nope_head_dim"]),
                     ("qk_pos_emb_head_dim", mla["qk_rope_head_dim"]),
                     ("v_head_dim", mla["v_head_dim"]))
            note += ", multi-head latent attention"
        scaling, missed = _rope_settings(s.rope_scaling)
        arch += scaling
    else:
        arch = (("normalization", "LayerNorm"), ("position_embedding_type", "learned_absolute"))
        note = "GELU, LayerNorm, learned positions, biases (Megatron's GPT defaults)"
        missed = ""
    if not s.tied:
        arch += (("untie_embeddings_and_output_weights", True),)
    if s.unmapped:
        what = "; ".join(s.unmapped)
        if not allow_approximate:
            raise refuse(f"the model's {what}: Megatron's switches written here would run "
                         "another model", where="model",
                         fix="export with --allow-approximate to write the Llama-style "
                             "switches anyway (the README then says what differs), or "
                             "export to autopar's own format")
        items.append(Item("model.family", s.family, arch, Fit.NONE,
                          f"written as Llama's ({note}); not carried: {what}"))
    else:
        items.append(Item("model.family", s.family, arch, Fit.CLOSE if missed else Fit.EXACT,
                          f"{note}; {missed}" if missed else note))
    if s.num_experts:
        moe: tuple[Setting, ...] = (("num_experts", s.num_experts), ("moe_router_topk", s.top_k))
        if s.capacity_factor is None:
            fit, note = Fit.EXACT, "dropless in both (Megatron's default)"
        else:
            moe += (("moe_expert_capacity_factor", s.capacity_factor),)
            fit, note = Fit.CLOSE, ("capacity per expert in both; Megatron drops by routing "
                                    "probability (--moe-token-drop-policy probs), autopar by "
                                    "position, all first choices before any second")
        # each expert's width, always: a recipe's own (Bridge) would stay otherwise
        moe += (("moe_ffn_hidden_size", s.moe_ffn_hidden_size or s.ffn_hidden_size),)
        if s.shared_expert_size:
            moe += (("moe_shared_expert_intermediate_size", s.shared_expert_size),)
        if s.aux_loss_coef:  # Switch's loss over the tokens of a call in both
            moe += (("moe_router_load_balancing_type", "aux_loss"),
                    ("moe_aux_loss_coeff", s.aux_loss_coef))
        if s.first_k_dense:
            pattern = f"([0]*{s.first_k_dense}+[1]*{s.num_layers - s.first_k_dense})"
            moe += (("moe_layer_freq", pattern),)
        items.append(Item("model.num_experts", f"{s.num_experts} (top {s.top_k})", moe, fit,
                          note + "; softmax over the top-k logits (Megatron: "
                          "--moe-router-pre-softmax off, the same)"))
    return items


def flag_of(name: str) -> str:
    """The command-line flag that sets Megatron config field ``name`` (``FLAG_OF``, else the
    name with dashes)."""
    return FLAG_OF.get(name, "--" + name.replace("_", "-"))


def flags(settings: Iterable[Setting]) -> list[str]:
    """Command-line words of Megatron config settings: a switch off or a field unset (``None``)
    is Megatron's default, and writes no word (but for the negative flags of ``FLAG_OF``)."""
    out: list[str] = []
    for name, value in settings:
        if value is None:
            continue
        flag = flag_of(name)
        if isinstance(value, bool):
            if value or name in FLAG_OF:
                out.append(flag)
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        else:
            out += [flag, _number(value)]
    return out


def _number(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return str(value)


def _connections(plan: Plan) -> list[str]:
    """``CUDA_DEVICE_MAX_CONNECTIONS`` as ``validate_args`` wants it: unset under
    Megatron-FSDP (ZeRO-2/3), which refuses 1; 1 otherwise, which keeps the tensor- and
    context-parallel collectives in issue order before Blackwell."""
    if plan.config.zero >= 2:
        return ["unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP refuses 1"]
    return ["export CUDA_DEVICE_MAX_CONNECTIONS=1"]


def export(plan: Plan, allow_approximate: bool = False) -> Export:
    """``megatron_args.sh``: the arguments as a bash array a launch script passes on
    (``megatron_items``)."""
    items = megatron_items(plan, allow_approximate)
    rows = {i.field: Row(i.field, i.value, " ".join(flags(i.settings)), i.fit, i.note)
            for i in items}
    lines = [f"# autopar plan for {plan.model}: {plan.summary()}",
             f"# {plan.nodes} node(s) x {plan.gpus_per_node} GPUs of {plan.cluster}; see "
             "README.md for what maps exactly and what does not.",
             "# Source it, then add your data, tokenizer and schedule arguments, e.g.",
             "#   source megatron_args.sh",
             "#   torchrun \"${TORCHRUN_ARGS[@]}\" pretrain_gpt.py \"${MEGATRON_ARGS[@]}\" "
             "--data-path ... --tokenizer-type ... --train-iters ... --lr ...",
             *_connections(plan),
             f"TORCHRUN_ARGS=(--nnodes {plan.nodes} --nproc-per-node {plan.gpus_per_node})",
             "MEGATRON_ARGS=("]
    for item in items:
        words = flags(item.settings)
        if words:
            lines.append(f"    {' '.join(shlex.quote(w) for w in words)}  # {item.field}")
    lines.append(")")
    usage = f"""`{SCRIPT}` sets two bash arrays: `TORCHRUN_ARGS` ({plan.nodes} node(s) x
{plan.gpus_per_node} processes) and `MEGATRON_ARGS` (parallelism, batch, precision,
recomputation and the model's shape). On each node:

    source {SCRIPT}
    torchrun "${{TORCHRUN_ARGS[@]}}" --node-rank $NODE_RANK --master-addr $MASTER_ADDR \\
        pretrain_gpt.py "${{MEGATRON_ARGS[@]}}" --data-path ... --tokenizer-type ... \\
        --train-iters ... --lr ...

Data, tokenizer, learning-rate schedule and checkpoint paths are yours to add: the plan does not
decide them."""
    return Export("Megatron-LM", {SCRIPT: "\n".join(lines) + "\n"}, plan_rows(plan, rows),
                  SOURCE, usage, frozenset({SCRIPT}))
