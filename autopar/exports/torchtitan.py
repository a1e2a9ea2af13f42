"""A plan as a torchtitan job config: a ``Trainer.Config`` function, and its JSON.

torchtitan's configurations are Python functions returning a ``Trainer.Config`` (they replaced
the TOML files in 2026), selected with ``--module`` and ``--config``. Written for torchtitan
0.3.0 (PyPI, 2026-09), the release users install: its ``TrainingConfig`` and
``ParallelismConfig`` (``local_batch_size``, ``global_batch_size``, ``seq_len``,
``pipeline_parallel_microbatch_size``; a later main counts tokens instead) and its trainer's
checks (``disable_cuda_graphs`` under pipelining). The other names read from
pytorch/torchtitan at b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (2026-08-21), the same in 0.3.0:
``torchtitan/config/configs.py`` (``TrainingConfig``, ``ParallelismConfig``),
``torchtitan/trainer.py`` (``Trainer.Config``, its ``to_dict`` that ``debug.save_config_file``
writes, the gradient accumulation it derives), ``torchtitan/distributed/activation_checkpoint.py``
(``FullAC``, ``SelectiveAC``), ``torchtitan/distributed/pipeline_parallel.py`` (the module names
of a model chunk), ``torchtitan/components/optimizer/optimizer.py``,
``torchtitan/components/loss.py`` (``CrossEntropyLoss``) and
``torchtitan/models/llama3/__init__.py`` (``model_registry`` flavors). The test fixture
``tests/data/torchtitan_config_fields.json`` holds those classes' fields.

autopar's engine is torchtitan's composition (FSDP2 on a ``dp_replicate`` x ``dp_shard`` mesh,
DTensor tensor parallelism, ``torch.distributed.pipelining`` schedules), so most fields map
exactly:

=====================  ==============================================================  =======
plan field             torchtitan                                                      fit
=====================  ==============================================================  =======
dp, zero               zero 0: ``data_parallel_replicate_degree`` = dp; 1-3:            exact /
                       ``data_parallel_shard_degree`` = dp, ``fsdp_reshard_after_        close
                       forward`` never (1, 2) / always (3); ZeRO-1 without pipelining
                       reduce-scatters every accumulation step (close)
tp, sequence_parallel  ``tensor_parallel_degree``, ``enable_sequence_parallel``          exact
pp, schedule           ``pipeline_parallel_degree``, ``pipeline_parallel_schedule``       exact
                       1F1B / GPipe / Interleaved1F1B (torch's classes, as autopar's)
virtual_stages,        ``module_fqns_per_model_part``: each chunk's modules              exact
stage_blocks
cp, ep                 ``context_parallel_degree``, ``expert_parallel_degree``           exact
                       (ep with ZeRO-0 refused: torchtitan carves experts from the
                       sharded ranks; ep with tp but no sequence parallelism refused: its
                       ep groups take the tp ranks first)
micro_batch, seq_len,  ``local_batch_size``, ``global_batch_size``, ``seq_len``,            exact
global_batch,          ``pipeline_parallel_microbatch_size`` (accumulation is derived;
num_microbatches       under pipelining local = micro-batches x micro-batch size);
                       ``disable_cuda_graphs`` (autopar's engine runs none)
checkpoint             none: ``None``; full: ``FullAC``; selective and matmuls:           exact /
                       ``SelectiveAC`` (another policy: saves every second matmul);     close
                       moe: ``FullAC`` (no MoE-layer-only AC); per block: one policy
                       for all
offload                ``enable_cpu_offload`` (FSDP2 offloads parameters and gradients  close
                       too); refused with ZeRO-0
precision              bf16: ``mixed_precision_param`` bfloat16; fp32: float32;          exact /
                       bf16-pure: ``dtype`` bfloat16; fp16 refused (no fp16 policy)      refused
optimizer              AdamW (``default_adamw``), Adam (a param group); SGD refused      exact
model                  ``model_registry`` of the llama3 flavor of the same shape, else   exact /
                       none                                                              none
loss                   ``CrossEntropyLoss.Config`` with the vocabulary (the whole         exact /
                       logits, as autopar's engine; ``Trainer.Config``'s default          close
                       ``BaseLoss`` is abstract, its trainer cannot build it); close
                       under the plan's linear_cross_entropy kernel (no whole logits)
fusions                none: torchtitan's kernels come with its model and compile        none
precision fp8,         ``compile``: ``CompileConfig(enable=True)``, with                  close
async_tp               ``enable_async_tensor_parallel`` for async TP; the float8
                       converter's ``model_compile_enabled``
=====================  ==============================================================  =======
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from autopar.core.estimate import checkpoint_text
from autopar.core.model_spec import ModelSpec
from autopar.core.plan import Plan
from autopar.core.specs import (ASYNC_TP, Checkpoint, Fp8Recipe, GradDtype, Optimizer, Precision,
                                Schedule)
from autopar.core.stages import stage_chunks
from autopar.exports.mapping import Export, Fit, Row, plan_rows, refuse
from autopar.models.shape import ModelShape, model_shape

SOURCE = ("torchtitan 0.3.0 (PyPI): torchtitan/config/configs.py, torchtitan/trainer.py, "
          "torchtitan/distributed/activation_checkpoint.py, "
          "torchtitan/distributed/pipeline_parallel.py (the same names at "
          "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a but for the batch fields)")
MODULE = "autopar_plan.py"
JSON = "autopar_plan_config.json"
FUNCTION = "autopar_plan"

SCHEDULES = {Schedule.ONE_F_ONE_B: "1F1B", Schedule.GPIPE: "GPipe",
             Schedule.INTERLEAVED: "Interleaved1F1B"}
"""autopar's schedule -> the ``torch.distributed.pipelining`` class name torchtitan takes."""
LLAMA3_FLAVORS = {
    "8B": dict(num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
               ffn_hidden_size=14336, vocab_size=128256),
    "70B": dict(num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8,
                ffn_hidden_size=28672, vocab_size=128256),
    "405B": dict(num_layers=126, hidden_size=16384, num_heads=128, num_kv_heads=8,
                 ffn_hidden_size=53248, vocab_size=128256),
}
"""torchtitan's llama3 flavors (``torchtitan/models/llama3/__init__.py``: ``_8b``, ``_70b``,
``_405b``), in autopar's field names."""
SELECTIVE_AC = {"preserve_rng_state": True, "determinism_check": "default", "debug": False,
                "force_recompute_mm_shapes_by_fqns": ["moe.router.gate"]}
