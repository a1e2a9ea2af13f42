"""Which linear layers an ``fp8`` plan runs in FP8: one rule, read by the engine
(``passes/float8.py``, which swaps them for torchao's ``Float8Linear``), by the workload
(``analysis/workload.py``, which marks their GEMMs, ``OpCost.fp8``) and so by the cost model.

The linears of the repeated blocks whose weight dims are both multiples of 16
(``torch._scaled_mm``'s requirement), except the routers of a mixture of experts (their scores
choose the experts; a GEMM of num_experts columns gains nothing). Outside the blocks nothing:
the embedding is no GEMM, and the head's logits feed the loss at full range (torchtitan and
Megatron keep it bf16). Stacked experts (3-D weights) are not linears and stay bf16.
"""

from __future__ import annotations

from .specs import Fp8Recipe, Precision, TrainSpec

ROUTER_NAMES = frozenset({"router", "gate"})
"""Last names of a mixture of experts' router linears (the zoo's ``router``, transformers'
``mlp.gate``), kept bf16."""

FP8_DIM_MULTIPLE = 16
"""``torch._scaled_mm`` needs both dims of the weight to be multiples of 16."""


def fp8_gemm(module_path: str, weight_shape: tuple[int, int] | None) -> bool:
    """Whether the linear at ``module_path`` (inside a block) with a weight of
    ``weight_shape`` (output, input features) runs its GEMMs in FP8."""
    if weight_shape is None or module_path.rsplit(".", 1)[-1] in ROUTER_NAMES:
        return False
    return all(d % FP8_DIM_MULTIPLE == 0 for d in weight_shape)


def fp8_all_gather(train: TrainSpec) -> bool:
    """Whether FSDP all-gathers the FP8 linears' weights in FP8 (``tensorwise`` only: one
    scale per weight, taken from the whole weight's amax before the gather)."""
    return train.precision is Precision.FP8 and train.fp8_recipe is Fp8Recipe.TENSORWISE


def fp8_params(ops) -> float:
    """Parameters of the FP8 linears among a layer's ``ops`` (``OpCost.fp8``), unsharded."""
    return float(sum(op.weight_shape[0] * op.weight_shape[1] for op in ops
                     if op.fp8 and op.weight_shape is not None))
