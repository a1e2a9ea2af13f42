"""The experts' mesh folded over the attention's, and ep over cp, against the single-process
reference.

Under sequence parallelism with tp > 1 every MoE layer runs on its tp rank's own tokens and the
experts' mesh spans the dp x cp x tp ranks (``ParallelConfig.experts_fold_tp``,
``passes/expert_parallel.py``); under context parallelism a zoo MoE layer decides its capacity
slots and its load-balancing loss over the call's tokens, which the cp (and tp) ranks hold
together (``SplitCall``). The cases are ``tests/dist/test_parity.py``'s (its ``CASES``, "the experts' fold"): each plans
with ``autopar.plan_for`` and runs ``autopar.verify.run`` (gloo CPU processes and one plain process, three steps from one seed),
with verify's fp32 tolerances (``autopar.verify.run.TOLERANCES``: loss 1e-5 relative, gradients
1e-3 of each tensor's largest entry, parameters 1e-2 of the optimizer's largest move).

Measured on this machine (fp32, 3 steps; loss relative / gradients of the tensor max /
parameters of the optimizer's move): tp2 x ep4 fold (dp 2) tiny-moe 2.1e-8 / 3.9e-6 / 2.2e-4,
the same with the norms sequence-parallel 2.1e-8 / 3.9e-6 / 1.8e-4, tiny-deepseek 6.5e-8 /
5.7e-6 / 1.9e-4; cp2 x ep2 tiny-moe 4.3e-8 / 7.5e-7 / 3.3e-4, tiny-deepseek 8.6e-8 / 1.8e-6 /
7.3e-5; cp2 x tp2 + SP x ep4 tiny-moe 4.3e-8 / 2.0e-6 / 3.7e-4; pp2 x tp2 + SP x ep2 tiny-moe
4.3e-8 / 3.7e-6 / 2.3e-4 -- far inside the tolerances. Without the call's routing over the cp
ranks (each rank's capacity and load-balancing loss over its own chunks), cp2 x ep2 tiny-moe
fails (``test_the_call_split_is_what_makes_cp_exact``).

tiny-moe drops tokens (capacity factor 1.25) and trains with the load-balancing loss, so its
cases exercise the call's slots and fractions; tiny-deepseek is dropless with shared experts
(the dense MLP they are, split by tp over the rank's tokens) and a dense first layer.
"""

from __future__ import annotations

import dataclasses

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.core.layout import Style
from autopar.costmodel.cluster import process_cluster
from autopar.models.training import ModelSpec
from autopar.verify.run import verify
from plans import process_plan

MOE = ModelSpec("tiny-moe")  # capacity 1.25, load-balancing loss 0.01
FOLD = dict(tp=2, sequence_parallel=True)


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


UNSPLIT = """
import os

import torch

import autopar
from autopar.models.moe.model import MoELayer


class Unsplit(MoELayer):
    # the ranks' layers never see the call's other tokens: capacity and the load-balancing
    # loss over each rank's own chunks
    call_tokens = property(lambda self: None, lambda self, value: None)


def make():
    config = autopar.models.make_config("tiny-moe")
    model = autopar.models.from_config(config, device=torch.get_default_device())
    if "RANK" in os.environ:  # in the ranks only: the reference builds the model as it is
        for layer in model.modules():
            if isinstance(layer, MoELayer):
                layer.__class__ = Unsplit
    return model
"""


def test_the_call_split_is_what_makes_cp_exact(tmp_path):
    """cp2 x ep2 with each rank's MoE layers deciding capacity and the load-balancing loss
    over its own chunks (no ``SplitCall``) computes another function, and verify fails it."""
    (tmp_path / "unsplit.py").write_text(UNSPLIT)
    spec = ModelSpec.parse(f"{tmp_path / 'unsplit.py'}:make")
    config = ParallelConfig(cp=2, ep=2, micro_batch=2)
    train = TrainSpec(global_batch=4, seq_len=32, precision="fp32")
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2), train, config,
                            model_spec=spec)
    result = verify(None, plan, steps=3)
    assert not result.passed, result.table()
    assert result.losses != result.reference_losses, result.table()