FULL_AC = {"preserve_rng_state": True, "determinism_check": "default", "debug": False}
"""``SelectiveAC.Config().to_dict()`` and ``FullAC.Config().to_dict()``."""
FLOAT8_CONVERTER = ('Float8LinearConverter.Config(recipe_name="rowwise", '
                    'filter_fqns=["lm_head"], model_compile_enabled=True)')
"""torchtitan 0.3.0's float8 converter as the plan's fp8 needs it: the blocks' linears (the
filter keeps the head, ``lm_head`` in 0.3.0's decoders, in bf16; it matches by substring), and
compiled (``_compile``)."""


@dataclass(frozen=True)
class Titan:
    """The sections of ``Trainer.Config`` the plan sets (field -> value, as ``to_dict``
    writes them), and the Python of each value where it is not a literal."""

    training: dict[str, object]
    parallelism: dict[str, object]
    activation_checkpoint: dict[str, object] | None
    ac_class: str | None
    optimizer_name: str
    flavor: str | None
    converter: str | None = None
    """Python of the model converter the plan's precision needs (fp8: torchtitan's
    ``Float8LinearConverter.Config``), or ``None``."""
    loss: dict[str, object] = field(default_factory=dict)
    """``CrossEntropyLoss.Config``'s fields (the vocabulary, which its tensor-parallel loss
    needs), as ``to_dict`` writes them."""
    compile: dict[str, object] | None = None
    """``CompileConfig``'s fields where the plan needs ``torch.compile``: its float8 linears
    (eager they are slower than bf16, bench/results/fp8_linear.md) and async TP (torchtitan
    0.3.0's ``compile.enable_async_tensor_parallel``); ``None`` otherwise."""


