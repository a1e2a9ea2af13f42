"""How the interleaved schedule cuts the blocks into chunks: the one rule the cost model prices
(``costmodel/pipeline.py``) and the passes run (``passes/stage.py``)."""

from __future__ import annotations


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
