"""A plan as a DeepSpeed config JSON (``ds_config.json``).

Keys read from DeepSpeed 0.19.8 (PyPI ``deepspeed==0.19.8``): ``deepspeed/runtime/config.py``
(``DeepSpeedConfig``: the batch triple, ``pipeline``, ``tensor_parallel``, ``expert_parallel``),
``runtime/zero/config.py`` (``zero_optimization`` and its ``offload_optimizer``),
``runtime/precision_config.py`` (``bf16``, ``fp16`` and loss scaling),
``runtime/activation_checkpointing/config.py`` and ``runtime/pipe/engine.py`` (ZeRO-2/3 refused
under pipelining). The tests load every export with that ``DeepSpeedConfig``.

DeepSpeed's JSON configures its engine; the model, its pipeline split (``PipelineModule``) and
which blocks recompute are the training script's code, which the README shows.

=====================  ==============================================================  =======
plan field             DeepSpeed                                                       fit
=====================  ==============================================================  =======
dp, nodes x gpus       implied: train_batch_size = micro * accumulation * dp * tp        exact
                       (``counted_batch``: DeepSpeed counts the world, / pp under a
                       PipelineModule, as data parallel; AutoTP's tp ranks share batches)
tp                     ``tensor_parallel.autotp_size`` (AutoTP of a transformers model)  close
pp, stage_blocks       code: ``PipelineModule(num_stages=pp, partition_method=           none /
                       "uniform")``; the JSON has no stage count                         close
schedule               1f1b: DeepSpeed's; gpipe: runs as 1F1B; interleaved: no          exact /
                       interleaving (a larger bubble)                                    close
cp                     refused: DeepSpeed's sequence parallelism is Ulysses (all-to-all
                       over heads), not ring attention
ep                     ``expert_parallel.autoep_size`` (AutoEP)                          close
zero                   ``zero_optimization.stage``; 2 and 3 refused under pp > 1         exact
micro_batch,           ``train_micro_batch_size_per_gpu``,                               exact
num_microbatches,      ``gradient_accumulation_steps``, ``train_batch_size``
global_batch
sequence_parallel      no equivalent in AutoTP: norm activations kept whole per rank     close
checkpoint             full: ``activation_checkpointing`` (+ ``pipeline.                 exact /
                       activation_checkpoint_interval`` 1); selective, matmuls, moe:     close /
                       none                                                              none
offload                ``zero_optimization.offload_optimizer`` on the CPU (ZeRO >= 1)    exact
precision              ``bf16`` / ``fp16`` (dynamic loss scaling as autopar's) / fp32;   exact
                       bf16-pure: ``bf16_master_weights_and_grads`` and
                       ``bf16_optimizer_states`` (ZeRO >= 1)
grad_dtype             ``communication_data_type`` the plan's (fp32 by default) under    exact
                       bf16 and fp16, as autopar's engine reduces (FSDP2's
                       ``reduce_dtype``)
optimizer              ``optimizer.type`` AdamW / Adam (``adam_w_mode`` false) / SGD     exact
seq_len, fusions,      none: the data loader's and the model's                           none
model shape
=====================  ==============================================================  =======
"""

from __future__ import annotations

import json

from autopar.core.estimate import checkpoint_text
from autopar.core.plan import Plan
from autopar.core.specs import Checkpoint, Optimizer, Precision, Schedule
from autopar.exports.mapping import Export, Fit, Row, plan_rows, refuse

SOURCE = ("DeepSpeed 0.19.8 (PyPI): deepspeed/runtime/config.py, runtime/zero/config.py, "
          "runtime/precision_config.py, runtime/activation_checkpointing/config.py, "
          "runtime/pipe/engine.py")
CONFIG = "ds_config.json"