def titan_config(plan: Plan) -> tuple[Titan, dict[str, Row]]:
    """The torchtitan settings of ``plan`` and the row of each plan field."""
    c, t = plan.config, plan.train
    m = plan.estimate.num_microbatches
    rows: dict[str, Row] = {}

    def row(name: str, value: object, target: str, fit: Fit, note: str = "") -> None:
        rows[name] = Row(name, str(value), target, fit, note)

    if c.ep > 1 and c.zero == 0:
        raise refuse(f"ep={c.ep} with ZeRO-0: torchtitan carves the expert-parallel ranks from "
                     "the sharded data-parallel ranks (dp_shard x cp x tp), and ZeRO-0 puts "
                     "autopar's dp on the replicate axis", where="config.ep",
                     fix="re-plan with --zero 1 or higher")
    if c.ep > 1 and c.tp > 1 and not c.experts_fold_tp:
        raise refuse(f"ep={c.ep} with tp={c.tp} and no sequence parallelism: torchtitan carves "
                     "the expert-parallel ranks from dp_shard x cp x tp, the tp ranks "
                     "innermost (its ep groups are neighbouring tp ranks), where the plan's "
                     "experts fold over the dp x cp ranks only, the tp ranks holding the same "
                     "tokens", where="config.ep",
                     fix="re-plan with sequence_parallel=True: the experts then fold over the "
                         "tp ranks too, as torchtitan's")
    if c.offload and c.zero == 0:
        raise refuse("the plan offloads the optimizer with ZeRO-0; torchtitan offloads through "
                     "FSDP2 (training.enable_cpu_offload), which needs sharded data "
                     "parallelism", where="config.offload", fix="re-plan with --zero 1 or higher")
    if t.precision is Precision.FP16:
        raise refuse("precision fp16: torchtitan's mixed precision is bfloat16 or float32 "
                     "(training.mixed_precision_param), with no loss scaling",
                     where="train.precision", fix="re-plan with --precision bf16")
    if t.optimizer is Optimizer.SGD:
        raise refuse("optimizer sgd: torchtitan's optimizers are Adam, AdamW and DistMuon, and "
                     "the plan's memory counts SGD's states", where="train.optimizer",
                     fix="re-plan with --optimizer adamw (or adam)")

    par: dict[str, object] = {}
    replicate, shard = (c.dp, 1) if c.zero == 0 else (1, c.dp)
    par["data_parallel_replicate_degree"] = replicate
    par["data_parallel_shard_degree"] = shard
    row("nodes x gpus_per_node", f"{plan.nodes} x {plan.gpus_per_node}",
        f"NGPU={plan.gpus_per_node} on {plan.nodes} node(s)", Fit.EXACT,
        "the world size is not in the config: it must equal the degrees' product")
    row("config.dp", c.dp, f"data_parallel_{'replicate' if c.zero == 0 else 'shard'}_degree = "
        f"{c.dp}", Fit.EXACT)
    if c.zero == 0:
        row("config.zero", 0, "data_parallel_shard_degree = 1", Fit.EXACT,
            "DDP: parameters, gradients and optimizer states replicated")
    else:
        policy = "always" if c.zero == 3 else "never"
        par["fsdp_reshard_after_forward"] = policy
        close = c.zero == 1 and c.pp == 1 and m > 1
        row("config.zero", c.zero, f"fsdp_reshard_after_forward = {policy}",
            Fit.CLOSE if close else Fit.EXACT,
            "FSDP2 as autopar's engine runs it" + (
                "; torchtitan reduce-scatters the gradients after every accumulation step "
                "where autopar's ZeRO-1 accumulates them whole and reduces once: more "
                "communication, less gradient memory" if close else ""))
    par["tensor_parallel_degree"] = c.tp
    par["enable_sequence_parallel"] = c.sequence_parallel
    row("config.tp", c.tp, f"tensor_parallel_degree = {c.tp}", Fit.EXACT)
    row("config.sequence_parallel", c.sequence_parallel,
        f"enable_sequence_parallel = {c.sequence_parallel}", Fit.EXACT,
        "torchtitan's default is on: written out" if not c.sequence_parallel else "")
    par["context_parallel_degree"] = c.cp
    row("config.cp", c.cp, f"context_parallel_degree = {c.cp}", Fit.EXACT,
        "as autopar's engine: llama3's FlexAttention all-gathers the keys and values over the "
        "cp ranks, the head-tail load balancer cuts the sequence in 2 x cp chunks"
        if c.cp > 1 else "")
    par["expert_parallel_degree"] = c.ep
    row("config.ep", c.ep, f"expert_parallel_degree = {c.ep}", Fit.EXACT)
    if c.etp == 1:
        row("config.etp", c.etp, "", Fit.EXACT, "every expert whole on its ep rank")
    else:  # torchtitan 0.3.0's parallelism fields have no expert tensor-parallel degree
        row("config.etp", c.etp, "", Fit.NONE, "torchtitan 0.3.0 has no expert tensor-parallel "
            "degree: export to Megatron-LM (--expert-tensor-parallel-size), or plan etp=1")
    _pipeline(plan, par, row)

    # torchtitan 0.3.0 (trainer.py): gradient accumulation = global_batch_size /
    # (local_batch_size * dp); under pipelining local_batch_size splits into
    # local / pipeline_parallel_microbatch_size pipeline micro-batches
    local = c.micro_batch * m if c.pp > 1 else c.micro_batch
    training: dict[str, object] = {
        "local_batch_size": local, "global_batch_size": t.global_batch, "seq_len": t.seq_len,
        # autopar's engine runs no CUDA graph (and torchtitan refuses them under pipelining)
        "disable_cuda_graphs": True}
    row("config.micro_batch", c.micro_batch,
        f"parallelism.pipeline_parallel_microbatch_size = {c.micro_batch}" if c.pp > 1
        else f"local_batch_size = {c.micro_batch}", Fit.EXACT)
    row("train.global_batch", t.global_batch, f"global_batch_size = {t.global_batch}",
        Fit.EXACT)
    row("train.seq_len", t.seq_len, f"seq_len = {t.seq_len}", Fit.EXACT)
    if c.pp > 1:
        row("config.num_microbatches", m, f"local_batch_size = {local} (= {m} x "
            f"{c.micro_batch})", Fit.EXACT,
            "one pipeline schedule run of local / micro-batch size micro-batches per step, no "
            "further accumulation")
    else:
        row("config.num_microbatches", m, "", Fit.EXACT,
            f"torchtitan derives {m} gradient accumulation step(s): global_batch_size / "
            "(local_batch_size x dp)")
    if c.offload:
        training["enable_cpu_offload"] = True
        row("config.offload", True, "training.enable_cpu_offload = true", Fit.CLOSE,
            "FSDP2's CPUOffloadPolicy offloads the parameters and gradients too, not only the "
            "optimizer states: less GPU memory, more host-device traffic than the plan's")
    else:
        row("config.offload", False, "", Fit.EXACT)
    p = t.precision
    if p is Precision.BF16:
        training.update(dtype="float32", mixed_precision_param="bfloat16",
                        mixed_precision_reduce="float32")
        no_fsdp = c.zero == 0 and c.cp == 1 and (c.tp > 1 or c.pp > 1)
        row("train.precision", p, "mixed_precision_param = bfloat16", Fit.CLOSE if no_fsdp
            else Fit.EXACT, "torchtitan applies mixed precision through fully_shard, or "
            "autocast under plain DDP: with ZeRO-0 and tp or pp it runs fp32"
            if no_fsdp else "bf16 compute, fp32 weights, fp32 gradient reduction")
    elif p is Precision.FP32:
        training.update(dtype="float32", mixed_precision_param="float32")
        row("train.precision", p, "mixed_precision_param = float32", Fit.EXACT)
    elif p is Precision.FP8:
        training.update(dtype="float32", mixed_precision_param="bfloat16",
                        mixed_precision_reduce="float32")
        tensorwise = t.fp8_recipe is Fp8Recipe.TENSORWISE
        row("train.precision", f"{p} ({t.fp8_recipe})",
            f"mixed_precision_param = bfloat16; model_registry(..., "
            f"converters=[{FLOAT8_CONVERTER}])",
            Fit.CLOSE if tensorwise else Fit.EXACT,
            ("torchtitan's float8 converter has only the rowwise recipes at this commit: the "
             "plan's tensorwise scales (and its FP8 weight all-gather) run as rowwise, bf16 "
             "all-gather" if tensorwise else "torchao's rowwise float8 linears")
            + "; torchtitan converts every linear whose dims are multiples of 16 but the "
            "head, 'lm_head' (its filter matches names by substring), as autopar's plan; the "
            "plan keeps the routers bf16 too")
    else:
        training.update(dtype="bfloat16")
        row("train.precision", p, "training.dtype = bfloat16", Fit.EXACT,
            "parameters, gradients and optimizer states in bf16, no fp32 copy")
    if p in (Precision.BF16, Precision.FP8):
        bf16_grads = t.grad_dtype is GradDtype.BF16
        row("train.grad_dtype", t.grad_dtype, 'mixed_precision_reduce = "float32"',
            Fit.CLOSE if bf16_grads else Fit.EXACT,
            "torchtitan 0.3.0 reduces in float32 only (its config's only choice): the "
            "gradient accumulators and their reduction take twice the bytes the plan priced"
            if bf16_grads else "gradients reduced in fp32")
    optimizer = "AdamW" if t.optimizer is Optimizer.ADAMW else "Adam"
    row("train.optimizer", t.optimizer, f"optimizer_name = {optimizer!r}", Fit.EXACT,
        "set your learning rate (LR in the module)")

    ac, ac_class = _checkpoint(plan, row)
    row("config.fusions", ", ".join(c.fusions) or "none", "", Fit.NONE,
        "torchtitan's kernels come with its model and torch.compile (compile.enable)")
    compile_config = _compile(plan, row)
    shape = model_shape(plan.model_spec or ModelSpec.zoo(plan.model))
    loss = _loss(plan, shape, row)
    flavor = _flavor(shape)
    label = plan.model_spec.label if plan.model_spec else plan.model
    if flavor:
        row("model", label, f'model_registry("{flavor}") of torchtitan.models.llama3',
            Fit.EXACT, "the same shape")
    else:
        row("model", label, "", Fit.NONE, "torchtitan has no model of this shape: set "
            "MODEL_SPEC in the module to a ModelSpec of yours")
    converter = FLOAT8_CONVERTER if p is Precision.FP8 else None
    return Titan(training, par, ac, ac_class, optimizer, flavor, converter, loss,
                 compile_config), rows


