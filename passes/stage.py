"""Pipeline stages: the model cut at the plan's boundaries, each piece an ``nn.Module``.

A ``StageModule`` holds the model's submodules that its stage runs *under their original
names* (``tok_emb``, ``layers.3.attn.q_proj``, ``norm_f``...), so state-dict keys, and so
``torch.distributed.checkpoint`` files, are the same under every plan, which is what lets a
checkpoint saved under one plan load under another. Blocks are kept in an ``nn.ModuleDict``
keyed by their index in the model's block container. The stage runs its blocks one by one, each
under the activation-checkpoint policy the plan gives it (``passes/checkpointing.py``).

The plan's blocks are the model's repeated ones (``models.blocks.BlockSpan``); a container that
also holds other modules -- DeepSeek-V3's dense first layers, Qwen2-MoE's ``mlp_only_layers``
-- has them run, called as the blocks are and without checkpointing, by the first stage after
the embedding (those before the blocks) or by the last before the head (those after, pp = 1
only: ``admissibility``). The cost model prices them the same way, in the layers before and
after the blocks.

Stage ``i`` of ``n`` gets the blocks of ``stage_layout(plan)[i]``: the plan's ``stage_blocks``
for GPipe, 1F1B and the interleaved schedule with one chunk per rank (one stage per pipeline
rank); with more chunks the blocks are cut into ``pp * virtual_stages`` chunks as evenly as
possible and rank ``r`` holds chunks ``r, r + pp, ...`` (Narayanan et al. 2021, section 2.2.2;
torch's ``ScheduleInterleaved1F1B``); with one or two chunks more than blocks the first holds
the embedding alone and the last the loss alone (``autopar.core.stages.chunk_sizes``, read
through ``stage_chunks``, the rule the cost model and the exports read too).
"""

from __future__ import annotations

import torch
from torch import nn

from autopar.core.errors import AutoparError
from autopar.core.specs import Checkpoint, Schedule
from autopar.core.stages import ENDS_AS_CHUNKS, stage_chunks
from autopar.core.plan import Plan
from autopar.passes.checkpointing import run_block
from autopar.models.blocks import BlockSpan, block_span
from autopar.models.parts import STAGE_ATTR, StageInfo, stage_info
from autopar.passes.model_parts import ModelParts


class StageModule(nn.Module):
    """The modules of one pipeline stage and how to run them.

    The root's own names are the model's: its state lives in one reserved attribute
    (``models.parts.STAGE_ATTR``, a ``StageInfo``), read through ``stage_of`` and the families'
    ``models.parts`` functions, so a model may call its blocks ``blocks`` or its position
    table ``positions``."""

    def __init__(self, model: nn.Module, parts: ModelParts, blocks: range, *, first: bool,
                 last: bool, seq_len: int, policies: dict[int, Checkpoint],
                 span: BlockSpan | None = None) -> None:
        """``blocks``: the plan's blocks it runs (indices among the repeated ones);
        ``policies``: block index -> its checkpoint policy; ``span``: where the blocks sit in
        their container (``model_blocks``, read off the model where not given)."""
        super().__init__()
        if hasattr(model, STAGE_ATTR):
            raise AutoparError(f"the model has an attribute {STAGE_ATTR!r}, the name a "
                               "pipeline stage keeps its own state under",
                               where=f"{type(model).__name__}.{STAGE_ATTR}",
                               fix="rename that attribute of the model")
        span = span or model_blocks(model, parts)
        self.__dict__[STAGE_ATTR] = StageInfo(
            parts=parts, first=first, last=last, seq_len=seq_len, block_ids=tuple(blocks),
            policies={span.lead + i: p for i, p in policies.items()}, lead=span.lead,
            config=getattr(model, "config", None))
        keep = [*parts.shared, *(parts.first if first else ()), *(parts.last if last else ())]
        own = dict(model.named_parameters(recurse=False))
        for path in keep:
            if path in own:  # a parameter of the model root the stage's steps read
                self.register_parameter(path, own[path])
            elif path not in model._buffers:
                _attach(self, path, model.get_submodule(path))
        named = {*parts.shared, *parts.first, *parts.last}
        unnamed = sorted(set(own) - named)
        if unnamed:  # a stage without it would train a model missing it, silently
            raise AutoparError(f"the model's own parameter(s) {', '.join(unnamed)} are read by "
                               "none of the steps its family's parts name, so no pipeline "
                               "stage would hold them", where=f"{type(model).__name__}",
                               fix="plan pp = 1 for this model, or hold them in a module")
        layers = model.get_submodule(parts.blocks)
        held = [*(range(span.lead) if first else ()), *(span.lead + i for i in blocks),
                *(range(span.lead + span.count, span.size) if last else ())]
        _attach(self, parts.blocks, nn.ModuleDict({str(i): layers[i] for i in held}))
        for name, buf in model.named_buffers(recurse=False):  # tables every stage may read
            persistent = name not in model._non_persistent_buffers_set
            self.register_buffer(name, buf, persistent=persistent)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        info = stage_of(self)
        p = info.parts
        if info.first:
            x = p.embed(self, x)
        extra = p.block_args(self, x, info.seq_len)
        for key, block in stage_blocks(self).items():
            x = run_block(p.call_block, block, x, extra,
                          info.policies.get(int(key), Checkpoint.NONE))
        if info.last:
            x = p.finish(self, x)
        return x


