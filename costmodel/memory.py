"""Memory per GPU: model states by ZeRO stage and precision, activations by checkpoint policy.

What one GPU of a stage holds at its peak -- FSDP2's states at the moment the peak occurs --
is ``peak.py``'s; this module sizes the parts. ``model_state_bytes`` follows Rajbhandari et
al. (ZeRO, SC'20): with mixed precision each parameter costs
2 bytes of weights, 2 of gradients and K = 12 of optimizer state (fp32 master weights, Adam
momentum and variance); stage 1 shards the optimizer state over the data-parallel ranks, stage 2
also the gradients, stage 3 also the weights.

Activations are the tensors a layer keeps for its backward pass (``SavedTensor``), as derived
from the traced graph, under each checkpoint policy as ``passes/checkpointing.py`` runs it:

* ``none``: what autograd saves. For a GPT block with eager attention and dropout this is
  Korthikanti et al. (2022): per layer ``s*b*h*(34 + 5*a*s/h)`` bytes without parallelism,
  ``s*b*h*(10 + 24/t + 5*a*s/(h*t))`` with tensor parallelism, ``s*b*h/t*(34 + 5*a*s/h)``
  adding sequence parallelism -- and, as the engine runs it, the column-parallel linears'
  all-gathered inputs, which DTensor saves whole (``4*s*b*h*(1 - 1/t)`` more for a GPT
  block): the solved block's tensors are sized as their savers hold them (``LayerCost.held``).
* ``selective`` (Korthikanti et al. 2022): what ``none`` keeps but the tensors an unfused
  attention core makes (scores, probabilities, the dropout's mask and output: the
  ``5*a*s^2*b`` bytes), which its recomputation rebuilds; ``34*s*b*h`` bytes (``/t`` with
  tensor + sequence parallelism) for a GPT block. Each kept tensor is sized in its producer's
  layout: the row-parallel linears' outputs reduce-scattered, the column-parallel linears'
  inputs as their sequence shards, which the backward gathers again (``passes/regather.py``;
  ``none`` keeps them gathered, ``LayerCost.held``). With fused attention and no sequence
  parallelism it keeps what ``none`` keeps.
* ``matmuls``: the block input and what the selective-checkpoint policy caches -- the output
  of every linear layer (``aten.mm``/``addmm``) and of fused attention (its output and
  log-sum-exp). For a GPT block in fp16 that is ``2 + 6 + 2 + 8 + 2 = 20*s*b*h`` bytes (input,
  QKV, projection, MLP up, MLP down) plus the attention output ``2*s*b*h`` when attention is
  fused. A row-parallel linear's output is cached before its all-reduce (or reduce-scatter):
  the full-size partial sum, divided neither by tp nor by sequence parallelism.
* ``full``: the block input, ``2*s*b*h`` (``/t`` with SP).
* ``moe`` (Megatron-Core's ``--recompute-modules moe``): what ``none`` keeps but the tensors
  made inside the mixture-of-experts layers and saved only by their ops (``SavedTensor.
  moe_layer``: router scores, the dispatched rows, the experts' activations), which the layer's
  recomputation rebuilds; the layer's input, made outside it, stays kept.

Fused kernels (``ParallelConfig.fusions``) keep what their autograd saves, for every policy: the
norms and GELU their input (the statistics are recomputed), SwiGLU gate and up (not silu(gate)),
RoPE nothing but its tables. The fused loss (``linear_cross_entropy``) keeps the gradients it
computed in the forward, of the hidden state (tokens x hidden) and of the head's weight (vocab x
hidden, a buffer per micro-batch in flight whatever its size), instead of the eager loss's fp32
log-probabilities (tokens x vocab); while it runs the eager loss also holds their gradient and
the logits' (8 bytes per logit, ``transient_bytes``), the fused one a chunk of logits.

Under context parallelism an attention also keeps the whole sequence's K and V
(``gathered_kv_bytes``) and the concatenation of its two query chunks' outputs
(``cp_output_bytes``); under pipelining the stage keeps each chunk's output of every micro-batch
in flight (``costmodel/stage_memory.py:_stage_sizes``) -- neither on Megatron-Core's engines
(``core.specs.MCORE_ACTIVATIONS``).

``tests/unit/analysis/test_saved_activations.py`` holds these, fused or not, against the bytes the
executed program keeps for tiny models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .compute import Split
from autopar.core.specs import Checkpoint, GradDtype, Optimizer, Precision
from .memo import ByLayer
from .workload import LayerCost, OpKind, SavedTensor, Shard


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter of each model state."""

    weights: float
    grads: float
    optimizer: float
    """Optimizer states plus the fp32 master copy where the policy keeps one."""