def _loss(plan: Plan, shape: ModelShape | None, row) -> dict[str, object]:
    """torchtitan 0.3.0's ``CrossEntropyLoss.Config`` of the plan's model: ``Trainer.Config``'s
    default ``loss`` is the abstract ``BaseLoss.Config``, which its trainer cannot build, and
    its vocabulary-parallel cross-entropy under tp needs the whole vocabulary's size."""
    fields: dict[str, object] = {}
    if shape is not None:
        fields["global_vocab_size"] = shape.vocab_size
    fused = "linear_cross_entropy" in plan.config.fusions
    row("loss", "cross-entropy", f"loss = CrossEntropyLoss.Config("
        f"{', '.join(f'{k}={v}' for k, v in fields.items())})", Fit.CLOSE if fused else Fit.EXACT,
        ("the whole logits, then the loss, where the plan's linear_cross_entropy kernel holds "
         "no whole logits: more memory than planned" if fused else
         "the whole logits, then the loss, as autopar's engine (torchtitan's own llama3 "
         "configs chunk it, ChunkedLossWrapper: less logits memory than planned)")
        + ("" if shape else "; set global_vocab_size to your vocabulary under tp"))
    return fields


def _compile(plan: Plan, row) -> dict[str, object] | None:
    """torchtitan 0.3.0's ``CompileConfig`` fields the plan needs: ``torch.compile`` of the
    model and the loss for float8 linears (torchtitan's float8 is built for it: eager, torchao's
    casts make an FP8 linear slower than bf16's, measured on an H200,
    bench/results/fp8_linear.md) and for async TP (micro-pipeline TP is an Inductor pass,
    ``enable_async_tensor_parallel`` lives in ``CompileConfig``); else ``None``."""
    async_tp = ASYNC_TP in plan.config.fusions
    needs = [why for why, on in (("the float8 linears", plan.train.precision is Precision.FP8),
                                 ("async TP", async_tp)) if on]
    if not needs:
        return None
    fields: dict[str, object] = {"enable": True}
    if async_tp:
        fields["enable_async_tensor_parallel"] = True
    row("compile", " and ".join(needs), ", ".join(f"compile.{k} = {v}" for k, v in fields.items()),
        Fit.CLOSE, "autopar's engine runs eager; torchtitan compiles the model and the loss")
    return fields


