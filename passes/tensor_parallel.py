"""Tensor and sequence parallelism from the plan's module styles, on DTensor.

``plan.module_strategies`` (folded from the per-op solve) names a style per module; this pass
turns each into the engine's parallel style and calls ``parallelize_module`` once per stage:

==============  ==================================================================
``column``      ``ColwiseParallel``: weight (and bias) split by output features; the input
                is all-gathered from sequence shards under sequence parallelism; the output
                stays a local shard (attention and the MLP run on local heads/features).
                The head feeding a ``vocab`` loss keeps vocabulary-sharded logits.
``row``         ``RowwiseParallel``: weight split by input features; output all-reduced, or
                reduce-scattered to sequence shards under sequence parallelism.
``vocab``       ``RowwiseParallel`` on an embedding: table split by vocabulary rows, output
                all-reduced (or reduce-scattered to sequence shards).
``sequence``    ``SequenceParallel``: the norm runs on sequence shards.
``replicated``  nothing: every tp rank holds the module whole.
==============  ==================================================================

The modules holding column splits (attention, MLP) get ``PrepareBlockInput``: their activation
input becomes one replicated DTensor (all-gathered once from sequence shards), so q, k and v
(or gate and up) read it together and their input gradients, partial sums, are added before a
single all-reduce or reduce-scatter -- the solve's ``fork``, where one ``ColwiseParallel`` per
projection would communicate once per projection. Attention runs on the local heads
(``use_local_output=True``): DTensor has no sharding rule for
the CPU fused-attention op (../shared/design/FINDINGS.md). A vocabulary-sharded loss runs under
``loss_parallel``; see ``vocab_parallel_logits``. A tied embedding and head are re-tied after
``parallelize_module``, which replaces each module's parameter with its own DTensor.
"""

from __future__ import annotations

import re

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autopar.costmodel.errors import AutoparError
from autopar.module_strategies import LOSS
from autopar.plan import Plan
from autopar.passes.model_parts import ModelParts

EXECUTABLE_STYLES = frozenset({"column", "row", "vocab", "sequence", "replicated"})


class PrepareBlockInput(PrepareModuleInput):
    """The activation input of an attention or MLP module -- its first positional argument, or
    ``hidden_states`` by keyword (transformers) -- as a replicated DTensor; other arguments
    (rotary tables, masks) pass through."""

    def __init__(self, layout: Shard | Replicate) -> None:
        super().__init__(input_layouts=(layout,), desired_input_layouts=(Replicate(),),
                         input_kwarg_layouts={"hidden_states": layout},
                         desired_input_kwarg_layouts={"hidden_states": Replicate()},
                         use_local_output=False)

    def _prepare_input_fn(self, inputs, device_mesh):  # type: ignore[override]
        if not isinstance(inputs, tuple) or not inputs:
            return inputs
        first = self._prepare_input_arg(inputs[0], device_mesh, self.input_layouts[0],
                                        self.desired_input_layouts[0])
        return (first, *inputs[1:])


def sequence_parallel(plan: Plan) -> bool:
    """Whether the residual stream runs in sequence shards: the plan enables it and some module
    runs over the sequence (a solve may enable it and still keep every op whole)."""
    return plan.config.sequence_parallel and any(
        style == "sequence" for _, style in plan.module_strategies)


def loss_is_vocab_parallel(plan: Plan) -> bool:
    return plan.config.tp > 1 and dict(plan.module_strategies).get(LOSS) == "vocab"


def _pattern(name: str, parts: ModelParts) -> str:
    return re.sub(rf"^{re.escape(parts.blocks)}\.\d+(?=\.|$)", f"{parts.blocks}.*", name)