def dtype_bytes(precision: Precision, optimizer: Optimizer) -> tuple[float, float, float]:
    """Bytes per parameter of the master copy the optimizer steps on, of the compute copy, and
    of the optimizer's moments (SGD's momentum; Adam's m and v) kept in the master dtype."""
    master = 2.0 if precision is Precision.BF16_PURE else 4.0
    low = 4.0 if precision is Precision.FP32 else 2.0
    return master, low, (1 if optimizer is Optimizer.SGD else 2) * master


def grad_reduce_bytes(precision: Precision, grad_dtype: GradDtype = GradDtype.FP32) -> float:
    """Bytes of a gradient element as the data-parallel ranks reduce it and as the
    accumulators hold it across micro-batches: FSDP2's ``reduce_dtype`` (``TrainSpec.
    grad_dtype`` under a mixed precision; the master dtype otherwise). The reduced shard the
    optimizer steps on is in the master dtype (``dtype_bytes``) whatever this is."""
    master = dtype_bytes(precision, Optimizer.ADAMW)[0]
    mixed = precision.mixed
    return 2.0 if mixed and grad_dtype is not GradDtype.FP32 else master


def state_bytes_per_param(precision: Precision, optimizer: Optimizer) -> StateBytes:
    """Bytes per parameter for a precision policy and optimizer (ZeRO's 2 + 2 + K): the
    optimizer's share holds the master copy where it is not the weights themselves."""
    master, low, moments = dtype_bytes(precision, optimizer)
    mixed = precision.mixed
    return StateBytes(low, low, moments + (master if mixed else 0.0))


def activation_bytes_per_element(precision: Precision) -> float:
    """Bytes of one activation element: the compute dtype's."""
    return dtype_bytes(precision, Optimizer.ADAMW)[1]


ZERO_SHARDS_FROM = {"optimizer": 1, "grads": 2, "params": 3}
"""The ZeRO stage from which each kind of model state is sharded over the data-parallel ranks
(Rajbhandari et al., SC'20: P_os, P_os+g, P_os+g+p)."""


@dataclass(frozen=True)
class ModelStates:
    """Bytes on one GPU."""

    params: float
    grads: float
    optimizer: float


def model_state_bytes(
    params: float,
    expert_params: float,
    sb: StateBytes,
    *,
    zero: int,
    dp: int,
    expert_dp: int,
    offload: bool,
) -> ModelStates:
    """Model-state bytes for ``params`` dense and ``expert_params`` expert parameters on a GPU.

    Dense parameters are sharded by ZeRO over ``dp`` ranks (the data- and context-parallel
    ranks); expert parameters over ``expert_dp`` = dp*cp/ep ranks.
    """

    def sharded(n_dense: float, n_expert: float, per_param: float, on: bool) -> float:
        if not on:
            return (n_dense + n_expert) * per_param
        return (n_dense / dp + n_expert / expert_dp) * per_param

    def kind(name: str, per_param: float) -> float:
        return sharded(params, expert_params, per_param, zero >= ZERO_SHARDS_FROM[name])

    return ModelStates(
        params=kind("params", sb.weights),
        grads=kind("grads", sb.grads),
        optimizer=0.0 if offload else kind("optimizer", sb.optimizer),
    )


def saved_bytes(layer: LayerCost, split: Split, policy: Checkpoint) -> float:
    """Bytes one micro-batch of ``layer`` keeps for the backward pass on one GPU."""
    if policy is Checkpoint.FULL:
        return layer.input_elements * split.act_bytes * split.scale(Shard.SEQ)
    if policy is Checkpoint.MATMULS:
        return _bytes(layer, split, lambda t: t.matmuls)
    if policy.regathers:
        # in the producers' layouts: a gathered input is kept as its shard and gathered again
        # in the backward (passes/regather.py); selective recomputes the attention core, moe
        # what the MoE layers make inside (their input is made outside)
        inside = ((lambda t: t.attention_core) if policy is Checkpoint.SELECTIVE
                  else (lambda t: t.moe_layer))
        return (_bytes(layer, split, lambda t: t.without_checkpoint and not inside(t))
                + gathered_kv_bytes(layer, split) + cp_output_bytes(layer, split))
    kept = layer.held or layer.saved  # as the savers hold them, where the solve walked it
    return (_sized((t for t in kept if t.without_checkpoint), split, fp8_savers(layer, split))
            + gathered_kv_bytes(layer, split) + cp_output_bytes(layer, split))