def _pipeline(plan: Plan, par: dict[str, object], row) -> None:
    c = plan.config
    par["pipeline_parallel_degree"] = c.pp
    row("config.pp", c.pp, f"pipeline_parallel_degree = {c.pp}", Fit.EXACT)
    if c.pp == 1:
        row("config.schedule", c.schedule, "", Fit.EXACT, "no pipeline (pp = 1)")
        row("config.virtual_stages", c.virtual_stages, "", Fit.EXACT)
        row("stage_blocks", list(plan.stage_blocks), "", Fit.EXACT)
        return
    name = SCHEDULES[c.schedule]
    par["pipeline_parallel_schedule"] = name
    par["pipeline_parallel_microbatch_size"] = c.micro_batch
    row("config.schedule", c.schedule, f"pipeline_parallel_schedule = {name!r}", Fit.EXACT,
        "the torch.distributed.pipelining schedule autopar's engine runs")
    chunks = stage_chunks(plan.stage_blocks, c.virtual_stages)
    parts, start = [], 0
    for i, n in enumerate(chunks):
        names = [f"layers.{b}" for b in range(start, start + n)]
        start += n
        if i == 0:
            names.insert(0, "tok_embeddings")
        if i == len(chunks) - 1:
            names += ["norm", "lm_head"]
        parts.append(names)
    par["module_fqns_per_model_part"] = parts
    row("config.virtual_stages", c.virtual_stages, f"{len(chunks)} model parts over "
        f"{c.pp} ranks", Fit.EXACT)
    row("stage_blocks", list(plan.stage_blocks),
        f"module_fqns_per_model_part: blocks per part {chunks}", Fit.EXACT,
        "the embedding on the first part, the norm and head on the last")


