"""The experts' mesh folded over the attention's, and ep over cp, against the single-process
reference.

Under sequence parallelism with tp > 1 every MoE layer runs on its tp rank's own tokens and the
experts' mesh spans the dp x cp x tp ranks (``ParallelConfig.experts_fold_tp``,
``passes/expert_parallel.py``); under context parallelism a zoo MoE layer decides its capacity
slots and its load-balancing loss over the call's tokens, which the cp (and tp) ranks hold
together (``SplitCall``). Each case plans with ``autopar.plan_for`` and runs
``autopar.verify.run`` (gloo CPU processes and one plain process, three steps from one seed),
with verify's fp32 tolerances (``autopar.verify.run.TOLERANCES``: loss 1e-5 relative, gradients
1e-3 of each tensor's largest entry, parameters 1e-2 of the optimizer's largest move).

Measured on this machine (fp32, 3 steps; loss relative / gradients of the tensor max /
parameters of the optimizer's move): tp2 x ep4 fold (dp 2) tiny-moe 2.1e-8 / 3.9e-6 / 2.2e-4,
the same with the norms sequence-parallel 2.1e-8 / 3.9e-6 / 1.8e-4, tiny-deepseek 6.5e-8 /
5.7e-6 / 1.9e-4; cp2 x ep2 tiny-moe 4.3e-8 / 7.5e-7 / 3.3e-4, tiny-deepseek 8.6e-8 / 1.8e-6 /
7.3e-5; cp2 x tp2 + SP x ep4 tiny-moe 4.3e-8 / 2.0e-6 / 3.7e-4; pp2 x tp2 + SP x ep2 tiny-moe
4.3e-8 / 3.7e-6 / 2.3e-4 -- far inside the tolerances. Without the call's routing over the cp
ranks (each rank's capacity and load-balancing loss over its own chunks), cp2 x ep2 tiny-moe
fails (see ``test_the_call_split_is_what_makes_cp_exact``'s docstring).

tiny-moe drops tokens (capacity factor 1.25) and trains with the load-balancing loss, so its
cases exercise the call's slots and fractions; tiny-deepseek is dropless with shared experts
(the dense MLP they are, split by tp over the rank's tokens) and a dense first layer.
"""

from __future__ import annotations

import dataclasses

import pytest

from autopar.core.layout import Style
from autopar.models.training import ModelSpec
from autopar.verify.run import verify
from plans import process_plan

MOE = ModelSpec("tiny-moe")  # capacity 1.25, load-balancing loss 0.01
DEEPSEEK = ModelSpec("tiny-deepseek")  # dropless, shared experts, a dense first layer

FOLD = dict(tp=2, sequence_parallel=True)
CASES = {
    # ep spans the tp and the dp ranks: every rank owns E/4 experts
    "tp2xep4-fold-moe": (MOE, dict(dp=2, ep=4, micro_batch=1, **FOLD), 4),
    "tp2xep4-fold-deepseek": (DEEPSEEK, dict(dp=2, ep=4, micro_batch=1, **FOLD), 4),
    # ep 1: the tp ranks hold the same experts and route their own tokens to them
    "tp2-fold-ep1-moe": (MOE, dict(micro_batch=2, **FOLD), 4),
    # ep over cp (two rows a micro-batch: the call's tokens in one-process order)
    "cp2xep2-moe": (MOE, dict(cp=2, ep=2, micro_batch=2), 4),
    "cp2xep2-deepseek": (DEEPSEEK, dict(cp=2, ep=2, micro_batch=1), 2),
    "cp2xtp2-sp-ep4-moe": (MOE, dict(cp=2, ep=4, micro_batch=2, **FOLD), 4),
    # ZeRO-3 over the experts' edp ranks (tp ranks among them), and pipelining
    "ep-fold-zero3-moe": (MOE, dict(dp=2, ep=2, zero=3, micro_batch=1, **FOLD), 4),
    "ep-fold-zero3-deepseek": (DEEPSEEK, dict(dp=2, ep=2, zero=3, micro_batch=1, **FOLD), 4),
    "ep-fold-pp2-moe": (MOE, dict(pp=2, ep=2, micro_batch=1, **FOLD), 4),
    "ep-fold-pp2-deepseek": (DEEPSEEK, dict(pp=2, ep=2, zero=1, micro_batch=1, **FOLD), 4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_folded_and_context_parallel_experts_match_one_process(case):
    spec, fields, batch = CASES[case]
    result = verify(spec, process_plan(spec, fields, batch), steps=3)
    assert result.passed, result.table()
    ep = fields.get("ep", 1)
    if ep > 1:
        assert 1 / ep <= result.ep_busiest_share <= 1, result.table()


def test_the_fold_runs_the_same_with_a_sequence_parallel_residual_stream():
    """The plan's norms sequence-parallel: the MoE layer takes the rank's shard as it comes
    (no slice, no gather after), where the planner's own plan keeps the residual whole and the
    layer slices its input and gathers its output."""
    plan = process_plan(MOE, dict(dp=2, ep=4, micro_batch=1, **FOLD), 4)
    styles = {k: (Style.SEQUENCE if k.endswith("norm") or k == "norm_f" else v)
              for k, v in plan.module_strategies}
    plan = dataclasses.replace(plan, module_strategies=tuple(styles.items()))
    result = verify(MOE, plan, steps=3)
    assert result.passed, result.table()