def cp_output_bytes(layer: LayerCost, split: Split) -> float:
    """What context parallelism adds to what follows an attention: the rank's two query
    chunks attend apart and their outputs are concatenated (``passes/context_parallel.py``),
    so the fused kernels keep the two chunk outputs and the output projection its input, the
    concatenation -- one more copy of the attention's output than the traced model keeps,
    where the projection reads the kernel's output as a view (the dry run of llama3-405b's
    plan at cp 4 finds it in every block). Kept under ``none``, ``selective`` and ``moe``;
    ``matmuls`` recomputes the concatenation, ``full`` keeps neither. Megatron-Core's engines
    write the chunks into one tensor (``Split.mcore_activations``): no copy."""
    if split.cp == 1 or split.mcore_activations:
        return 0.0
    saved = {t.name: t for t in layer.saved}
    total = 0.0
    for op in layer.ops:
        out = saved.get(op.name) if op.kind is OpKind.ATTENTION and op.kv_elements > 0 else None
        if out is not None:
            total += _sized((out,), split)
    return total


def gathered_kv_bytes(layer: LayerCost, split: Split) -> float:
    """What context parallelism adds to what an attention saves for its backward, beyond the
    traced model's (which saved this rank's 1/cp of K and V): the whole sequence's K and V,
    all-gathered (``passes/context_parallel.py``), once per attention and micro-batch. A causal
    attention (``OpCost.causal``) runs each query chunk against the keys up to its end through
    the fused causal kernel, no mask kept (its outputs and row statistics are the traced
    model's, cut in two). An attention the traced model masks explicitly (a sliding window)
    keeps the band's mask of the rank's queries: counted as the whole (s/cp, s) in the query's
    dtype (SDPA's CPU kernel, ``_scaled_dot_product_flash_attention_for_cpu``, saves a bool
    mask as a float one), an upper bound the window does not reach. Kept under ``selective``
    too (the gathering attention is fused); not under ``matmuls``, which keeps the attention's
    output, not its inputs."""
    if split.cp == 1:
        return 0.0
    total = 0.0
    for op in layer.ops:
        if op.kind is not OpKind.ATTENTION or op.kv_elements <= 0:
            continue
        heads = split.tp if op.shard is Shard.TP else 1
        total += (op.kv_elements * split.micro_batch * split.act_bytes / heads
                  * (1.0 - 1.0 / split.cp))
        if split.seq_len is not None and not op.causal:
            total += split.seq_len * split.seq_len / split.cp * split.act_bytes
    return total


def _bytes(layer: LayerCost, split: Split, which: Callable[[SavedTensor], bool]) -> float:
    return _sized((t for t in layer.saved if which(t)), split, fp8_savers(layer, split))


def fp8_savers(layer: LayerCost, split: Split) -> frozenset[str]:
    """The ops of ``layer`` that keep an FP8 copy of their input for the backward instead of
    the input: Transformer Engine's FP8 linears and grouped expert GEMMs
    (``Split.fp8_fused_casts``; TE's ``_Linear`` saves ``inputmat`` or its transpose in FP8 for
    the weight gradient, one byte an element). torchao's float8 linears, autopar's engine's,
    keep the bf16 input (``passes/float8.py``): none."""
    if not (split.fp8 and split.fp8_fused_casts):
        return frozenset()
    return frozenset(op.name for op in layer.ops if op.kind is OpKind.MATMUL
                     and (op.fp8 or op.expert))