def _checkpoint(plan: Plan, row) -> tuple[dict[str, object] | None, str | None]:
    c = plan.config
    text = checkpoint_text(c.checkpoint)
    policy = c.checkpoint
    if isinstance(policy, tuple):
        most = next((p for p in (Checkpoint.FULL, Checkpoint.MOE, Checkpoint.MATMULS,
                                 Checkpoint.SELECTIVE) if p in policy), Checkpoint.NONE)
        if most is not Checkpoint.NONE:
            row("config.checkpoint", text, f"{_AC_NAME[most]} on every block", Fit.CLOSE,
                "torchtitan applies one policy to every block: the plan's most recomputing "
                "one, so less memory and more recompute than planned")
            return _AC[most], _AC_NAME[most]
        policy = Checkpoint.NONE
    if policy is Checkpoint.NONE:
        row("config.checkpoint", text, "activation_checkpoint = None", Fit.EXACT)
        return None, None
    if policy is Checkpoint.FULL:
        row("config.checkpoint", text, "FullAC.Config()", Fit.EXACT,
            "every block recomputed from its input")
        return FULL_AC, "FullAC"
    if policy is Checkpoint.MOE:
        row("config.checkpoint", text, "FullAC.Config()", Fit.CLOSE,
            "torchtitan checkpoints whole blocks, not the MoE layers alone: every block "
            "recomputed from its input, attention included, so less activation memory and "
            "more recompute than planned")
        return FULL_AC, "FullAC"
    if policy is Checkpoint.SELECTIVE:
        row("config.checkpoint", text, "SelectiveAC.Config()", Fit.CLOSE,
            "torchtitan's SelectiveAC (op mode) is another policy than Korthikanti et al.'s: "
            "it saves the matmul, attention and communication outputs but recomputes every "
            "second matmul and every other op (norms, activations); the plan's keeps every "
            "activation but the attention core's: less activation memory, more recompute than "
            "planned")
        return SELECTIVE_AC, "SelectiveAC"
    row("config.checkpoint", text, "SelectiveAC.Config()", Fit.CLOSE,
        "torchtitan's selective policy saves the matmul, attention and communication outputs "
        "but recomputes every second matmul; autopar's matmuls keeps every linear layer's "
        "output: less activation memory, more recompute than planned")
    return SELECTIVE_AC, "SelectiveAC"


