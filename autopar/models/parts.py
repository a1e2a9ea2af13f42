"""``ModelParts``: where a model's pieces are and how a pipeline stage calls them.

The passes split a model into pipeline stages and run each stage's blocks one by one (to
checkpoint them as planned), so they need the modules before the blocks, the block list, the
modules after it, and how each is called. Each family describes its own layout in
``autopar/models/<family>/parts.py``; the passes get it from the family registry
(``autopar.models.family_of(model).parts``) and never name a model class.

Every callable takes the *stage root*: a module that holds the model's submodules under their
original names (``passes/stage.py``), so ``root.tok_emb`` is the model's ``tok_emb``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed.tensor.parallel import ParallelStyle


STAGE_ATTR = "_autopar_stage"
"""The one attribute a pipeline stage's root (``passes/stage.py``) keeps its own state under
(``StageInfo``). Everything else on the root is the model's, under the model's own names -- a
model whose blocks are ``self.blocks`` or whose position table is ``self.positions`` keeps
them -- so the families read the stage's state through the functions below, never as
attributes of the root."""


@dataclass
class StageInfo:
    """What a pipeline stage knows of itself, beside the model's modules it holds."""

    parts: ModelParts
    first: bool
    """It runs the embedding step (``ModelParts.embed``)."""
    last: bool
    """It runs the finish (``ModelParts.finish``): final norm and head."""
    seq_len: int
    """The sequence length of the plan (under context parallelism, of the whole sequence)."""
    block_ids: tuple[int, ...]
    """The indices, among the model's repeated blocks, of the blocks it runs (the plan's)."""
    policies: Mapping[int, object]
    """Container index (the module's key in ``ModelParts.blocks``) of each block -> its
    activation-checkpoint policy (``core.specs.Checkpoint``); the container's other modules,
    which the first or the last stage runs (``models.blocks.BlockSpan``), run without."""
    lead: int = 0
    """The container index of block 0: the modules before it are no repeated blocks
    (``models.blocks.BlockSpan.lead``), which the first stage runs after the embedding."""
    config: object | None = None
    """The model's config object (the families read it, e.g. the attention kernel)."""
    positions: Callable[[int, torch.device], torch.Tensor] | None = None
    """(seq_len, device) -> the global positions of the tokens this rank runs, where they are
    not ``0 .. seq_len-1`` (context parallelism, ``passes/context_parallel.py``)."""


def stage_info(root: nn.Module) -> StageInfo | None:
    """The stage state of ``root`` (a ``StageModule``); ``None`` for another module."""
    info = root.__dict__.get(STAGE_ATTR)
    return info if isinstance(info, StageInfo) else None


def stage_seq_len(root: nn.Module) -> int:
    """The plan's sequence length of the stage ``root``; 0 where ``root`` is no stage."""
    info = stage_info(root)
    return 0 if info is None else info.seq_len


def stage_config(root: nn.Module) -> object | None:
    """The model's config object, read on the stage ``root`` (the model itself otherwise)."""
    info = stage_info(root)
    return getattr(root, "config", None) if info is None else info.config


def token_positions(root: nn.Module, seq_len: int, device: torch.device) -> torch.Tensor | None:
    """The global positions of the tokens a stage holds where they are not ``0 .. seq_len-1``
    (context parallelism gives each rank chunks of the sequence of ``seq_len`` tokens:
    ``StageInfo.positions``), on ``device``; ``None`` where they are."""
    info = stage_info(root)
    positions = None if info is None else info.positions
    return None if positions is None else positions(seq_len, device)


def causal_mask(seq_len: int, window: int | None, like: torch.Tensor) -> torch.Tensor:
    """The additive (1, 1, seq, seq) causal mask in ``like``'s dtype and device, for a
    transformers block whose eager attention adds the mask it is given and builds none itself;
    with ``window``, a query sees only the ``window`` latest keys, itself included
    (transformers' ``sliding_window_overlay``)."""
    import torch

    mask = torch.full((seq_len, seq_len), float("-inf"), device=like.device,
                      dtype=like.dtype).triu(1)
    if window is not None:
        mask = mask + torch.full_like(mask, float("-inf")).tril(-window)
    return mask[None, None]


def no_block_args(root: nn.Module, x: torch.Tensor, seq_len: int) -> tuple:
    """Blocks that take the activations only."""
    return ()


def call_positional(block: nn.Module, x: torch.Tensor, extra: tuple) -> torch.Tensor:
    """``block(x, *extra)``: a block whose extra arguments are positional."""
    return block(x, *extra)


def no_styles() -> dict[str, ParallelStyle]:
    """No family-specific styles under sequence parallelism."""
    return {}


def no_block_shards(block: nn.Module, styles: Mapping[str, str], tp: int) -> dict[str, int]:
    """A family whose modules run on a rank's shards as they are (their views read the heads
    as ``-1``): nothing to rewrite, every column split one section."""
    return {}


@dataclass(frozen=True)
class ModelParts:
    """One family's layout and calling convention (module paths are relative to the model)."""

    blocks: str
    """Path of the ``nn.ModuleList`` of repeated blocks (``layers``, ``model.layers``)."""
    first: tuple[str, ...]
    """Modules the first stage runs before the blocks (or parameters of the model root it
    reads, by name)."""
    last: tuple[str, ...]
    """Modules the last stage runs after the blocks (final norm, head; or parameters of the
    model root it reads, by name)."""
    head: str
    """The module whose output is the logits."""
    embedding: str
    """The token embedding (its whole output is sliced to sequence shards under sequence
    parallelism when the plan keeps the table whole)."""
    embed: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    """(root, tokens) -> the first block's input."""
    finish: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    """(root, last block's output) -> logits."""
    block_args: Callable[[nn.Module, torch.Tensor, int], tuple] = no_block_args
    """(root, activations, seq_len) -> the extra arguments the blocks take, which the stage
    hands ``call_block`` as they are (a generic decoder's: each module's own, by module)."""
    call_block: Callable[[nn.Module, torch.Tensor, tuple], torch.Tensor] = call_positional
    """(block, x, extra) -> the block's output; the stage calls the modules of the block
    container that are no repeated blocks (``models.blocks.BlockSpan``) by it too."""
    shared: tuple[str, ...] = ()
    """Modules every stage keeps (rotary tables)."""
    sequence_parallel_styles: Callable[[], dict[str, ParallelStyle]] = no_styles
    """The family's own extra styles under sequence parallelism (module path -> style)."""
    shard_block: Callable[[nn.Module, Mapping[str, str], int], dict[str, int]] = \
        no_block_shards
    """(block, the plan's style of each module by its path in the block, tp) -> the sections
    of each column split (path in the block -> 1, or 3 for a fused q, k and v projection),
    after making the block's modules compute on a rank's shards (a generic decoder's code,
    which reads its heads with the model's sizes, rewritten: ``models/generic/
    tensor_parallel.py``)."""
    embedding_in_shards: bool = True
    """Under sequence parallelism the token embedding hands the blocks sequence shards (its
    output reduce-scattered or sliced; other modules the embedding step adds, as a position
    table, split by the family's ``sequence_parallel_styles``); ``False``: the embedding step
    runs whole and the first block's input is sliced to the shards (a generic decoder, whose
    embedding step autopar reads off a graph)."""
