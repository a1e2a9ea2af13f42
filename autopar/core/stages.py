"""How the interleaved schedule cuts the blocks into chunks: the one rule the cost model prices
(``costmodel/pipeline.py``) and the passes run (``passes/stage.py``)."""

from __future__ import annotations


def chunk_sizes(num_blocks: int, chunks: int) -> list[int]:
    """Blocks of each of ``chunks`` model chunks, as even as can be: the first
    ``num_blocks % chunks`` chunks one block more. Pipeline rank ``r`` of ``pp`` runs chunks
    ``r, r + pp, ...`` (Narayanan et al. 2021, sec. 2.2.2; torch's
    ``ScheduleInterleaved1F1B``)."""
    base, rest = divmod(num_blocks, chunks)
    return [base + (1 if i < rest else 0) for i in range(chunks)]


def rank_blocks(num_blocks: int, pp: int, virtual_stages: int) -> list[int]:
    """Blocks each pipeline rank holds under the interleaved schedule (all its chunks)."""
    sizes = chunk_sizes(num_blocks, pp * virtual_stages)
    return [sum(sizes[r::pp]) for r in range(pp)]
