"""The single-process reference ``autopar verify`` compares a plan's program with.

``reference(spec, plan, steps, seed, precision)`` trains the whole model in one process on the
global batch, as the ranks' micro-batches (``microbatches``), and returns a ``Run``: the loss of
every step, the gradients of the last step, the parameters before the first step and after the
last. Low-precision plans are compared with three such runs: one in the plan's precision, one
in fp32 (the exact answer they all err from), and one more in the plan's precision with the
weights one rounding off and the micro-batches in reverse order -- two samples of what the
precision's rounding alone does (``verify_measures``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch
from torch import nn

from autopar.core.errors import AutoparError
from autopar.core.specs import Precision
from autopar.core.model_spec import ModelSpec
from autopar.models import prepare_training, set_aux_loss_grad_scale
from autopar.passes.data_parallel import COMPUTE_DTYPE, REDUCE_DTYPE
from autopar.passes.float8 import apply_float8
from autopar.passes.program import model_blocks_of
from autopar.core.plan import Plan
from autopar.models.feed import logits_of
from autopar.models.training import LOSS_SCALING, loss_of, optimizer, synthetic_inputs

@dataclass(frozen=True)
class Run:
    """What one training run gives to compare."""

    losses: list[float]
    """Mean loss of every step over the global batch."""
    grads: dict[str, torch.Tensor]
    """Gradient of every parameter at the last step, before the optimizer (fp32)."""
    initial: dict[str, torch.Tensor]
    """Every parameter before the first step (fp32)."""
    params: dict[str, torch.Tensor]
    """Every parameter after the last step (fp32)."""


def microbatches(plan: Plan, rows: int) -> list[slice]:
    """The row slices of one global batch as the ranks run them: data-parallel rank ``r``
    reads rows ``r * R .. (r + 1) * R`` (``R = rows / dp``) and runs them in micro-batches of
    ``micro_batch`` rows, in order -- ``dp x num_microbatches`` consecutive slices."""
    c = plan.config
    n = c.dp * c.microbatches(plan.train)
    size = rows // n
    return [slice(k * size, (k + 1) * size) for k in range(n)]


@torch.no_grad()
def _one_ulp_to_zero(model: torch.nn.Module) -> None:
    """Every floating parameter one representable step closer to zero."""
    for p in model.parameters():
        if p.is_floating_point():
            p.copy_(torch.nextafter(p, torch.zeros_like(p)))


def _accumulate(model: torch.nn.Module, runner: torch.nn.Module, factor: float,
                dtype: torch.dtype) -> None:
    """Add the low-precision copy's gradients times ``factor``, in ``dtype``, to the masters'
    and clear them: what FSDP's ``MixedPrecisionPolicy(reduce_dtype=dtype)`` does with each
    micro-batch's gradient (it reduces -- averages over dp -- in ``dtype``, and accumulates in
    it while gradient sync is off; ``TrainSpec.grad_dtype``), the sum kept in fp32 once made
    (FSDP casts the reduced shard to the master's dtype)."""
    for master, p in zip(model.parameters(), runner.parameters()):
        if p.grad is None:
            continue
        grad = p.grad.to(dtype) * factor
        total = grad if master.grad is None else master.grad.to(dtype) + grad
        master.grad = total.float()
        p.grad = None


def _forward(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The model's logits for ``tokens``; an error inside the model's own code (a user's
    ``FILE.py`` model run on longer sequences than its position table holds, say) is told as
    what it is, not as a traceback out of autopar."""
    try:
        return logits_of(model, tokens)
    except AutoparError:
        raise
    except Exception as err:  # the model's code, not autopar's
        run = "run the model once on such a batch yourself to see the traceback"
        if tokens.dim() == 2:
            rows, seq = tokens.shape
            what = f"{rows} x {seq} tokens"
            fix = (f"check that the model takes sequences of {seq} tokens (a learned position "
                   f"table or a causal-mask buffer sets its longest) and pass --seq-len N; {run}")
        else:  # an image model's pixel values (feed.py)
            what, fix = f"{tokens.shape[0]} images of {' x '.join(map(str, tokens.shape[1:]))}", run
        raise AutoparError(
            f"the model's own forward failed on a batch of {what}: {type(err).__name__}: {err}",
            where="the one-process reference run of verify", fix=fix) from err


def reference(spec: ModelSpec, plan: Plan, steps: int, seed: int,
              precision: Precision | None = None, *, resample: bool = False) -> Run:
    """One process, whole model, the global batch in the ranks' micro-batches, in
    ``precision`` (default: the plan's). ``resample`` draws another sample of what the
    precision's rounding does: the micro-batches summed last first, and the low-precision
    weights one unit in the last place closer to zero than round-to-nearest makes them -- a
    difference of the rounding's own size everywhere in the forward, which moves what rounding
    moves (a mixture of experts' near-tie between two experts included).

    The batch is run micro-batch by micro-batch as the ranks run it, each loss averaged over
    them: the same arithmetic up to the order of the sums, and the same tokens in each forward,
    which a model whose forward mixes the tokens of a batch needs (a mixture of experts computes
    its experts' capacity from the tokens of the call).

    bf16/fp16 do what FSDP's ``MixedPrecisionPolicy`` does: each step runs forward and backward
    on a low-precision copy of the fp32 master weights, differentiating each micro-batch's loss
    as a rank does (so its low-precision gradients have the rank's magnitude: they overflow
    fp16 where the rank's do), and the gradients are averaged and accumulated in fp32 on the
    masters, which they update; fp8 runs its copy's chosen linears in FP8 as the program does
    (``passes/float8.py``); fp16 scales the loss as the program does (``torch.amp.GradScaler`` with
    ``training.LOSS_SCALING``, ``passes/loss_scaling.py``). bf16-pure casts the model."""
    torch.set_flush_denormal(True)
    precision = plan.train.precision if precision is None else precision
    model = spec.build("cpu", seed)
    prepare_training(model)  # as ``autopar.parallelize`` does on the ranks
    train = plan.train
    if precision is Precision.BF16_PURE:
        model = model.to(torch.bfloat16)
    low = COMPUTE_DTYPE.get(precision)
    scaler = (torch.amp.GradScaler("cpu", **LOSS_SCALING)
              if precision is Precision.FP16 else None)
    opt = optimizer(list(model.parameters()))
    losses, grads = [], {}
    named = dict(model.named_parameters(remove_duplicate=False))
    initial = {n: p.detach().float().clone() for n, p in named.items()}
    if resample and precision is Precision.BF16_PURE:
        _one_ulp_to_zero(model)
    chunks = microbatches(plan, train.global_batch)
    # what a rank differentiates: its loss over its micro-batches (pipelining: each one's loss,
    # the schedule divides the gradients after); the dp mean is FSDP's reduction, in fp32
    rank_scale = 1.0 if plan.config.pp > 1 else 1.0 / plan.config.microbatches(train)
    if resample:
        chunks.reverse()
    for step in range(steps):
        tokens, targets = synthetic_inputs(model, step, train.global_batch, train.seq_len, seed)
        runner = copy.deepcopy(model).to(low) if low is not None else model
        if resample and runner is not model:
            _one_ulp_to_zero(runner)
        if precision is Precision.FP8:  # the same linears in FP8 as the program's
            apply_float8(model_blocks_of(runner), replace(train, precision=precision),
                         fsdp=False)
        total = 0.0
        # the routers' load-balancing loss is differentiated with the loss's own scale
        aux_scale = ((1.0 / len(chunks) if runner is model else rank_scale)
                     * (1.0 if scaler is None else float(scaler.get_scale())))
        set_aux_loss_grad_scale(runner, aux_scale)
        for rows in chunks:
            loss = loss_of(_forward(runner, tokens[rows]).float(), targets[rows])
            # the masters' gradient is the mean over all chunks; a low-precision copy
            # differentiates the loss as a rank does and scales it in fp32 after
            scaled = loss / len(chunks) if runner is model else loss * rank_scale
            (scaled if scaler is None else scaler.scale(scaled)).backward()
            total += loss.item()
            if runner is not model:  # FSDP accumulates micro-batches in its reduce_dtype
                _accumulate(model, runner, 1.0 / (len(chunks) * rank_scale),
                            REDUCE_DTYPE[train.grad_dtype])
        if scaler is not None:
            scaler.unscale_(opt)
        losses.append(total / len(chunks))
        if step == steps - 1:
            grads = {n: p.grad.detach().float().clone() for n, p in named.items()
                     if p.grad is not None}
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)
    params = {n: p.detach().float().clone() for n, p in named.items()}
    return Run(losses, grads, initial, params)