def deepspeed_config(plan: Plan) -> tuple[dict[str, object], dict[str, Row]]:
    """(the config dict, the row of each plan field); ``AutoparError`` for a plan DeepSpeed
    cannot run (see the table in the module docstring)."""
    from autopar.models.training import LOSS_SCALING

    c, t = plan.config, plan.train
    m = plan.estimate.num_microbatches
    rows: dict[str, Row] = {}

    def row(name: str, value: object, target: str, fit: Fit, note: str = "") -> None:
        rows[name] = Row(name, str(value), target, fit, note)

    if c.cp > 1:
        raise refuse(f"cp={c.cp}: DeepSpeed's sequence parallelism is Ulysses (an all-to-all "
                     "over attention heads), not the ring attention autopar planned and priced",
                     where="config.cp", fix="re-plan with --cp 1, or export to megatron, bridge "
                     "or torchtitan, which run context parallelism")
    if c.pp > 1 and c.zero >= 2:
        raise refuse(f"zero={c.zero} with pp={c.pp}: DeepSpeed's pipeline engine refuses ZeRO-2 "
                     "and ZeRO-3 (runtime/pipe/engine.py)", where="config.zero",
                     fix="re-plan with --zero 1 (or 0) for pipelining, or export to megatron, "
                         "bridge or torchtitan")
    if c.offload and c.zero == 0:
        raise refuse("the plan offloads the optimizer with ZeRO-0; DeepSpeed offloads the "
                     "optimizer states of its ZeRO optimizer only", where="config.offload",
                     fix="re-plan with --zero 1 or higher")

    counted = counted_batch(plan)
    cfg: dict[str, object] = {"train_batch_size": counted,
                              "train_micro_batch_size_per_gpu": c.micro_batch,
                              "gradient_accumulation_steps": m}
    row("nodes x gpus_per_node", f"{plan.nodes} x {plan.gpus_per_node}",
        f"deepspeed --num_nodes {plan.nodes} --num_gpus {plan.gpus_per_node}", Fit.EXACT)
    row("config.dp", c.dp, "", Fit.EXACT, "DeepSpeed's batch check counts the world size "
        "(/ pp under a PipelineModule) as data parallel: AutoTP's tp ranks read the same "
        "micro-batches, so its count is dp * tp" if c.tp > 1 else "DeepSpeed's data-parallel "
        "size is the world size (/ pp under a PipelineModule)")
    row("config.micro_batch", c.micro_batch, f"train_micro_batch_size_per_gpu = {c.micro_batch}",
        Fit.EXACT)
    row("config.num_microbatches", m, f"gradient_accumulation_steps = {m}", Fit.EXACT,
        "under pipelining, the micro-batches of one step" if c.pp > 1 else "")
    row("train.global_batch", t.global_batch, f"train_batch_size = {counted}", Fit.EXACT,
        f"DeepSpeed counts each of the {c.tp} tp ranks' identical micro-batches: "
        f"{t.global_batch} distinct sequences a step" if c.tp > 1 else "")

    if c.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": c.tp}
        row("config.tp", c.tp, f"tensor_parallel.autotp_size = {c.tp}", Fit.CLOSE,
            "AutoTP splits a transformers model's linear layers by its own rules (columns for "
            "q/k/v and the MLP's input, rows for the outputs), as autopar's Megatron-style "
            "split does; a model of your own needs its partition_config")
        row("config.sequence_parallel", c.sequence_parallel, "", Fit.CLOSE if
            c.sequence_parallel else Fit.EXACT, "AutoTP has no sequence parallelism: the norms' "
            "and dropout's activations stay whole on every tp rank, more activation memory "
            "than the plan's" if c.sequence_parallel else "")
    else:
        row("config.tp", c.tp, "", Fit.EXACT, "no tensor parallelism")
        row("config.sequence_parallel", c.sequence_parallel, "", Fit.EXACT)
    row("config.cp", c.cp, "", Fit.EXACT, "no context parallelism")
    if c.ep > 1:
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": c.ep}
        row("config.ep", c.ep, f"expert_parallel.autoep_size = {c.ep}", Fit.CLOSE,
            "AutoEP replaces a transformers model's MoE layers; a model of your own passes "
            f"ep_size={c.ep} to deepspeed.moe.layer.MoE")
    else:
        row("config.ep", c.ep, "", Fit.EXACT)
    if c.etp == 1:
        row("config.etp", c.etp, "", Fit.EXACT, "every expert whole on its ep rank")
    else:
        row("config.etp", c.etp, "", Fit.NONE, "DeepSpeed-MoE does not split an expert over "
            "ranks: export to Megatron-LM (--expert-tensor-parallel-size), or plan etp=1")
    _pipeline(plan, cfg, row)

    zero: dict[str, object] = {"stage": c.zero}
    cfg["zero_optimization"] = zero
    row("config.zero", c.zero, f"zero_optimization.stage = {c.zero}", Fit.EXACT)
    if c.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        row("config.offload", True, "zero_optimization.offload_optimizer.device = cpu",
            Fit.EXACT, "optimizer states and fp32 master weights in pinned CPU memory, the step "
            "on the CPU (DeepSpeedCPUAdam); autopar offloads no parameters, so no "
            "offload_param")
    else:
        row("config.offload", False, "", Fit.EXACT)

    _checkpoint(plan, cfg, row)
    p = t.precision
    if p is Precision.BF16:
        cfg["bf16"] = {"enabled": True}
        row("train.precision", p, "bf16.enabled = true", Fit.EXACT,
            "bf16 compute, fp32 master weights")
    elif p is Precision.FP16:
        cfg["fp16"] = {"enabled": True, "loss_scale": 0,
                       "initial_scale_power": 16, "loss_scale_window":
                       int(LOSS_SCALING["growth_interval"]), "hysteresis": 1,
                       "min_loss_scale": 1}
        row("train.precision", p, "fp16.enabled = true, loss_scale = 0 (dynamic), "
            "initial_scale_power = 16, loss_scale_window = 2000, hysteresis = 1", Fit.EXACT,
            "dynamic loss scaling as autopar's engine runs it")
    elif p is Precision.FP8:
        raise refuse("precision fp8: DeepSpeed's configuration has no FP8 switch; FP8 GEMMs "
                     "come from the model's own code (Transformer Engine layers), which "
                     "autopar's export does not rewrite",
                     where="train.precision",
                     fix="export to megatron, bridge or torchtitan (FP8 through Transformer "
                         "Engine or torchao), or re-plan with --precision bf16")
    if p in (Precision.BF16, Precision.FP16):
        # autopar's engine reduces gradients in train.grad_dtype (passes/data_parallel.py:
        # mixed_precision); DeepSpeed's default is the compute dtype
        reduce = t.grad_dtype.value
        cfg["communication_data_type"] = reduce
        row("train.grad_dtype", reduce, f"communication_data_type = {reduce}", Fit.EXACT,
            f"gradients reduced in {reduce}, as autopar's engine reduces them")
    if p is Precision.BF16_PURE:
        if c.zero == 0:
            raise refuse("precision bf16-pure with ZeRO-0: DeepSpeed keeps bf16 master weights "
                         "and optimizer states only in its ZeRO optimizer",
                         where="train.precision", fix="re-plan with --zero 1 or higher, or "
                         "with --precision bf16")
        cfg["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True,
                       "bf16_optimizer_states": True}
        row("train.precision", p, "bf16.enabled, bf16_master_weights_and_grads, "
            "bf16_optimizer_states = true", Fit.EXACT)
    elif p is Precision.FP32:
        row("train.precision", p, "", Fit.EXACT, "DeepSpeed's default: fp32")
    o = t.optimizer
    optimizer: dict[str, object] = {"type": {Optimizer.ADAMW: "AdamW", Optimizer.ADAM: "Adam",
                                             Optimizer.SGD: "SGD"}[o], "params": {}}
    if o is Optimizer.ADAM:
        optimizer["params"] = {"adam_w_mode": False}
    cfg["optimizer"] = optimizer
    row("train.optimizer", o, f"optimizer.type = {optimizer['type']}", Fit.EXACT,
        "add lr, betas, weight_decay to optimizer.params"
        + ("; adam_w_mode false: L2 decay in the gradient, as torch's Adam"
           if o is Optimizer.ADAM else ""))
    row("train.seq_len", t.seq_len, "", Fit.NONE,
        "DeepSpeed's config has no sequence length: your data loader's")
    row("config.fusions", ", ".join(c.fusions) or "none", "", Fit.NONE,
        "DeepSpeed's config chooses no kernels; your model's code does")
    spec = plan.model_spec
    row("model", spec.label if spec else plan.model, "", Fit.NONE,
        "DeepSpeed trains the nn.Module your script builds")
    return cfg, rows