def stage_of(stage: nn.Module) -> StageInfo:
    """The state of the pipeline stage ``stage`` (a ``StageModule``)."""
    info = stage_info(stage)
    if info is None:
        raise TypeError(f"{type(stage).__name__} is not a pipeline stage")
    return info


def stage_blocks(stage: nn.Module) -> nn.ModuleDict:
    """The modules of the block container ``stage`` runs, keyed by their index in it: its
    blocks, and on the first (last) stage the modules before (after) the blocks."""
    return stage.get_submodule(stage_of(stage).parts.blocks)  # type: ignore[return-value]


def model_blocks(model: nn.Module, parts: ModelParts) -> BlockSpan:
    """Where ``model``'s repeated blocks sit in its container ``parts.blocks``
    (``models.blocks.block_span``): the plan's blocks are those."""
    return block_span(model, parts.blocks)


def held_blocks(module: nn.Module) -> int:
    """How many of the model's repeated blocks a program module holds: a stage's own, or
    every block of a model run whole (``passes/whole_model.py``)."""
    info = stage_info(module)
    if info is not None:
        return len(info.block_ids)
    from autopar.passes.whole_model import whole_model_blocks

    return len(whole_model_blocks(module))


def _attach(root: nn.Module, path: str, module: nn.Module) -> None:
    """Set ``root.<path>`` to ``module``, making plain containers for missing parents."""
    *parents, name = path.split(".")
    node = root
    for part in parents:
        if part not in node._modules:
            node.add_module(part, nn.Module())
        node = node._modules[part]
    node.add_module(name, module)


def stage_layout(plan: Plan, num_blocks: int) -> list[range]:
    """The blocks of every pipeline stage, stage 0 first (see the module docstring)."""
    c = plan.config
    if sum(plan.stage_blocks) != num_blocks:
        raise AutoparError(
            f"the plan places {sum(plan.stage_blocks)} blocks, the model has {num_blocks}",
            where="plan.stage_blocks", fix="plan this model (autopar plan / autopar.plan_for)")
    if c.schedule is Schedule.INTERLEAVED:
        chunks = c.pp * c.virtual_stages
        if chunks > num_blocks + ENDS_AS_CHUNKS:
            raise AutoparError(
                f"the interleaved schedule needs {chunks} chunks (pp {c.pp} x virtual stages "
                f"{c.virtual_stages}), the model has {num_blocks} blocks (and the embedding "
                "and the loss may each be a chunk)",
                where="plan.config.virtual_stages", fix="lower virtual_stages or pp")
        try:  # the plan's own blocks per rank with one chunk each, else the chunks' rule
            sizes = stage_chunks(plan.stage_blocks, c.virtual_stages)
        except ValueError as err:
            raise AutoparError(str(err), where="plan.stage_blocks",
                               fix="plan this model (autopar plan / autopar.plan_for)") from None
    else:
        sizes = list(plan.stage_blocks)
    out, start = [], 0
    for size in sizes:
        out.append(range(start, start + size))
        start += size
    return out


def stages_of_rank(num_stages: int, pp: int, pp_rank: int) -> list[int]:
    """Stage indices a pipeline rank holds: ``r, r + pp, ...`` (one of them without interleaving)."""
    return list(range(pp_rank, num_stages, pp))


def build_stages(model: nn.Module, parts: ModelParts, plan: Plan, pp_rank: int
                 ) -> list[tuple[int, StageModule]]:
    """This pipeline rank's stages, as (stage index, module)."""
    n = len(stage_layout(plan, model_blocks(model, parts).count))
    return [(i, _stage(model, parts, plan, i)) for i in stages_of_rank(n, plan.config.pp, pp_rank)]


def end_stage_names(model: nn.Module, parts: ModelParts, plan: Plan
                    ) -> tuple[set[str], set[str]]:
    """The parameter names (every name of a tied one) the first and the last stage hold, on
    any rank: which of a model's tied weights the two stages share."""
    n = len(stage_layout(plan, model_blocks(model, parts).count))
    return tuple({name for name, _ in _stage(model, parts, plan, i).named_parameters(
        remove_duplicate=False)} for i in (0, n - 1))  # type: ignore[return-value]


def _stage(model: nn.Module, parts: ModelParts, plan: Plan, index: int) -> StageModule:
    """Stage ``index`` of the plan (its modules are the model's own, not copies)."""
    span = model_blocks(model, parts)
    layout = stage_layout(plan, span.count)
    policies = dict(enumerate(plan.config.checkpoint_of(span.count)))
    return StageModule(model, parts, layout[index], first=index == 0,
                       last=index == len(layout) - 1, seq_len=plan.train.seq_len,
                       policies=policies, span=span)