def _style(name: str, module: nn.Module, style: str, plan: Plan, parts: ModelParts,
           tp: int) -> ParallelStyle | None:
    sp = sequence_parallel(plan)
    if style not in EXECUTABLE_STYLES:
        raise AutoparError(
            f"the plan runs module {name} as {style!r}, a layout the engine's tensor-parallel "
            "styles cannot express", where=f"plan.module_strategies[{name!r}]",
            fix="re-plan (autopar plan), or plan with split weights (autopar.plan_for)")
    if style == "replicated":
        return None
    if style == "sequence":
        return SequenceParallel()
    kinds = {"column": nn.Linear, "row": nn.Linear, "vocab": nn.Embedding}
    if not isinstance(module, kinds[style]):
        raise AutoparError(
            f"module {name} is a {type(module).__name__}; the {style!r} style applies to an "
            f"{kinds[style].__name__}", where=f"plan.module_strategies[{name!r}]",
            fix="run this model with tp=1, or give it nn.Linear/nn.Embedding layers")
    weight = module.weight
    dim = 1 if style == "row" else 0
    if weight.shape[dim] % tp:
        raise AutoparError(f"{name}'s weight dim {dim} ({weight.shape[dim]}) does not divide "
                           f"over tp={tp}", where=f"module {name}",
                           fix="choose a tp degree that divides the heads and widths")
    seq = Shard(1) if sp else Replicate()
    if style == "vocab":
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if style == "row":
        return RowwiseParallel(output_layouts=seq)
    if name == parts.head:
        # the logits stay vocabulary shards for loss_parallel, or are gathered whole
        out = Shard(-1) if loss_is_vocab_parallel(plan) else Replicate()
        return ColwiseParallel(input_layouts=seq, output_layouts=out)
    # inside a block the parent's PrepareBlockInput has made the input a replicated DTensor
    return ColwiseParallel(input_layouts=Replicate())


def _check_pairs(styles: dict[str, str]) -> None:
    """A column split must be closed by a row split in the same parent module (attention,
    MLP), or the next block would receive feature shards it cannot read."""
    for name, style in styles.items():
        if style != "column" or "." not in name:
            continue
        parent = name.rsplit(".", 1)[0]
        if not any(s == "row" and n.rsplit(".", 1)[0] == parent for n, s in styles.items()
                   if "." in n):
            raise AutoparError(
                f"{name} is split by columns but no module of {parent} is split by rows",
                where="plan.module_strategies", fix="re-plan (autopar plan / plan_for)")


def apply_tensor_parallel(stage: nn.Module, plan: Plan, tp_mesh: DeviceMesh,
                          parts: ModelParts) -> None:
    """Shard ``stage`` over ``tp_mesh`` as the plan says (in place)."""
    if tp_mesh.size() == 1:
        return
    styles = {k: v for k, v in plan.module_strategies if k != LOSS}
    if not styles:
        raise AutoparError("the plan has tp > 1 but no module strategies",
                           where="plan.module_strategies",
                           fix="make the plan with this version (autopar plan / plan_for)")
    _check_pairs(styles)
    tp = tp_mesh.size()
    tied = _tied_pairs(stage)
    layout: dict[str, ParallelStyle] = {}
    for name, module in stage.named_modules():
        style = styles.get(_pattern(name, parts))
        if style is not None:
            chosen = _style(name, module, style, plan, parts, tp)
            if chosen is not None:
                layout[name] = chosen
            if style == "column" and name != parts.head:
                seq = Shard(1) if sequence_parallel(plan) else Replicate()
                layout[name.rsplit(".", 1)[0]] = PrepareBlockInput(seq)
    if sequence_parallel(plan):
        extra = parts.sequence_parallel_styles()
        if styles.get(parts.embedding, "replicated") == "replicated":
            # a whole table's output is sliced to the blocks' sequence shards (no collective)
            extra[parts.embedding] = PrepareModuleOutput(output_layouts=Replicate(),
                                                         desired_output_layouts=Shard(1))
        present = {n for n, _ in stage.named_modules()}
        layout.update({k: v for k, v in extra.items() if k in present})
    parallelize_module(stage, tp_mesh, layout)
    for owner, user in tied:
        stage.get_submodule(user).weight = stage.get_submodule(owner).weight


def _tied_pairs(stage: nn.Module) -> list[tuple[str, str]]:
    """(first holder, other holder) of every weight two modules of ``stage`` share."""
    seen: dict[int, str] = {}
    pairs = []
    for name, module in stage.named_modules(remove_duplicate=False):
        w = getattr(module, "weight", None)
        if isinstance(w, nn.Parameter):
            if id(w) in seen and seen[id(w)] != name:
                pairs.append((seen[id(w)], name))
            else:
                seen.setdefault(id(w), name)
    return pairs


def vocab_parallel_logits(logits: torch.Tensor, tp_mesh: DeviceMesh) -> DTensor:
    """The head's local vocabulary shard as a DTensor for ``loss_parallel``."""
    if isinstance(logits, DTensor):
        return logits
    return DTensor.from_local(logits, tp_mesh, [Shard(logits.dim() - 1)], run_check=False)