def counted_batch(plan: Plan) -> int:
    """``train_batch_size`` as DeepSpeed 0.19.8 checks it when launched as the README says
    (``runtime/config.py``: micro-batch x accumulation x its data-parallel world size, which is
    the whole world without an ``mpu`` and world / pp under a ``PipelineModule``'s grid; AutoTP
    adds no ``mpu``): the plan's global batch times tp, the tp ranks counted apart though they
    read the same micro-batches."""
    return plan.train.global_batch * plan.config.tp


def _pipeline(plan: Plan, cfg: dict[str, object], row) -> None:
    c = plan.config
    if c.pp == 1:
        row("config.pp", 1, "", Fit.EXACT, "no pipeline")
        row("config.schedule", c.schedule, "", Fit.EXACT, "no pipeline (pp = 1)")
        row("config.virtual_stages", c.virtual_stages, "", Fit.EXACT)
        row("stage_blocks", list(plan.stage_blocks), "", Fit.EXACT)
        return
    row("config.pp", c.pp, f"PipelineModule(..., num_stages={c.pp}) in your script", Fit.NONE,
        "the JSON has no stage count: DeepSpeed's pipeline is the PipelineModule the script "
        "builds (see Use)")
    if c.schedule is Schedule.ONE_F_ONE_B:
        row("config.schedule", c.schedule, "", Fit.EXACT, "DeepSpeed's TrainSchedule is 1F1B")
    elif c.schedule is Schedule.GPIPE:
        row("config.schedule", c.schedule, "", Fit.CLOSE, "DeepSpeed runs 1F1B: the same "
            "bubble, fewer micro-batches in flight, less activation memory than the plan's")
    else:
        row("config.schedule", c.schedule, "", Fit.CLOSE,
            "DeepSpeed has no interleaved schedule: it runs 1F1B over pp stages, whose bubble "
            f"is {c.virtual_stages} times the plan's")
    row("config.virtual_stages", c.virtual_stages, "", Fit.EXACT if c.virtual_stages == 1
        else Fit.NONE, "" if c.virtual_stages == 1 else "no model chunks per stage in DeepSpeed")
    even = len(set(plan.stage_blocks)) == 1
    row("stage_blocks", list(plan.stage_blocks), 'partition_method="uniform"',
        Fit.EXACT if even else Fit.CLOSE, "" if even else
        "DeepSpeed's uniform split evens the layers out; the plan's stages differ (its "
        "partition_method takes uniform, parameters or a layer-type regex, no list)")


