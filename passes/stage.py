"""Pipeline stages: the model cut at the plan's boundaries, each piece an ``nn.Module``.

A ``StageModule`` holds the model's submodules that its stage runs *under their original
names* (``tok_emb``, ``layers.3.attn.q_proj``, ``norm_f``...), so state-dict keys, and so
``torch.distributed.checkpoint`` files, are the same under every plan, which is what lets a
checkpoint saved under one plan load under another. Blocks are kept in an ``nn.ModuleDict``
keyed by their index in the model. The stage runs its blocks one by one, each under the
activation-checkpoint policy the plan gives it (``passes/checkpointing.py``).

Stage ``i`` of ``n`` gets the blocks of ``stage_layout(plan)[i]``: the plan's ``stage_blocks``
for GPipe and 1F1B (one stage per pipeline rank); for the interleaved schedule the blocks are
cut into ``pp * virtual_stages`` chunks as evenly as possible and rank ``r`` holds chunks
``r, r + pp, ...`` (Narayanan et al. 2021, section 2.2.2; torch's ``ScheduleInterleaved1F1B``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from autopar.core.errors import AutoparError
from autopar.core.specs import Checkpoint, Schedule
from autopar.core.stages import chunk_sizes
from autopar.core.plan import Plan
from autopar.passes.checkpointing import run_block
from autopar.passes.model_parts import ModelParts


class StageModule(nn.Module):
    """The modules of one pipeline stage and how to run them."""

    def __init__(self, model: nn.Module, parts: ModelParts, blocks: range, *, first: bool,
                 last: bool, seq_len: int, policies: dict[int, Checkpoint]) -> None:
        super().__init__()
        self.parts = parts
        self.first, self.last, self.seq_len = first, last, seq_len
        self.policies = policies
        self.config = getattr(model, "config", None)
        """The model's config object (the families read it, e.g. the attention kernel)."""
        self.positions: Callable[[int, torch.device], torch.Tensor] | None = None
        """(seq_len, device) -> the global positions of the tokens this rank runs, where they
        are not ``0 .. seq_len-1`` (context parallelism, ``passes/context_parallel.py``); the
        families read it through ``models.parts.token_positions``."""
        keep = [*parts.shared, *(parts.first if first else ()), *(parts.last if last else ())]
        for path in keep:
            _attach(self, path, model.get_submodule(path))
        layers = model.get_submodule(parts.blocks)
        self.block_ids = tuple(blocks)
        _attach(self, parts.blocks, nn.ModuleDict({str(i): layers[i] for i in blocks}))
        for name, buf in model.named_buffers(recurse=False):
            persistent = name not in model._non_persistent_buffers_set
            self.register_buffer(name, buf, persistent=persistent)
        for name, param in model.named_parameters(recurse=False):
            self.register_parameter(name, param)

    def blocks(self) -> nn.ModuleDict:
        return self.get_submodule(self.parts.blocks)  # type: ignore[return-value]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.parts
        if self.first:
            x = p.embed(self, x)
        extra = p.block_args(self, x, self.seq_len)
        for key, block in self.blocks().items():
            x = run_block(p.call_block, block, x, extra, self.policies[int(key)])
        if self.last:
            x = p.finish(self, x)
        return x


def _attach(root: nn.Module, path: str, module: nn.Module) -> None:
    """Set ``root.<path>`` to ``module``, making plain containers for missing parents."""
    *parents, name = path.split(".")
    node = root
    for part in parents:
        if not hasattr(node, part):
            node.add_module(part, nn.Module())
        node = getattr(node, part)
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
        if chunks > num_blocks:
            raise AutoparError(
                f"the interleaved schedule needs {chunks} chunks (pp {c.pp} x virtual stages "
                f"{c.virtual_stages}), the model has {num_blocks} blocks",
                where="plan.config.virtual_stages", fix="lower virtual_stages or pp")
        sizes = chunk_sizes(num_blocks, chunks)
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
    layers = model.get_submodule(parts.blocks)
    layout = stage_layout(plan, len(layers))
    policies = dict(enumerate(plan.config.checkpoint_of(len(layers))))
    n = len(layout)
    return [(i, StageModule(model, parts, layout[i], first=i == 0, last=i == n - 1,
                            seq_len=plan.train.seq_len, policies=policies))
            for i in stages_of_rank(n, plan.config.pp, pp_rank)]
