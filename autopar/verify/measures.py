"""How ``autopar verify`` compares a program with its reference, and the bounds it holds it to.

Three quantities: the loss of every step, the gradient of every parameter at the last step,
and every parameter after the last step. How they are measured depends on the precision.

**fp32.** The sharded program does the reference's arithmetic in another order -- all-reduces,
reduce-scatters, matmuls split over ranks, losses averaged per micro-batch -- so the
differences are rounding, and absolute measures with fixed bounds (``TOLERANCES``) hold:

* the loss relative to the reference's;
* each gradient relative to its tensor's largest entry (a tensor of small values is not judged
  by noise in its zeros);
* each parameter in units of the optimizer's largest move, ``lr x steps`` (AdamW moves a weight
  by at most about ``lr`` per step whatever the gradient's scale; a relative measure would judge
  zero-initialised biases, which after a few steps are themselves a few ``lr``, by the rounding
  of gradients that Adam divides by their own size).

Measured over the property-based run (``bench/results/fuzz_verify.md``: 49 fp32 cases of random
shapes and plans), the largest were 1.1e-7 (loss), 1.9e-5 (gradients) and 8.8e-4 (parameters);
the bounds sit 10 to 90 times above. A wrong program (a missing all-reduce, a wrong scale, a
misplaced shard) changes gradients by O(1) of their size: a swapped tp shard of one weight
measures 1.7 on the gradients (tests/dist/test_parity.py), 1700 times the bound.

**bf16, fp16, bf16-pure.** Rounding to 8 (bf16) or 11 (fp16) bits of mantissa on different
batch slices and in another order makes differences that no fixed bound separates from a bug:
a gradient that is a sum of terms cancelling each other (a bias, a small model) has a rounding
error as large as itself, and Adam turns a rounded near-zero gradient into a full step of either
sign. So the program is measured against the error the precision itself makes: the reference is
run twice, once in the plan's precision (as FSDP's mixed precision computes) and once in fp32,
the exact answer, and each quantity's error from the exact answer is divided by the
low-precision reference's own error from it (``Measure.PRECISION``; the larger of two such
references, the second with its low-precision weights one unit in the last place off and the
micro-batches summed in reverse order: two samples of the rounding, which also move a mixture
of experts' near-ties between experts as the program's own rounding does), that error floored at the
precision's unit roundoff times the quantity (``UNIT_ROUNDOFF``; a loss, a gradient tensor's
norm, a parameter tensor's update norm) and, for parameters, at ``ADAM_FLIP_LR``; per tensor, in
L2 norms. A correct program errs about
as much as one process at the same precision: a ratio of order 1. A wrong one errs by the
quantity itself: a ratio of order 1 / unit roundoff (256 for bf16). Measured over the
property-based run (69 bf16, fp16 and bf16-pure cases): medians 1.0, the largest 4.2 (fp16
gradients) and 3.8 (bf16 parameters); the swapped tp shard measures 51 (bf16), 355 (fp16) and 57
(bf16-pure) on the gradients. The bound, 8, sits between.

**fp8** (torchao's float8 linears on bf16, ``passes/float8.py``) is measured the same way, the
one-process references converting the same linears: over the six cases of
``tests/dist/test_fp8_parity.py`` (dp, tp + SP, pp, ZeRO-3 with the FP8 all-gather, rowwise,
a mixture of experts under ep) the ratios were at most 0.002 (loss), 1.08 (gradients) and
1.37 (parameters); the swapped tp shard measures 15.3 on the gradients and 67.5 on the
parameters -- FP8's own error is larger than bf16's, so the margin is narrower, and both
quantities are checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from autopar.core.specs import Precision
from autopar.core.plan import Plan
from autopar.verify.reference import Run


class Measure(StrEnum):
    """How one quantity is compared (the table's "measured as")."""

    RELATIVE = "relative"
    """|loss - reference| / |reference|, the largest over the steps."""
    TENSOR_MAX = "/ tensor max"
    """|grad - reference| / max|reference|, the largest over the tensors."""
    MOVES = "/ (lr x steps)"
    """|param - reference| / (lr x steps), the largest over the tensors."""
    PRECISION = "x 1-process error"
    """|x - exact| / max(|reference - exact|, unit roundoff x |exact|): the program's error
    from the fp32 answer over the one-process low-precision reference's (module docstring)."""


@dataclass(frozen=True)
class Tolerance:
    """Bounds on the three quantities' measures."""

    loss: float
    grads: float
    params: float
    against_precision: bool = False
    """Low precision: every quantity is ``Measure.PRECISION``."""

    def measure(self, quantity: str) -> Measure:
        if self.against_precision:
            return Measure.PRECISION
        return {"loss": Measure.RELATIVE, "grads": Measure.TENSOR_MAX,
                "params": Measure.MOVES}[quantity]


# fp32: measured at most 1.1e-7, 1.9e-5, 8.8e-4 over bench/results/fuzz_verify.md; a swapped
# shard measures 1.7 on the gradients.
_FP32 = Tolerance(loss=1e-5, grads=1e-3, params=1e-2)
# low precision: ratios to the one-process error, measured at most 4.2 over the same run; a
# swapped shard measures 51 (bf16) to 355 (fp16) on the gradients.
_LOW = Tolerance(loss=8.0, grads=8.0, params=8.0, against_precision=True)
TOLERANCES = {Precision.FP32: _FP32, Precision.BF16: _LOW, Precision.FP16: _LOW,
              Precision.BF16_PURE: _LOW, Precision.FP8: _LOW}
"""Bounds per precision; see the module docstring."""

UNIT_ROUNDOFF = {Precision.BF16: 2.0**-8, Precision.BF16_PURE: 2.0**-8,
                 Precision.FP16: 2.0**-11, Precision.FP8: 2.0**-4}
"""Half the gap between 1 and the next number: 8 and 11 significant bits; fp8: e4m3's 4 (its
GEMMs' inputs; the rest of an fp8 step is bf16, whose rounding the references' errors hold)."""

ADAM_FLIP_LR = 0.5
"""Least error credited to the references for a low-precision parameter tensor, in ``lr``.
Adam moves an element whose gradient is within rounding of zero by up to one ``lr`` per step
either way, so which elements of a small tensor go the other way is luck, and both references
may happen to have none: at the bound of 8 this floor lets the program move two elements of a
tensor the other way in one step each (an error of ``4 lr``) when the references moved none.
It still fails a tensor left without its update, an error of about ``lr x steps x sqrt(size)``:
a ratio of 12 or more for the three steps of ``autopar verify`` on a tensor of 16 elements."""


@dataclass(frozen=True)
class Diff:
    max_abs: float
    measure: float
    """What the tolerance bounds (see ``Measure``)."""
    where: str
    """The tensor with the largest measure ("-" for the loss)."""


GRADIENT_FLOOR = 1e-3
"""Least scale of a gradient tensor under ``Measure.TENSOR_MAX``, as a fraction of the largest
gradient entry of the model. A gradient that is zero in exact arithmetic -- a key projection's
bias, whose shift every query's softmax cancels -- comes out as rounding noise of its sums,
and over its own largest entry that noise is of order 1: nanoGPT's ``attn.k.bias`` under tp 2
differs from the one-process run by 2.9e-8 with entries of 2e-8, a measure of 1.41 against
the bound of 1e-3. Over this floor a tensor is held to 1e-6 of the model's largest gradient
entry; every tensor with real gradients keeps its own scale."""


def compare(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
            unit: float | None = None) -> Diff:
    """Largest difference over the tensors ``ref`` and ``got`` share: over ``unit`` when
    given (``Measure.MOVES``), else over each reference tensor's largest entry, at least
    ``GRADIENT_FLOOR`` of the largest of all (``Measure.TENSOR_MAX``)."""
    worst, where, max_abs = 0.0, "-", 0.0
    floor = 1e-30 if unit is not None else max(
        (GRADIENT_FLOOR * r.abs().max().item() for r in ref.values() if r.numel()),
        default=0.0)
    for name, r in ref.items():
        if name not in got or not r.numel():  # a weight of no elements differs in nothing
            continue
        d = (got[name] - r).abs().max().item()
        scale = unit if unit is not None else max(r.abs().max().item(), floor, 1e-30)
        max_abs = max(max_abs, d)
        if d / scale > worst or where == "-":
            worst, where = d / scale, name
    return Diff(max_abs, worst, where)


def compare_to_precision(got: dict[str, torch.Tensor], lows: list[dict[str, torch.Tensor]],
                         exact: dict[str, torch.Tensor], floor: dict[str, float]) -> Diff:
    """``Measure.PRECISION`` over the tensors the program and the exact run hold; ``lows``
    are the low-precision reference runs (their largest error is the precision's), ``floor``
    each tensor's least error credited to them."""
    worst, where, max_abs = 0.0, "-", 0.0
    for name, x in exact.items():
        if name not in got or any(name not in low for low in lows) or not x.numel():
            continue
        error = _norm(got[name] - x)
        own = max(*(_norm(low[name] - x) for low in lows), floor[name], 1e-30)
        max_abs = max(max_abs, (got[name] - lows[0][name]).abs().max().item())
        # a reference that overflowed (fp16: its loss scaler skips the step) shows that one
        # process at this precision may: its error is unbounded, the program's within it
        ratio = 1.0 if math.isinf(error) and math.isinf(own) else error / own
        if ratio > worst or where == "-":
            worst, where = ratio, name
    return Diff(max_abs, worst, where)


def _norm(t: torch.Tensor) -> float:
    """The norm of a difference, infinite where it holds an inf or a NaN (an overflow): a NaN
    would compare as neither larger nor smaller than any bound."""
    value = t.norm().item()
    return value if math.isfinite(value) else math.inf


def measure_run(losses: list[float], grads: dict[str, torch.Tensor],
                params: dict[str, torch.Tensor], refs: list[Run], exact: Run | None,
                precision: Precision, lr: float, steps: int) -> tuple[Diff, Diff, Diff]:
    """(loss, gradients, parameters) of a program's run against its references ``refs`` (the
    plan's precision; the first one in the ranks' order) and, for low precision, the fp32
    ``exact`` run, after ``steps`` optimizer steps of learning rate ``lr``."""
    ref = refs[0]
    loss_abs = max(abs(a - b) for a, b in zip(losses, ref.losses))
    if exact is None:
        rel = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, ref.losses))
        return (Diff(loss_abs, rel, "-"), compare(grads, ref.grads),
                compare(params, ref.params, unit=lr * steps))
    u = UNIT_ROUNDOFF[precision]
    loss = max(abs(a - x) / max(*(abs(r.losses[s] - x) for r in refs), u * abs(x), 1e-30)
               for s, (a, x) in enumerate(zip(losses, exact.losses)))
    grad_floor = {n: u * g.norm().item() for n, g in exact.grads.items()}
    param_floor = {n: max(u * (p - exact.initial[n]).norm().item(), ADAM_FLIP_LR * lr)
                   for n, p in exact.params.items()}
    return (Diff(loss_abs, loss, "-"),
            compare_to_precision(grads, [r.grads for r in refs], exact.grads, grad_floor),
            compare_to_precision(params, [r.params for r in refs], exact.params, param_floor))


@dataclass
class VerifyResult:
    plan: Plan
    model: str
    nproc: int
    steps: int
    reference_losses: list[float]
    losses: list[float]
    loss: Diff
    grads: Diff
    params: Diff
    tolerance: Tolerance
    wall_s: float
    missing: list[str] = field(default_factory=list)
    """Reference parameters the sharded program did not report (a failure)."""
    ep_busiest_share: float | None = None
    """Expert parallelism: the busiest ep rank's share of its group's routed assignments over
    the run (``passes.expert_parallel.ep_load``; 1/ep is a perfect balance). Times ep it is the
    measured load imbalance, ``costmodel/efficiency.py``'s ``moe_load_imbalance``."""
    dropout_off: dict[str, float] = field(default_factory=dict)
    """The model's dropout probabilities both sides ran at 0 instead (``verify_dropout``)."""

    @property
    def passed(self) -> bool:
        t = self.tolerance
        return (not self.missing and self.loss.measure <= t.loss
                and self.grads.measure <= t.grads and self.params.measure <= t.params)

    def table(self, width: int = 110) -> str:
        """The result as a person reads it (``autopar.report.verify``)."""
        from autopar.report.verify import verify_table

        return verify_table(self, width)