_NO_POLICY = {
    Checkpoint.SELECTIVE: "DeepSpeed has no selective policy: without code of yours "
                          "(deepspeed.checkpointing.checkpoint around each attention core) the "
                          "attention core's scores and probabilities are kept, more memory than "
                          "the plan's (with fused attention, as much)",
    Checkpoint.MATMULS: "DeepSpeed has no selective policy: without code of yours (torch's "
                        "create_selective_checkpoint_contexts around each block) every "
                        "activation is kept, more memory than the plan's",
    Checkpoint.MOE: "DeepSpeed has no policy recomputing the MoE layers alone: without code of "
                    "yours (deepspeed.checkpointing.checkpoint around each MoE layer's forward) "
                    "every activation is kept, more memory than the plan's",
}
"""The policies DeepSpeed's config cannot express, and what runs instead."""


def _checkpoint(plan: Plan, cfg: dict[str, object], row) -> None:
    c = plan.config
    text = checkpoint_text(c.checkpoint)
    if c.checkpoint is Checkpoint.NONE:
        row("config.checkpoint", text, "", Fit.EXACT, "nothing recomputed")
        return
    if c.checkpoint in _NO_POLICY:
        row("config.checkpoint", text, "", Fit.NONE, _NO_POLICY[c.checkpoint])
        return
    cfg["activation_checkpointing"] = {"partition_activations": False,
                                       "contiguous_memory_optimization": False,
                                       "cpu_checkpointing": False}
    if c.pp > 1:
        cfg["pipeline"] = {"activation_checkpoint_interval": 1}
    target = "activation_checkpointing" + (", pipeline.activation_checkpoint_interval = 1"
                                           if c.pp > 1 else "")
    if c.checkpoint is Checkpoint.FULL:
        how = ("PipelineModule recomputes every layer named in its checkpointable_layers (the "
               "blocks' class: by default it takes every layer with parameters, the embedding "
               "too, whose recompute fails)" if c.pp > 1 else
               "wrap each block in deepspeed.checkpointing.checkpoint (a transformers model: "
               "model.gradient_checkpointing_enable())")
        row("config.checkpoint", text, target, Fit.EXACT if c.pp > 1 else Fit.CLOSE, how)
        return
    row("config.checkpoint", text, target, Fit.CLOSE,
        "per-block policies: wrap the blocks the plan recomputes in "
        "deepspeed.checkpointing.checkpoint yourself"
        + ("; under pipelining the interval recomputes every layer, more time than the plan's"
           if c.pp > 1 else ""))


