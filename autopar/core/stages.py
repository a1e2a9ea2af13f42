"""How the interleaved schedule cuts the blocks into chunks: the one rule the cost model prices
(``costmodel/pipeline.py``) and the passes run (``passes/stage.py``); and the blocks per rank
of a Megatron-Core pipeline layout a published run states (``layout_stage_blocks``)."""

from __future__ import annotations

import re

from .errors import AutoparError

ENDS_AS_CHUNKS = 2
"""How many more chunks than blocks a model may be cut into: the embedding and the loss each
count as one layer (``chunk_sizes``)."""


def chunk_sizes(num_blocks: int, chunks: int) -> list[int]:
    """Blocks of each of ``chunks`` model chunks, as even as can be: the first
    ``num_blocks % chunks`` chunks one block more. Pipeline rank ``r`` of ``pp`` runs chunks
    ``r, r + pp, ...`` (Narayanan et al. 2021, sec. 2.2.2; torch's
    ``ScheduleInterleaved1F1B``).

    With one or two more chunks than blocks, the embedding and then the loss count as a layer
    each (Megatron-LM's ``--account-for-embedding-in-pipeline-split`` and
    ``--account-for-loss-in-pipeline-split``): the first chunk holds the embedding alone, the
    last (with two more) the final norm, head and loss alone, every other chunk one block --
    Qwen3-235B's 94 layers in 32 x 3 chunks."""
    extra = chunks - num_blocks
    if 0 < extra <= ENDS_AS_CHUNKS:
        return [0] + [1] * num_blocks + [0] * (extra - 1)
    base, rest = divmod(num_blocks, chunks)
    return [base + (1 if i < rest else 0) for i in range(chunks)]


def rank_blocks(num_blocks: int, pp: int, virtual_stages: int) -> list[int]:
    """Blocks each pipeline rank holds under the interleaved schedule (all its chunks)."""
    sizes = chunk_sizes(num_blocks, pp * virtual_stages)
    return [sum(sizes[r::pp]) for r in range(pp)]


def stage_chunks(stage_blocks: tuple[int, ...] | list[int], virtual_stages: int) -> list[int]:
    """Blocks of each model chunk in layer order (chunk ``i`` on pipeline rank ``i % pp``) of a
    plan's blocks per pipeline rank: the ranks' own counts with one chunk each, else
    ``chunk_sizes``, which must give each rank its count (``ValueError`` otherwise)."""
    pp = len(stage_blocks)
    if virtual_stages == 1:
        return list(stage_blocks)
    chunks = chunk_sizes(sum(stage_blocks), pp * virtual_stages)
    if [sum(chunks[r::pp]) for r in range(pp)] != list(stage_blocks):
        raise ValueError(f"stage blocks {tuple(stage_blocks)} are not the interleaved "
                         f"schedule's chunks {chunks}")
    return chunks


LAYOUT_LAYERS = {"E": "embedding", "t": "transformer layer", "m": "multi-token prediction layer",
                 "L": "loss"}
"""The layer characters of Megatron-Core's ``--pipeline-model-parallel-layout``
(``PipelineParallelLayerLayout.parse_str_to_list``)."""


def layout_chunks(layout: str) -> list[str]:
    """The model chunks of a Megatron-Core pipeline layout, in layer order, each the string of
    its layers' characters (``LAYOUT_LAYERS``): chunks split by ``|``, ``(...)*n`` and
    ``x*n`` unrolled, commas ignored, as Megatron-Core parses it -- ``"Et|(tt|)*30mL"`` is
    ``["Et", "tt", ..., "tt", "mL"]``, 32 chunks. ``AutoparError`` for another character."""
    text = layout.replace(",", "").replace(" ", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    chunks = text.split("|")
    bad = sorted({ch for chunk in chunks for ch in chunk} - set(LAYOUT_LAYERS))
    if bad:
        raise AutoparError(f"pipeline layout {layout!r} has {', '.join(map(repr, bad))}, not a "
                           "layer of Megatron-Core's layouts", where="pipeline layout",
                           fix="use E (embedding), t (transformer layer), m (MTP layer), L "
                               "(loss), | between chunks and (...)*n")
    return chunks


def layout_stage_blocks(layout: str, pp: int, num_blocks: int) -> tuple[int, ...]:
    """Blocks per pipeline rank (all its chunks: chunk ``i`` on rank ``i % pp``) of a
    Megatron-Core layout (``layout_chunks``) for a model of ``num_blocks`` repeated blocks.
    The layout's transformer layers beyond the blocks are the model's leading layers, which
    the first stage runs before its blocks (DeepSeek-V3's dense layers, ``models/blocks.py``:
    a block group's ``lead``); the embedding, the loss and multi-token prediction layers are no
    blocks. ``AutoparError`` where the chunks are not a multiple of ``pp`` or there are fewer
    transformer layers than blocks."""
    chunks = layout_chunks(layout)
    if len(chunks) % pp:
        raise AutoparError(f"pipeline layout {layout!r} has {len(chunks)} chunks, not a multiple "
                           f"of pp={pp}", where="pipeline layout",
                           fix="give pp x virtual stages chunks")
    lead = sum(chunk.count("t") for chunk in chunks) - num_blocks
    if lead < 0:
        raise AutoparError(f"pipeline layout {layout!r} places "
                           f"{num_blocks + lead} transformer layers, the model has {num_blocks} "
                           "blocks", where="pipeline layout", fix="place every layer")
    blocks = []
    for chunk in chunks:
        layers = chunk.count("t")
        skipped = min(lead, layers)
        lead -= skipped
        blocks.append(layers - skipped)
    return tuple(sum(blocks[r::pp]) for r in range(pp))


TORCH_ACTIVE_STAGES = 3
"""How many of a rank's stages torch's interleaved runtime keeps gathered at a time
(``_add_unshard_reshard(max_active_stages=3)`` in ``pipelining/schedules.py``)."""


def gathered_stages(zero: int, chunks: int) -> int:
    """How many of a rank's ``chunks`` stages keep their FSDP parameters gathered at once under
    the interleaved schedule (``passes/pipeline.py:InterleavedSchedule`` lowers torch's with
    it): all of them under ZeRO 0-2, which gather them once a step and hold them
    (``passes/data_parallel.py``, priced so by ``costmodel/dp_comm.py``); torch's three under
    ZeRO-3, which lets them go after every forward and backward anyway."""
    return chunks if zero < 3 else min(chunks, TORCH_ACTIVE_STAGES)