def _sized(tensors: Iterable[SavedTensor], split: Split,
           fp8: frozenset[str] = frozenset()) -> float:
    """Bytes of ``tensors`` for one micro-batch on one GPU; ``fp8``: the ops that keep an FP8
    copy of what they save (``fp8_savers``) -- a tensor only they save is kept in one byte an
    element, one that others save too in its dtype and the copy's byte."""
    tensors = list(tensors)
    kept = {t.name for t in tensors}
    total = 0.0
    for t in tensors:
        if t.widened_from is not None and split.act_bytes >= t.bytes_per_element:
            if t.widened_from in kept:
                continue  # fp32 activations: the cast is a view of a tensor counted already
        size = t.bytes_per_element if t.bytes_per_element is not None else split.act_bytes
        if fp8 and t.bytes_per_element is None and t.savers:
            in_fp8 = [s in fp8 for s in t.savers]
            size = 1.0 if all(in_fp8) else size + (1.0 if any(in_fp8) else 0.0)
        scale = split.scale(t.shard) if t.per_token else 1.0 / split.divisor(t.shard)
        total += t.elements * size * scale
    return total


def transient_bytes(layer: LayerCost, split: Split) -> float:
    """Bytes a layer holds only while it runs, beyond what it keeps: the loss's gradient of the
    logits (eager) or its chunk of logits (fused), live once at the stage's peak."""
    return _bytes(layer, split, lambda t: t.transient)


def stage_output_bytes(layer: LayerCost, split: Split) -> float:
    """Bytes of what the loss reads (``SavedTensor.stage_output``) for one micro-batch: a
    pipeline's last stage's output, which the schedule holds while the micro-batch's backward
    runs."""
    return _bytes(layer, split, lambda t: t.stage_output)


def recompute_working_bytes(layer: LayerCost, split: Split, policy: Checkpoint) -> float:
    """Extra bytes live while a recomputed layer runs its backward (one layer at a time): what
    the recomputation rebuilds for autograd beyond what the policy kept."""
    if policy is Checkpoint.NONE:
        return 0.0
    if policy is Checkpoint.MATMULS:
        return (_bytes(layer, split, lambda t: t.without_checkpoint and not t.matmuls)
                + gathered_kv_bytes(layer, split))
    if policy is Checkpoint.SELECTIVE:
        return _bytes(layer, split, lambda t: t.without_checkpoint and t.attention_core)
    if policy is Checkpoint.MOE:  # the MoE layer's internals, rebuilt
        return _sized((t for t in layer.held or layer.saved
                       if t.without_checkpoint and t.moe_layer), split, fp8_savers(layer, split))
    return saved_bytes(layer, split, Checkpoint.NONE) - saved_bytes(layer, split, policy)


def backward_peak(layer: LayerCost, split: Split, policy: Checkpoint, weight_grad_bytes: float
                  ) -> tuple[float, float] | None:
    """(activation bytes, weight-gradient bytes) one GPU holds at the largest moment of one
    micro-batch's backward of ``layer`` beyond what the stage keeps for the layers' backward
    (``LayerCost.backward``; None before the strategy solve walked it): the gradients of
    activations alive, and the saved tensors the recomputation of ``policy`` rebuilt and ops
    still to run hold; ``weight_grad_bytes`` is the layer's whole weight gradient on this GPU.
    """
    if not layer.backward:
        return None
    best: tuple[float, float] | None = None
    fp8 = fp8_savers(layer, split)
    for m, rebuilt in zip(layer.backward, _rebuilt(layer, policy)):
        acts = _sized(m.grads, split) + _sized(rebuilt, split, fp8)
        grads = m.weight_grad_fraction * weight_grad_bytes
        if best is None or acts + grads > sum(best):
            best = (acts, grads)
    return best


_REBUILT = ByLayer(1024)
"""``_rebuilt`` of the layers seen."""


def _rebuilt(layer: LayerCost, policy: Checkpoint) -> tuple[tuple[SavedTensor, ...], ...]:
    """For each moment of ``layer``'s backward, the saved tensors it holds rebuilt by
    ``policy``'s recomputation (``_recomputed``): the same at every split, so found once."""
    return _REBUILT.get(layer, (policy,), lambda: tuple(
        tuple(t for t in m.saved if _recomputed(t, policy)) for m in layer.backward))


def _recomputed(t: SavedTensor, policy: Checkpoint) -> bool:
    """Whether the backward under ``policy`` holds ``t`` rebuilt by recomputation (without
    checkpointing every saved tensor is kept from the forward and priced as kept)."""
    if policy is Checkpoint.FULL:
        return t.without_checkpoint
    if policy is Checkpoint.MATMULS:
        return t.without_checkpoint and not t.matmuls
    if policy is Checkpoint.SELECTIVE:
        return t.without_checkpoint and t.attention_core
    if policy is Checkpoint.MOE:
        return t.without_checkpoint and t.moe_layer
    return False