def export(plan: Plan, allow_approximate: bool = False) -> Export:
    """``ds_config.json`` for ``deepspeed.initialize(config=...)``. The model is the training
    script's own code, so nothing here depends on its architecture (``allow_approximate``
    changes nothing)."""
    cfg, rows = deepspeed_config(plan)
    c = plan.config
    pipe = ""
    interval = cfg.get("pipeline", {}).get("activation_checkpoint_interval", 0)
    checkpointable = (",\n" + " " * 27 + 'checkpointable_layers=["YourBlock"]'
                      if interval else "")
    recompute = ("""

`pipeline.activation_checkpoint_interval` recomputes the layers `checkpointable_layers` names:
name your blocks' class there. Without it DeepSpeed checkpoints every layer with parameters,
the embedding too, whose backward then fails (its integer input carries no gradient: "element 0
of tensors does not require grad", DeepSpeed 0.19.8).""" if interval else "")
    if c.pp > 1:
        pipe = f"""
Pipelining is code in DeepSpeed: build the model as a `PipelineModule` of its layers,

    from deepspeed.pipe import PipelineModule
    model = PipelineModule(layers=..., num_stages={c.pp}, partition_method="uniform",
                           loss_fn=...{checkpointable})

and train with `engine.train_batch()`; the config's gradient_accumulation_steps are the
micro-batches of a step.{recompute}"""
    tp = "" if c.tp == 1 else f"""
With AutoTP (`tensor_parallel.autotp_size = {c.tp}`) the {c.tp} ranks of a tensor-parallel
group must read the same micro-batches; DeepSpeed's `train_batch_size` counts them apart
({counted_batch(plan)} for the plan's {plan.train.global_batch} sequences a step)."""
    usage = f"""`{CONFIG}` is DeepSpeed's config for this plan:

    engine, optimizer, _, _ = deepspeed.initialize(model=model, config="{CONFIG}",
                                                   model_parameters=model.parameters())

launched on {plan.nodes} node(s) x {plan.gpus_per_node} GPUs
(`deepspeed --num_nodes {plan.nodes} --num_gpus {plan.gpus_per_node} train.py`, or torchrun).
Add the learning rate and its schedule (`optimizer.params`, `scheduler`): the plan does not
decide them.{tp}{pipe}"""
    text = json.dumps(cfg, indent=2, sort_keys=True) + "\n"
    return Export("DeepSpeed", {CONFIG: text}, plan_rows(plan, rows), SOURCE, usage)
