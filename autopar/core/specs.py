"""What is trained and how it is split: ``TrainSpec`` and ``ParallelConfig``.

These are inputs of the cost model (calculon keeps application, execution and system apart);
``autopar`` re-exports them. Both validate in ``__post_init__`` and raise ``AutoparError``
(a ``ValueError``) naming the field at fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Sequence

from .errors import AutoparError


class Precision(StrEnum):
    """Precision policy of the training step."""

    BF16 = "bf16"
    """bf16 compute and activations, fp32 master weights and optimizer states (Megatron, ZeRO)."""
    FP16 = "fp16"
    """As bf16 with fp16 compute (the Megatron-LM and ZeRO papers)."""
    BF16_PURE = "bf16-pure"
    """Everything in bf16: weights, gradients and optimizer states; no fp32 master copy."""
    FP32 = "fp32"
    """Everything in fp32 (TF32 matmuls on A100/H100)."""
    FP8 = "fp8"
    """As bf16, with the GEMMs of the chosen linear layers in FP8 (torchao's float8 training,
    ``passes/float8.py`` says which layers): their inputs, weights and output gradients cast to
    FP8 with dynamic scales (``TrainSpec.fp8_recipe``), the products accumulated in fp32;
    everything else bf16, fp32 master weights and optimizer states."""

    @property
    def mixed(self) -> bool:
        """Whether a low-precision compute copy runs on fp32 master weights (``bf16``,
        ``fp16``, ``fp8``)."""
        return self in (Precision.BF16, Precision.FP16, Precision.FP8)


class Fp8Recipe(StrEnum):
    """How FP8 scales are taken (torchao's ``Float8LinearRecipeName``). What the frameworks'
    names map to: Megatron-LM / Transformer Engine's ``--fp8-recipe tensorwise`` (current
    scaling, "FP8-CS" in NeMo's tables) is ``tensorwise``; ``delayed`` (scales from an amax
    history) has no torchao training recipe any more and is priced and run as ``tensorwise``,
    which does the same GEMMs with one more amax pass; ``mxfp8`` (Blackwell's 1 x 32 block
    scales) and ``blockwise`` (DeepSeek-V3's 1 x 128 / 128 x 128) are finer than ``rowwise``,
    which stands for them in pricing and is not run as them."""

    TENSORWISE = "tensorwise"
    """One scale per tensor (e4m3 forward, e5m2 output gradients); under FSDP the weights are
    all-gathered in FP8 (torchao's ``enable_fsdp_float8_all_gather``, ZeRO++'s quantized weight
    communication)."""
    ROWWISE = "rowwise"
    """One scale per row of each GEMM operand (e4m3 throughout); weights all-gathered in bf16."""


class GradDtype(StrEnum):
    """The dtype a mixed-precision step accumulates and reduces its gradients in: FSDP2's
    ``MixedPrecisionPolicy.reduce_dtype`` (``passes/data_parallel.py``). The gradients'
    accumulators (ZeRO-0/1, and any stage under pipelining, hold them whole across the
    micro-batches) and the data-parallel reduction are in it; the reduced shard the optimizer
    steps on is in the master weights' dtype (fp32) either way."""

    FP32 = "fp32"
    """fp32: Megatron-LM's default under ``--bf16`` (``accumulate_allreduce_grads_in_fp32``),
    Megatron-Bridge's ``bf16_mixed`` (``grad_reduce_in_fp32=True``), torchtitan's
    ``mixed_precision_reduce = "float32"``."""
    BF16 = "bf16"
    """bf16: half the accumulators' bytes and the reduction's traffic, rounded sums
    (Megatron-LM's ``--grad-reduce-in-bf16``, the bf16 main gradients of its precision-aware
    optimizer; Megatron-Bridge's ``grad_reduce_in_fp32=False``). Only under a bf16 compute
    precision (``bf16``, ``fp8``; ``bf16-pure`` reduces in bf16 anyway)."""
    FP16 = "fp16"
    """fp16, the same halving under ``fp16`` compute (Megatron-LM's default under ``--fp16``,
    without ``--accumulate-allreduce-grads-in-fp32``). Only under ``fp16``."""


class Optimizer(StrEnum):
    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"


class Schedule(StrEnum):
    """Pipeline schedule."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


class Checkpoint(StrEnum):
    """Activation checkpoint policy of one block, as ``passes/checkpointing.py`` runs it."""

    NONE = "none"
    """Keep every activation the backward pass needs."""
    SELECTIVE = "selective"
    """Korthikanti et al.'s (2022) selective recomputation (Megatron-LM ``--recompute-granularity
    selective --recompute-modules core_attn``): recompute only the unfused attention core --
    q.k^T, scale and mask, softmax, softmax dropout, .v: the ``5*a*s^2*b`` bytes per layer --
    and keep every other activation as autograd saves it: under tensor + sequence parallelism
    the row-parallel linears' outputs as the reduce-scatter produces them (sequence-split, not
    the full-size partial sums before it), the norms' inputs and the dropout masks
    sequence-split, and the column-parallel linears' all-gathered inputs as their shards,
    gathered again in the backward (``passes/regather.py``, as Megatron does): the paper's
    ``34*s*b*h/t`` bytes per GPT layer in fp16. Fused attention never stores the core's
    internals: there it recomputes nothing and keeps what ``none`` keeps (less the gathered
    inputs' other shards under sequence parallelism)."""
    MATMULS = "matmuls"
    """Keep the block input and the outputs of the linear layers (GEMMs by a weight matrix) and
    of fused attention (output and log-sum-exp); recompute every other op in the backward pass
    -- norms, activations, RoPE, dropout, the forward collectives, and the unfused attention
    core's batched matmuls and the MoE experts' (``bmm``), which are not linear layers. An
    addition to Megatron's policies, kept because it keeps less than ``selective`` without
    sequence parallelism (at tp = 1 its row-parallel partial sums are whole tensors anyway),
    for memory-bound recompute and the forward's tp collectives issued again; ``selective``
    wins under tp + SP, where matmuls' partial sums stay full-size. The memory model's bytes
    per layer, in units of s*b*h, GPT-175B block (h = 12288, a = 96, s = 2048, b = 1, fp16,
    dropout 0.1; ``tests/unit/costmodel/test_activation_memory.py``):

    ==================  ======  =========  =======  ====
    attention, split    none    selective  matmuls  full
    ==================  ======  =========  =======  ====
    fused, tp 1         34.0    34.0       22.0     2.0
    fused, tp 8         13.0    13.0       8.0      2.0
    fused, tp 8 + SP    7.75    4.25       6.25     0.25
    eager, tp 1         114.0   34.0       20.0     2.0
    eager, tp 8         23.0    13.0       7.75     2.0
    eager, tp 8 + SP    17.75   4.25       6.0      0.25
    ==================  ======  =========  =======  ====

    (``none`` under SP keeps DTensor's two all-gathered norm outputs whole: 2 x 2 x 7/8.)"""
    FULL = "full"
    """Keep only the block input; recompute the whole block in the backward pass."""
    MOE = "moe"
    """Megatron-Core's ``--recompute-granularity selective --recompute-modules moe``: each
    mixture-of-experts layer of the block (router, dispatch, experts, combine: the family's
    ``ExpertLayer.module``) runs under non-reentrant checkpoint -- its input is kept, everything
    it makes inside is recomputed in the backward pass, the dispatch and combine all-to-alls
    under expert parallelism (and the gather of a split call's routing, ``SplitCall``) issued
    again; every other op of the block keeps what ``none`` keeps, but that under sequence
    parallelism the column-parallel linears' all-gathered inputs are kept as their shards and
    gathered again in the backward, as Megatron's linears do under any recomputation
    (``passes/regather.py``, as ``selective``). Only for a model whose family gives its MoE
    layers' modules (``analysis/admissibility.py``)."""

    @property
    def regathers(self) -> bool:
        """Whether the policy keeps a sequence-parallel all-gather's output as its shard and
        gathers it again in the backward (``passes/regather.py``): ``selective`` and ``moe``,
        Megatron's selective recomputations; ``full`` keeps only the block input, and ``none``
        and ``matmuls`` keep the gathered inputs whole."""
        return self in (Checkpoint.SELECTIVE, Checkpoint.MOE)


def _choice(enum: type[StrEnum], value: object, name: str) -> StrEnum:
    try:
        return enum(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in enum)
        raise AutoparError(
            f"{name}={value!r} is not one of {allowed}", where=name, fix=f"use one of {allowed}"
        ) from None


def _positive_int(value: object, name: str, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AutoparError(
            f"{name} must be an integer >= {minimum}, got {value!r}",
            where=name,
            fix=f"pass an integer of at least {minimum}",
        )


def check_field(name: str, value: object) -> object:
    """One ``ParallelConfig`` field checked on its own (``AutoparError`` naming it) and
    normalised (enums from strings, tuples from lists); the checks between fields are
    ``ParallelConfig.__post_init__``'s. Constraints on the search are checked with it too."""
    if name in ("dp", "tp", "pp", "cp", "ep", "etp", "micro_batch", "virtual_stages") or (
            name == "num_microbatches" and value is not None):
        _positive_int(value, name)
    elif name == "zero" and (value not in (0, 1, 2, 3) or isinstance(value, bool)):
        raise AutoparError(f"zero={value!r} is not a ZeRO stage", where="zero",
                           fix="use 0, 1, 2 or 3")
    elif name == "schedule":
        return _choice(Schedule, value, "schedule")
    elif name == "checkpoint":
        if isinstance(value, (str, StrEnum)):
            return _choice(Checkpoint, value, "checkpoint")
        if isinstance(value, tuple) and value and all(type(c) is Checkpoint for c in value):
            return value  # already normalised: the search makes thousands of configs
        policies = tuple(_choice(Checkpoint, c, "checkpoint") for c in value)  # type: ignore[attr-defined]
        if not policies:
            raise AutoparError("checkpoint is an empty list", where="checkpoint",
                               fix="give one policy, or one per block")
        return policies
    elif name in ("sequence_parallel", "offload") and not isinstance(value, bool):
        raise AutoparError(f"{name}={value!r} is not true or false", where=name,
                           fix="give True or False")
    elif name == "fusions":
        return tuple(value)  # type: ignore[call-overload]
    return value


ASYNC_TP = "async_tp"
"""Asynchronous tensor parallelism, an engine fusion: each sequence-parallel all-gather before a
column-split GEMM and reduce-scatter after a row-split one decomposed and overlapped with the
GEMM (PyTorch's micro-pipeline TP over symmetric memory, ``passes/async_tp.py``; priced by
``costmodel/step.py:tp_comm_s``). Needs tp > 1 with sequence parallelism."""
ENGINE_FUSIONS: tuple[str, ...] = (ASYNC_TP,)
"""Fusions the engine makes of collectives and GEMMs (no kernel of ``autopar.kernels``, no op
pattern of ``autopar.analysis.ops``)."""
KERNEL_FUSIONS: tuple[str, ...] = ("rms_norm", "layer_norm", "swiglu", "gelu", "rope",
                                   "linear_cross_entropy")
"""Fusions with a Triton kernel of ``autopar.kernels``, each named as its kernel and priced by
the op pattern of that name (``autopar.analysis.ops``): planned, priced and run."""
PRICED_FUSIONS: tuple[str, ...] = ("scale_mask_softmax", "bias_dropout_add")
"""Megatron-LM's fused kernels, priced by op patterns (the published runs the cost model is
validated against ran them) and run by no kernel here: a plan of them is estimated, and the
passes refuse to execute it."""
MOE_PERMUTE = "moe_permute"
DEEPEP = "deepep"
EP_A2A_OVERLAP = "ep_a2a_overlap"
FP8_FUSED_CASTS = "fp8_fused_casts"
FP8_COMPILED_CASTS = "fp8_compiled_casts"
MCORE_ACTIVATIONS = "mcore_activations"
MOE_FUSIONS: tuple[str, ...] = (MOE_PERMUTE, DEEPEP, EP_A2A_OVERLAP, FP8_FUSED_CASTS,
                                FP8_COMPILED_CASTS, MCORE_ACTIVATIONS)
"""What the MoE engines run that autopar's engine does not, priced so that a plan for them is
priced as they run it (``costmodel/moe.py``, ``analysis/workload.py:moe_permutes``); the passes
refuse to execute a plan naming them, and the exports carry them as the framework's flags:

* ``moe_permute``: the token permutation and un-permutation as fused kernels, with the fused
  SwiGLU of the experts (Megatron-Core ``--moe-permute-fusion``; torchtitan's permute indices);
* ``deepep``: dispatch and combine by DeepEP (or NVIDIA's HybridEP): a token crosses the
  network once per destination node and is forwarded to its experts' GPUs over NVLink
  (Megatron-Core ``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep``);
* ``ep_a2a_overlap``: each micro-batch's dispatch and combine hidden behind another
  micro-batch's compute (Megatron-Core ``--overlap-moe-expert-parallel-comm``, the
  EP-overlapped 1F1B schedule; DeepSeek-V3's DualPipe);
* ``fp8_fused_casts`` (not MoE: Transformer Engine's FP8, under ``precision="fp8"``): the
  amax and the cast of each FP8 GEMM's input fused into the kernel that produces it (TE's
  ``LayerNormLinear``, the fused activation), the weights cast once per step and kept across
  micro-batches, and the backward reusing the forward's FP8 copies (``costmodel/compute.py:
  fp8_cast_s``); the experts' grouped GEMMs in FP8 too. torchao's eager float8 linears, which
  autopar's engine runs, cast each operand on their own, and its stacked experts stay bf16;
* ``fp8_compiled_casts`` (not MoE: torchao's float8 linears under ``torch.compile``, as
  torchtitan runs them, under ``precision="fp8"``): Inductor's two kernels per cast, the amax
  reduction and the cast that writes the FP8 copy in the layout its GEMM reads, instead of the
  eager chain of six and the separate transposes (``costmodel/compute.py:fp8_cast_s``;
  measured 1.6-9x slower than bf16 eager on an H200, bench/results/fp8_linear.md);
* ``mcore_activations`` (not MoE: Megatron-Core's activations, as its engines keep them):
  the pipeline frees each stage output's storage once it is sent, keeping only its autograd
  node (``deallocate_pipeline_outputs``), where torch's schedules keep every chunk's output of
  the micro-batches in flight; and context parallelism's attention (Transformer Engine's)
  writes both query chunks' outputs into the one tensor the projection reads, where autopar's
  concatenates them, a copy more (``costmodel/memory.py:cp_output_bytes``)."""
FUSIONS: tuple[str, ...] = KERNEL_FUSIONS + PRICED_FUSIONS + ENGINE_FUSIONS + MOE_FUSIONS
"""Every fusion name autopar itself knows: the vocabulary ``check_fusions`` reads, with the
patterns an op family registered later adds (``PRICED_LATER``)."""
PRICED_LATER: set[str] = set()
"""Fusion patterns of op families registered after autopar's own, none of ``FUSIONS``
(``autopar.analysis.ops``'s registry keeps it): priced, no kernel."""


def fusion_names() -> tuple[str, ...]:
    """``FUSIONS`` and the patterns registered later, in that order."""
    return FUSIONS + tuple(sorted(PRICED_LATER))


def check_fusions(fusions: tuple[str, ...] | list[str], tp: int = 1,
                  where: str = "fusions") -> None:
    """``AutoparError`` for a name outside ``FUSIONS``, or ``linear_cross_entropy`` with
    tp > 1: every reader of fusion names (the config, the op patterns, the fusion pass) asks
    here."""
    known = fusion_names()
    for name in fusions:
        if name not in known:
            raise AutoparError(f"unknown fusion {name!r}", where=where,
                               fix=f"use names among {', '.join(known)}")
    if "linear_cross_entropy" in fusions and tp > 1:
        raise AutoparError(
            f"fusion 'linear_cross_entropy' with tp={tp}: the fused loss computes every logit "
            "of the vocabulary on one GPU, and tensor parallelism splits the head over the "
            "vocabulary", where=where,
            fix="drop 'linear_cross_entropy' for tp > 1 (the vocabulary-parallel loss keeps "
                "the logits sharded instead), or plan tp=1")


@dataclass(frozen=True)
class TrainSpec:
    """What one optimizer step trains."""

    global_batch: int
    """Sequences per optimizer step, over all data-parallel replicas."""
    seq_len: int = 2048
    """Tokens per sequence."""
    precision: Precision = Precision.BF16
    """Precision policy; see ``Precision``."""
    optimizer: Optimizer = Optimizer.ADAMW
    """Optimizer, which sets the optimizer-state bytes per parameter."""
    fp8_recipe: Fp8Recipe = Fp8Recipe.TENSORWISE
    """The FP8 scaling recipe (``Fp8Recipe``); read only when ``precision`` is ``fp8``."""
    grad_dtype: GradDtype = GradDtype.FP32
    """What the gradients are accumulated and reduced in (``GradDtype``) under a mixed
    precision (``bf16``, ``fp8``, ``fp16``): fp32, or the compute dtype (``bf16``; ``fp16``
    under ``fp16``). ``bf16-pure`` reduces in bf16 and ``fp32`` in fp32 whatever it says (a
    low dtype is refused under ``fp32``)."""

    def __post_init__(self) -> None:
        _positive_int(self.global_batch, "global_batch")
        _positive_int(self.seq_len, "seq_len")
        object.__setattr__(self, "precision", _choice(Precision, self.precision, "precision"))
        object.__setattr__(self, "optimizer", _choice(Optimizer, self.optimizer, "optimizer"))
        object.__setattr__(self, "fp8_recipe",
                           _choice(Fp8Recipe, self.fp8_recipe, "fp8_recipe"))
        object.__setattr__(self, "grad_dtype",
                           _choice(GradDtype, self.grad_dtype, "grad_dtype"))
        low = {GradDtype.BF16: (Precision.BF16, Precision.FP8, Precision.BF16_PURE),
               GradDtype.FP16: (Precision.FP16,)}.get(self.grad_dtype)
        if low is not None and self.precision not in low:
            raise AutoparError(
                f"grad_dtype='{self.grad_dtype}' under precision '{self.precision}': its "
                f"gradients are not made in {self.grad_dtype}", where="grad_dtype",
                fix="use grad_dtype='fp32', or precision "
                    + " or ".join(repr(str(p)) for p in low))

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len

    def to_dict(self) -> dict[str, object]:
        out = {"global_batch": self.global_batch, "seq_len": self.seq_len,
               "precision": self.precision.value, "optimizer": self.optimizer.value}
        if self.precision is Precision.FP8:
            out["fp8_recipe"] = self.fp8_recipe.value
        if self.grad_dtype is not GradDtype.FP32:  # default left out: plans' JSON unchanged
            out["grad_dtype"] = self.grad_dtype.value
        return out


@dataclass(frozen=True)
class ParallelConfig:
    """How the step is split over the GPUs: the decisions a plan makes.

    The mesh is dp x tp x pp x cp GPUs. The experts have a mesh of their own, (expert dp, ``ep``,
    ``etp``), folded over the same ranks of each pipeline stage (Megatron-Core's MoE Parallel
    Folding, Liu et al., arXiv 2504.14960): over the dp x cp x tp ranks under sequence
    parallelism, where each tp rank holds and routes its own tokens (``experts_fold_tp``), so
    ``ep`` may span tp ranks and exceed dp x cp; over the dp x cp ranks otherwise (the tp ranks
    hold the same tokens and every one of them runs its experts on them whole). ``etp`` is the
    innermost of the three, then ``ep`` (``autopar.core.mesh.expert_strides``).
    """

    dp: int = 1
    """Data-parallel degree (replicas, or ZeRO shards)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row sharding inside each block)."""
    pp: int = 1
    """Pipeline-parallel degree (stages)."""
    cp: int = 1
    """Context-parallel degree (the sequence split across ranks in 2 x cp load-balanced chunks;
    attention over all-gathered keys and values, ``passes/context_parallel.py``)."""
    ep: int = 1
    """Expert-parallel degree: each MoE layer's experts split over ``ep`` ranks of the experts'
    mesh (``expert_ranks``: dp x cp x tp under sequence parallelism, dp x cp without)."""
    etp: int = 1
    """Expert tensor-parallel degree: each expert's GEMMs split over ``etp`` ranks (a column and
    a row split, as a dense MLP under tp); divides tp, needs sequence parallelism when above 1;
    1 keeps every expert whole (Megatron-Core's ``--expert-tensor-parallel-size``)."""
    zero: int = 0
    """ZeRO stage: 0 replicate, 1 shard optimizer states, 2 + gradients, 3 + parameters."""
    micro_batch: int = 1
    """Sequences per micro-batch on one pipeline."""
    num_microbatches: int | None = None
    """Micro-batches per step per pipeline; ``None``: global_batch / (dp * micro_batch)."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    """Pipeline schedule."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank (interleaved schedule only)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms and dropout sharded over the tp ranks."""
    checkpoint: Checkpoint | tuple[Checkpoint, ...] = Checkpoint.NONE
    """One policy for every block, or one policy per block."""
    offload: bool = False
    """Keep optimizer states (and the fp32 master weights) in CPU memory, step on the CPU."""
    fusions: tuple[str, ...] = field(default_factory=tuple)
    """Names among ``FUSIONS``: fused kernels (``KERNEL_FUSIONS``, ``autopar.kernels``),
    Megatron's priced ones (``PRICED_FUSIONS``) and the engine's (``ENGINE_FUSIONS``)."""

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            object.__setattr__(self, name, check_field(name, getattr(self, name)))
        schedule = self.schedule
        if self.virtual_stages > 1 and schedule is not Schedule.INTERLEAVED:
            raise AutoparError(
                f"virtual_stages={self.virtual_stages} needs the interleaved schedule, "
                f"not {schedule.value!r}",
                where="virtual_stages",
                fix="set schedule='interleaved' or virtual_stages=1",
            )
        if self.sequence_parallel and self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)
        check_fusions(self.fusions, self.tp)
        if ASYNC_TP in self.fusions and not self.sequence_parallel:
            raise AutoparError(
                f"fusion 'async_tp' with tp={self.tp} and no sequence parallelism: it overlaps "
                "the sequence-parallel all-gathers and reduce-scatters with their GEMMs, and "
                "there are none to overlap",
                where="fusions",
                fix="plan tp > 1 with sequence_parallel=True, or drop 'async_tp'")
        self._check_experts()

    def _check_experts(self) -> None:
        """The experts' mesh fits the ranks it folds over (``expert_ranks``)."""
        if self.tp % self.etp:
            raise AutoparError(
                f"etp={self.etp} does not divide tp={self.tp}: expert tensor parallelism splits "
                "each expert over ranks of the attention's tensor-parallel group",
                where="etp", fix=f"choose etp among the divisors of tp={self.tp}")
        if self.etp > 1 and not self.experts_fold_tp:
            raise AutoparError(
                f"etp={self.etp} without sequence parallelism: the tp ranks then hold the same "
                "tokens, and the engine splits an expert over ranks that each route their own",
                where="etp", fix="set sequence_parallel=True, or etp=1")
        ranks = self.expert_ranks
        if ranks % (self.ep * self.etp):
            over = "dp*cp*tp" if self.experts_fold_tp else "dp*cp"
            raise AutoparError(
                f"ep={self.ep} x etp={self.etp} does not divide the {ranks} ranks ({over}) the "
                "experts' mesh folds over",
                where="ep",
                fix=(f"choose ep x etp among the divisors of {ranks}"
                     + ("" if self.experts_fold_tp or self.tp == 1 else
                        ", or set sequence_parallel=True so ep may span the tp ranks too")))

    @property
    def experts_fold_tp(self) -> bool:
        """Whether the experts' mesh spans the tp ranks: under sequence parallelism each tp rank
        holds its own tokens (its shard of the sequence) and routes them itself."""
        return self.tp > 1 and self.sequence_parallel

    @property
    def expert_ranks(self) -> int:
        """Ranks of one pipeline stage the experts' mesh (expert dp x ep x etp) folds over."""
        return self.dp * self.cp * (self.tp if self.experts_fold_tp else 1)

    @property
    def edp(self) -> int:
        """Expert data-parallel degree: ranks holding the same expert shard."""
        return self.expert_ranks // (self.ep * self.etp)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def checkpoint_of(self, num_blocks: int) -> tuple[Checkpoint, ...]:
        """The policy of each of ``num_blocks`` blocks."""
        if isinstance(self.checkpoint, tuple):
            if len(self.checkpoint) != num_blocks:
                raise AutoparError(
                    f"checkpoint lists {len(self.checkpoint)} policies for a model of "
                    f"{num_blocks} blocks",
                    where="checkpoint",
                    fix=f"give one policy, or exactly {num_blocks}",
                )
            return self.checkpoint
        return (self.checkpoint,) * num_blocks

    def microbatches(self, train: TrainSpec) -> int:
        """Micro-batches per step on one pipeline; raises if the batch does not divide."""
        per_replica, rest = divmod(train.global_batch, self.dp * self.micro_batch)
        if self.num_microbatches is not None:
            if self.num_microbatches * self.dp * self.micro_batch != train.global_batch:
                raise AutoparError(
                    f"num_microbatches={self.num_microbatches} x dp={self.dp} x "
                    f"micro_batch={self.micro_batch} != global_batch={train.global_batch}",
                    where="num_microbatches",
                    fix="leave num_microbatches unset, or make the product equal the batch",
                )
            return self.num_microbatches
        if rest or per_replica == 0:
            raise AutoparError(
                f"global_batch={train.global_batch} is not a multiple of dp={self.dp} x "
                f"micro_batch={self.micro_batch}",
                where="global_batch / micro_batch",
                fix="pick a micro-batch size and dp whose product divides the global batch",
            )
        return per_replica

    @classmethod
    def from_dict(cls, data: dict) -> ParallelConfig:
        """Inverse of ``to_dict``; unknown keys are an error naming the key."""
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise AutoparError(f"unknown ParallelConfig field {key!r}", where=key,
                                   fix=f"use fields among {', '.join(sorted(known))}")
        d = dict(data)
        if isinstance(d.get("checkpoint"), list):
            d["checkpoint"] = tuple(d["checkpoint"])
        if "fusions" in d:
            d["fusions"] = tuple(d["fusions"])
        return cls(**d)

    def with_(self, **changes: object) -> ParallelConfig:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = [str(v) if isinstance(v, StrEnum) else v for v in value]
            elif isinstance(value, StrEnum):
                value = value.value
            out[f.name] = value
        return out


def parse_checkpoint(value: str | Sequence[str]) -> Checkpoint | tuple[Checkpoint, ...]:
    """A CLI or JSON checkpoint value: one policy, or a comma-separated list per block."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if len(parts) == 1:
            return _choice(Checkpoint, parts[0], "checkpoint")  # type: ignore[return-value]
        value = parts
    return tuple(_choice(Checkpoint, v, "checkpoint") for v in value)  # type: ignore[misc]
