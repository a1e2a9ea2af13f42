"""A user's own decoder (``FILE.py:FACTORY``, the generic family: tests/data/nanogpt.py) under
context parallelism, against one process (``autopar.verify.run``: gloo on CPU).

Its blocks call ``F.scaled_dot_product_attention(..., is_causal=True)``, which a cp rank runs
over the K and V gathered from the cp group (``models/generic/context.py``: a function mode
around each block call), and its embedding's ``torch.arange(t)`` positions read the rank's
global positions. Tolerance: ``autopar verify``'s own for fp32 plans (loss relative 1e-5,
gradients 1e-3 of each tensor's largest entry, parameters 1e-2 of the optimizer's move);
measured figures beside ``CASES``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autopar.core.model_spec import ModelSpec
from autopar.verify.run import verify

from plans import process_plan

NANOGPT = ModelSpec.parse(f"{Path(__file__).resolve().parents[1] / 'data' / 'nanogpt.py'}:make")

# Measured on this machine (fp32, 3 steps; loss relative / gradients of the tensor max /
# parameters of lr x steps): cp2 4.2e-8 / 6.5e-7 / 1.7e-4; cp2 x pp2 8.4e-8 / 5.3e-7 / 1.9e-4;
# cp2 x dp2 ZeRO-3 + full checkpointing 2.1e-8 / 5.3e-7 / 2.0e-4.
CASES = {
    "cp2": dict(cp=2, micro_batch=2),
    "cp2xpp2": dict(cp=2, pp=2, micro_batch=1),
    "cp2xdp2-zero3-full": dict(cp=2, dp=2, zero=3, micro_batch=1, checkpoint="full"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_file_decoder_under_context_parallelism_matches_one_process(case):
    result = verify(NANOGPT, process_plan(NANOGPT, CASES[case], 4), steps=3)
    assert result.passed, result.table()
