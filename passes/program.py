"""``parallelize(model, plan, mesh)``: the program one rank runs, and its training step.

The passes run in this order, each for a reason:

1. ``bf16-pure`` casts the model first, so every shard is made from bf16 weights.
2. Context parallelism (``context_parallel``) gives each attention module its K/V all-gather
   before the fusions, whose fx graphs then keep the call (a submodule is a leaf to them).
3. The pipeline split (``stage.build_stages``) comes before any sharding: each stage is its
   own FSDP root and its own ``PipelineStage``; it keeps module names, so checkpoints match
   across plans.
4. Tensor parallelism (``tensor_parallel``) comes before data parallelism: FSDP2 shards the tp
   DTensors along dp (a 2-D layout); the engine does not support the reverse order.
5. Activation checkpointing needs no rewrite: the stage runs each block under its policy.
6. Data parallelism and mixed precision (``data_parallel``), per block then per stage.
7. A weight tied across pipeline stages (GPT's embedding and head) gets one all-reduce of its
   gradient between the two stages after each backward (``TiedWeights``).
8. The schedule (``pipeline``), when pp > 1.
9. fp16 plans get a gradient scaler (``loss_scaling``): dynamic loss scaling.

fp8 plans swap their chosen linears for torchao's ``Float8Linear`` after the fusions and before
the split (``float8``), and gather the FP8 weights as bytes on gloo after FSDP is applied.

``ParallelProgram.step(tokens, targets)`` runs forward and backward of this rank's share of
the global batch (its data-parallel slice, all its micro-batches; under context parallelism
its chunks of every sequence) and returns the mean loss
on the ranks holding the last stage (``None`` elsewhere); ``optimizer_step(optimizers)`` then
steps the caller's optimizers (through the scaler for fp16, which may skip the step), and
``unscale_(optimizers)`` before it gives the true gradients to look at.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from autopar.analysis.admissibility import facts_of
from autopar.core.errors import AutoparError
from autopar.core.specs import Precision
from autopar.core.plan import Plan
from autopar.passes.checkpointing import mark_moe_layers
from autopar.passes.context_parallel import apply_context_parallel, chunk_positions, sequence_shard
from autopar.models import prepare_training, set_aux_loss_grad_scale
from autopar.models.init import tied_groups
from autopar.passes.data_parallel import apply_data_parallel, set_microbatch, wants_fsdp
from autopar.passes.float8 import apply_float8, apply_fp8_transport
from autopar.passes.expert_parallel import (apply_call_tokens, apply_expert_parallel,
                                            apply_token_shards, call_tokens_mesh, expert_dp_mesh,
                                            expert_mesh, wants_expert_mesh)
from autopar.passes.fuse import LinearCrossEntropyHead, apply_fusions, keep_fused_head_gathered
from autopar.passes.loss_scaling import grad_scaler, quiet_found_inf
from autopar.core.mesh import MeshAxis
from autopar.passes.mesh import check_executable, dp_rank
from autopar.passes.model_parts import ModelParts, model_family, parts_or_none
from autopar.passes.async_tp import apply_async_tp
from autopar.passes.pipeline import StageShapes, build_schedule
from autopar.passes.stage import (StageModule, build_stages, end_stage_names, model_blocks,
                                  stage_blocks, stage_layout, stage_of)
from autopar.passes.whole_model import checkpoint_blocks, whole_model_blocks
from autopar.models.feed import logits_of
from autopar.models.training import loss_of
from autopar.passes.tensor_parallel import (
    apply_tensor_parallel,
    loss_is_vocab_parallel,
    vocab_parallel_logits,
)


@dataclass
class TiedWeights:
    """This rank's copies of weights that the first and the last pipeline stage both hold
    (GPT's embedding and head): their gradients are summed between the two after backward."""

    params: list[nn.Parameter]
    group: dist.ProcessGroup | None

    def sync(self) -> None:
        for param in self.params:
            grad = param.grad
            if grad is None:
                continue
            if isinstance(grad, DTensor) and grad.placements != param.placements:
                # an embedding's gradient comes back replicated for a vocabulary-split table;
                # both stages must reduce the same local shard
                grad = grad.redistribute(grad.device_mesh, param.placements)
                param.grad = grad
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            dist.all_reduce(local, group=self.group)


@dataclass
class ParallelProgram:
    """This rank's stages of the plan, sharded, with the schedule that runs them."""

    plan: Plan
    mesh: DeviceMesh
    parts: ModelParts | None
    """``None``: the one stage is the model itself, run whole (``passes/whole_model.py``)."""
    stages: list[tuple[int, nn.Module]]
    num_stages: int
    device: torch.device
    tied: TiedWeights
    schedule: object | None = None
    scaler: ShardedGradScaler | None = None
    """fp16's dynamic loss scaling (``passes/loss_scaling.py``); ``None`` otherwise."""

    @property
    def modules(self) -> list[nn.Module]:
        return [m for _, m in self.stages]

    @property
    def holds_first(self) -> bool:
        return any(i == 0 for i, _ in self.stages)

    @property
    def holds_last(self) -> bool:
        return any(i == self.num_stages - 1 for i, _ in self.stages)

    @property
    def dp_rank(self) -> int:
        return dp_rank(self.mesh)

    def named_parameters(self, remove_duplicate: bool = True
                         ) -> Iterator[tuple[str, nn.Parameter]]:
        """This rank's parameters under the model's names; a tied weight once, under its first
        name, unless ``remove_duplicate`` is false."""
        seen: set[int] = set()
        for module in self.modules:
            for name, p in module.named_parameters(remove_duplicate=remove_duplicate):
                if id(p) not in seen or not remove_duplicate:
                    seen.add(id(p))
                    yield name, p

    def parameters(self) -> list[nn.Parameter]:
        return [p for _, p in self.named_parameters()]

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of one micro-batch, vocabulary-parallel when planned."""
        head = (None if self.parts is None
                else self.modules[-1].get_submodule(self.parts.head))
        if isinstance(head, LinearCrossEntropyHead):  # fused: the stage gave the hidden state
            return head.loss(logits, targets)
        if loss_is_vocab_parallel(self.plan):
            logits = vocab_parallel_logits(logits, self.mesh[MeshAxis.TP.value])
        elif logits.dtype in (torch.bfloat16, torch.float16):
            logits = logits.float()
        return loss_of(logits, targets)

    def _scaled_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss the pipeline schedule differentiates: scaled for fp16."""
        loss = self.loss(logits, targets)
        return loss if self.scaler is None else self.scaler.scale(loss)

    def unscale_(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Divide the gradients by the loss scale (fp16; nothing otherwise): they are then the
        true gradients, and ``optimizer_step`` does not divide them again."""
        if self.scaler is not None:
            with quiet_found_inf():
                for opt in optimizers:
                    self.scaler.unscale_(opt)

    def optimizer_step(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Step every optimizer over this rank's parameters and clear the gradients; for fp16
        through the scaler, which skips the step on every rank when any rank's gradients hold
        an inf or a NaN, and adjusts the scale."""
        if self.scaler is None:
            for opt in optimizers:
                opt.step()
        else:
            with quiet_found_inf():
                for opt in optimizers:
                    self.scaler.step(opt)
                self.scaler.update()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)

    def _loss_context(self):
        return loss_parallel() if loss_is_vocab_parallel(self.plan) else nullcontext()

    def step(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of this rank's batch: ``tokens`` and ``targets`` are
        (micro_batch * num_microbatches, seq_len); every rank of a data-parallel replica passes
        the same ones (under context parallelism the whole sequences: each cp rank runs its
        chunks of them). Returns the mean loss where the last stage is held, else ``None``."""
        tokens, targets = tokens.to(self.device), targets.to(self.device)
        cp = self.plan.config.cp
        if cp > 1:  # this cp rank's chunks of every sequence (passes/context_parallel.py)
            rank = self.mesh.get_local_rank(MeshAxis.CP.value)
            tokens, targets = sequence_shard(tokens, cp, rank), sequence_shard(targets, cp, rank)
        loss = self._step(tokens, targets)
        if loss is not None and cp > 1:
            # the mean over the whole sequences: every cp rank's mean is over as many tokens
            dist.all_reduce(loss, dist.ReduceOp.AVG, group=self.mesh[MeshAxis.CP.value].get_group())
        return loss

    def _step(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        m = self.plan.config.microbatches(self.plan.train)
        loss_scale = 1.0 if self.scaler is None else float(self.scaler.get_scale())
        for module in self.modules:  # the routers' load-balancing loss, scaled as the loss
            # (pipelining divides the gradients by m after the step itself)
            set_aux_loss_grad_scale(module, loss_scale / (1 if self.schedule is not None else m))
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            args = (tokens,) if self.holds_first else ()
            kwargs = {"target": targets, "losses": losses} if self.holds_last else {}
            with self._loss_context():
                # return_outputs=False: the last stage would otherwise keep every micro-batch's
                # output (the logits) until the step ends, to concatenate them for the caller
                self.schedule.step(*args, return_outputs=False,  # type: ignore[attr-defined]
                                   **kwargs)
            self.tied.sync()
            if not self.holds_last:
                return None
            scale = 1.0 if self.scaler is None else self.scaler.get_scale()
            return torch.stack([_plain(x) for x in losses]).mean() / scale
        module = self.modules[0]
        total = torch.zeros((), device=self.device)
        for k, (tok, tgt) in enumerate(zip(tokens.chunk(m), targets.chunk(m))):
            set_microbatch(module.modules(), self.plan.config.zero, last=k == m - 1)
            with self._loss_context():
                loss = self.loss(logits_of(module, tok), tgt)
                scaled = loss / m
                (scaled if self.scaler is None else self.scaler.scale(scaled)).backward()
            total += _plain(loss)
        return total / m


def _plain(loss: torch.Tensor) -> torch.Tensor:
    """A detached plain tensor (``loss_parallel`` returns a replicated DTensor)."""
    loss = loss.detach()
    return loss.full_tensor() if isinstance(loss, DTensor) else loss


def parallelize(model: nn.Module, plan: Plan, mesh: DeviceMesh,
                device: torch.device | str | None = None, *,
                stage_shapes: Callable[[list[tuple[int, StageModule]]], StageShapes]
                | None = None) -> ParallelProgram:
    """Rewrite ``model`` into this rank's program under ``plan`` on ``mesh``
    (``autopar.device_mesh(plan)``), to run on ``device``. ``model`` is built whole on this
    rank, either with its weights (they are moved to ``device``) or on the meta device, where
    it stays: ``materialize`` then allocates and fills this rank's shards
    (``passes/materialize.py``). The passes' order is the module docstring's. ``stage_shapes``
    (the dry run's) gives the pipeline stages their micro-batch shapes once they are sharded
    (``passes/pipeline.py:build_schedule``)."""
    check_executable(plan, facts_of(model))
    device = torch.device(device or mesh.device_type)
    parts = parts_or_none(model)
    dtype = torch.bfloat16 if plan.train.precision is Precision.BF16_PURE else None
    _move(model, device, dtype)
    if parts is None:  # no family describes it: the admissibility check has kept pp = tp = 1
        return _whole_model_program(model, plan, mesh, device)
    prepare_training(model)  # the family's training-only hooks (hf-moe's load-balancing loss)
    cp, cp_rank = plan.config.cp, mesh.get_local_rank(MeshAxis.CP.value)
    if cp > 1:  # before the fusions, whose graphs then keep the attention's call to it
        apply_context_parallel(model, model_family(model), plan,
                               mesh[MeshAxis.CP.value].get_group(), cp_rank)
    # Fusion after the cast (the fused modules hold the cast weights) and before the split
    # and sharding, which find the fused modules under the model's names.
    apply_fusions(model, plan.config.fusions, tp=plan.config.tp)
    # FP8 linears after the fusions (their modules keep the nn.Linear children) and before the
    # split and the sharding, which shard a Float8Linear's weight as any linear's
    apply_float8(model_blocks_of(model), plan.train, fsdp=wants_fsdp(plan))
    tied_across = _tied_across_stages(model, parts, plan)
    pp_rank = mesh.get_local_rank(MeshAxis.PP.value)
    stages = build_stages(model, parts, plan, pp_rank)
    num_stages = len(stage_layout(plan, model_blocks(model, parts).count))
    family = model_family(model)
    has_experts = bool(family.expert_layers(model))
    # every rank makes these groups (DeviceMesh._flatten), whichever stage it holds
    experts_mesh = expert_mesh(plan, mesh) if wants_expert_mesh(plan, has_experts) else None
    call_mesh = call_tokens_mesh(plan, mesh) if has_experts else None
    tp_mesh = mesh[MeshAxis.TP.value]
    for _, stage in stages:
        if cp > 1:
            stage_of(stage).positions = partial(_positions, cp=cp, rank=cp_rank)
        layers = family.expert_layers(stage)
        # under the experts' fold the MoE layers run on the rank's own tokens: tp splits what
        # is inside them over those tokens, then they take the rank's shard (expert_parallel)
        token_modules = (frozenset(n for n, m in stage.named_modules()
                                   if any(m is layer.module for layer in layers))
                         if plan.config.experts_fold_tp else frozenset())
        apply_tensor_parallel(stage, plan, tp_mesh, parts, token_modules)
        apply_token_shards(plan, tp_mesh, layers)
        apply_call_tokens(plan, call_mesh, layers)
        mark_moe_layers(layers)  # the modules the moe checkpoint policy runs checkpointed
        apply_async_tp(list(stage_blocks(stage).values()), plan, tp_mesh, device)
        experts = ([] if experts_mesh is None
                   else apply_expert_parallel(stage, plan, experts_mesh, layers))
        apply_data_parallel(stage, stage_blocks(stage).values(), plan, mesh, experts,
                            expert_dp_mesh(plan, experts_mesh))
        apply_fp8_transport(stage.modules(), plan.train)
        keep_fused_head_gathered(stage, parts.head)
    held = {n: p for _, stage in stages for n, p in stage.named_parameters(
        remove_duplicate=False)}
    tied = _tied_weights(mesh, plan, tied_across, held)
    program = ParallelProgram(plan, mesh, parts, stages, num_stages, device, tied,
                              scaler=grad_scaler(plan.train, device))
    if plan.config.pp > 1:
        shapes = stage_shapes(stages) if stage_shapes is not None else None
        program.schedule = build_schedule(stages, num_stages, plan, mesh, device,
                                          program._scaled_loss, shapes)
    return program


def model_blocks_of(model: nn.Module) -> list[nn.Module]:
    """``model``'s repeated blocks, the plan's blocks: its family's (``ModelParts.blocks``),
    or the block group found in a model no family describes."""
    parts = parts_or_none(model)
    if parts is None:
        return whole_model_blocks(model)
    span = model_blocks(model, parts)
    container = model.get_submodule(span.path)
    return [container[i] for i in span.blocks]


def _whole_model_program(model: nn.Module, plan: Plan, mesh: DeviceMesh,
                         device: torch.device) -> ParallelProgram:
    """The one-stage program of a model no family describes (``passes/whole_model.py``):
    data parallelism, ZeRO and checkpointing of its blocks, nothing that needs its layout."""
    c = plan.config
    if c.pp > 1 or c.tp > 1 or c.cp > 1 or c.ep > 1 or c.fusions:
        raise AutoparError(  # admissibility refuses these first; the passes' own guard
            "a model no family describes runs whole: data parallelism, ZeRO and activation "
            "checkpointing only", where="autopar.parallelize",
            fix="plan it with pp = tp = cp = ep = 1 and no fusions")
    blocks = whole_model_blocks(model)
    checkpoint_blocks(blocks, c.checkpoint_of(len(blocks)))
    apply_float8(blocks, plan.train, fsdp=wants_fsdp(plan))
    apply_data_parallel(model, blocks, plan, mesh)
    apply_fp8_transport(model.modules(), plan.train)
    return ParallelProgram(plan, mesh, None, [(0, model)], 1, device, TiedWeights([], None),
                           scaler=grad_scaler(plan.train, device))


def _positions(seq_len: int, device: torch.device, *, cp: int, rank: int) -> torch.Tensor:
    return chunk_positions(seq_len, cp, rank, device)


def _move(model: nn.Module, device: torch.device, dtype: torch.dtype | None) -> None:
    """``model.to(device, dtype)`` where some tensor is elsewhere or of another floating dtype.
    A model on the meta device stays there: ``materialize`` allocates each rank's shards on
    ``device`` once the plan has made them (``passes/materialize.py``). A model already in
    place (on fake tensors, for the dry run) is left as it is -- ``Module.to`` would swap every
    fake parameter with itself, which fails."""
    tensors = [*model.parameters(), *model.buffers()]
    on_meta = sum(t.is_meta for t in tensors)
    if 0 < on_meta < len(tensors):
        raise AutoparError(f"{on_meta} of the model's {len(tensors)} parameters and buffers are "
                           "on the meta device, the others allocated", where="parallelize",
                           fix="build the model whole on the meta device (then materialize "
                               "the program) or whole on a real one")
    if not on_meta and any(t.device != device for t in tensors):
        model.to(device)
    if dtype is not None and any(t.is_floating_point() and t.dtype != dtype for t in tensors):
        model.to(dtype)


def _tied_across_stages(model: nn.Module, parts: ModelParts, plan: Plan) -> list[list[str]]:
    """The names of each weight the model holds under several names (a tied embedding and
    head) that both the first and the last pipeline stage hold, when there are stages."""
    groups = tied_groups(model) if plan.config.pp > 1 else []
    if not groups:
        return []
    first, last = end_stage_names(model, parts, plan)
    return [list(g) for g in groups if set(g) & first and set(g) & last]


def _tied_weights(mesh: DeviceMesh, plan: Plan, groups: list[list[str]],
                  held: dict[str, nn.Parameter]) -> TiedWeights:
    """This rank's copy of each tied weight of ``groups`` (those the first and the last stage
    both hold: an embedding tied to the head; a tie inside one stage, BERT's head bias, syncs
    nothing), and one process group per (dp, tp) position joining the first and last pipeline
    ranks; every rank creates every group, in the same order (``new_group``'s contract), even
    one holding no tied weight."""
    pp = plan.config.pp
    if not groups:
        return TiedWeights([], None)
    # init_device_mesh lays the ranks out row-major over AXES, pp outermost
    # (passes/mesh.py): the rank at (stage, col) is stage * per_stage + col. Computed, not read
    # from mesh.mesh, which holds no values under the dry run's fake tensors.
    per_stage = mesh.size() // pp
    mine = None
    for col in range(per_stage):
        members = sorted({col, (pp - 1) * per_stage + col})
        group = dist.new_group(members)
        if dist.get_rank() in members:
            mine = group
    params = [next(held[n] for n in group if n in held) for group in groups
              if any(n in held for n in group)]
    return TiedWeights(params if mine is not None else [], mine)