_AC = {Checkpoint.FULL: FULL_AC, Checkpoint.MOE: FULL_AC, Checkpoint.MATMULS: SELECTIVE_AC,
       Checkpoint.SELECTIVE: SELECTIVE_AC}
_AC_NAME = {Checkpoint.FULL: "FullAC", Checkpoint.MOE: "FullAC", Checkpoint.MATMULS: "SelectiveAC",
            Checkpoint.SELECTIVE: "SelectiveAC"}


def _flavor(shape: ModelShape | None) -> str | None:
    """The llama3 flavor of the model's shape: a Llama block (no q/k/v biases or q/k norms,
    nothing ``ModelShape.unmapped``) of the same sizes; else None."""
    if (shape is None or not shape.gated or shape.num_experts or shape.unmapped
            or shape.qkv_bias or shape.qk_norm):
        return None
    for flavor, fields in LLAMA3_FLAVORS.items():
        if all(getattr(shape, k) == v for k, v in fields.items()):
            return flavor
    return None


def saved_config(plan: Plan, titan: Titan) -> dict[str, object]:
    """The fields the plan sets, nested as ``Trainer.Config.to_dict()`` writes them (what
    ``debug.save_config_file`` saves); torchtitan's file also holds every other field."""
    model = {"name": "llama3", "flavor": titan.flavor} if titan.flavor else None
    saved = {"model_spec": model, "training": titan.training,
             "parallelism": titan.parallelism,
             "loss": titan.loss,
             "activation_checkpoint": titan.activation_checkpoint,
             "optimizer": {"param_groups": [{"pattern": ".*",
                                             "optimizer_name": titan.optimizer_name}]}}
    if titan.compile:
        saved["compile"] = titan.compile
    return saved


def _py(value: object) -> str:
    return repr(value)


def module_text(plan: Plan, titan: Titan) -> str:
    """The Python module with the ``Trainer.Config`` function."""
    configs = "CompileConfig, ParallelismConfig" if titan.compile else "ParallelismConfig"
    imports = ["from torchtitan.components.loss import CrossEntropyLoss",
               "from torchtitan.components.optimizer import OptimizersContainer, "
               "ParamGroupConfig",
               f"from torchtitan.config import {configs}, TrainingConfig",
               "from torchtitan.trainer import Trainer"]
    if titan.ac_class:
        imports.append(f"from torchtitan.distributed.activation_checkpoint import "
                       f"{titan.ac_class}")
    if titan.converter:
        imports.append("from torchtitan.components.quantization import Float8LinearConverter")
    if titan.flavor:
        imports.append("from torchtitan.models.llama3 import model_registry")
        converters = f", converters=[{titan.converter}]" if titan.converter else ""
        model = f'model_registry("{titan.flavor}"{converters})'
    else:
        model = "None  # no torchtitan model of this shape: set your ModelSpec"
    training = ",\n            ".join(f"{k}={_py(v)}" for k, v in titan.training.items())
    par = ",\n            ".join(f"{k}={_py(v)}" for k, v in titan.parallelism.items())
    ac = f"{titan.ac_class}.Config()" if titan.ac_class else "None"
    loss = ", ".join(f"{k}={_py(v)}" for k, v in titan.loss.items())
    compiled = ""
    if titan.compile:
        fields = ", ".join(f"{k}={_py(v)}" for k, v in titan.compile.items())
        compiled = f"\n        compile=CompileConfig({fields}),"
    return f'''"""torchtitan configuration of autopar's plan for {plan.model}: {plan.summary()}

{plan.nodes} node(s) x {plan.gpus_per_node} GPUs of {plan.cluster}. Run from the torchtitan
repository with this file importable, e.g.

    NGPU={plan.gpus_per_node} MODULE=autopar_plan CONFIG={FUNCTION} ./run_train.sh

README.md says what maps exactly and what does not.
"""

{chr(10).join(imports)}

LR = 3e-4
"""Yours to set: the plan does not decide the learning rate (nor data, steps, schedule)."""
MODEL_SPEC = {model}


def {FUNCTION}() -> Trainer.Config:
    if MODEL_SPEC is None:
        raise ValueError("set MODEL_SPEC in {MODULE} to the torchtitan ModelSpec of your model")
    return Trainer.Config(
        model_spec=MODEL_SPEC,
        training=TrainingConfig(
            {training},
        ),
        parallelism=ParallelismConfig(
            {par},
        ),
        loss=CrossEntropyLoss.Config({loss}),
        activation_checkpoint={ac},{compiled}
        optimizer=OptimizersContainer.Config(
            param_groups=[ParamGroupConfig(pattern=r".*", optimizer_name="{titan.optimizer_name}",
                                           optimizer_kwargs={{"lr": LR}})],
        ),
    )
'''


def export(plan: Plan, allow_approximate: bool = False) -> Export:
    """``autopar_plan.py`` (the config function) and ``autopar_plan_config.json`` (its
    ``save_config_file`` fields). The model is a llama3 flavor of the same block or none
    (``_flavor``), so nothing is refused for its architecture (``allow_approximate``
    changes nothing)."""
    titan, rows = titan_config(plan)
    text = json.dumps(saved_config(plan, titan), indent=2) + "\n"
    usage = f"""`{MODULE}` defines `{FUNCTION}()`, a torchtitan `Trainer.Config`; put it where
Python finds it (the torchtitan repository root, or any package) and run

    NGPU={plan.gpus_per_node} MODULE=autopar_plan CONFIG={FUNCTION} ./run_train.sh

on each of the {plan.nodes} node(s) (torchrun's rendezvous as usual). Set `LR`, the data loader
and the steps: the plan does not decide them. `{JSON}` holds the same fields nested as
`Trainer.Config.to_dict()` writes them (`debug.save_config_file`): compare it with the file a
run saves; torchtitan's own file lists every other field too, at its defaults."""
    return Export("torchtitan", {MODULE: module_text(plan, titan), JSON: text},
                  plan_rows(plan, rows), SOURCE, usage)
