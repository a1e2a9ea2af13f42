"""Megatron-Core pipeline layouts read as blocks per rank (``core/stages.py``), against the
layouts Megatron-Bridge's DeepSeek-V3 recipes set (``recipes/deepseek/h100/deepseek_v3.py``:
``set_deepseek_v3_pipeline_model_parallel_layout`` and the 1024-GPU H100 perf recipe's
``Et|(tt|)*30mL``) and the export's own layouts (``exports/megatron.py:layout_string``)."""

from __future__ import annotations

import pytest

from autopar import AutoparError
from autopar.core.stages import layout_chunks, layout_stage_blocks
from autopar.exports.megatron import layout_string


def test_megatron_cores_syntax_unrolls_as_its_parser_does():
    # Megatron-Core's docstring example: "Ettt|(tt|)*29,m|L" -> [E,t,t,t] + [t,t]*29 + [m], [L]
    assert layout_chunks("Ettt|(tt|)*29,m|L") == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    assert layout_chunks("Et*3|t*4") == ["Ettt", "tttt"]
    with pytest.raises(AutoparError, match="'x'"):
        layout_chunks("Et|tx")


def test_deepseek_v3s_layout_leaves_its_dense_layers_to_the_first_stage():
    # 61 layers, the first 3 dense (autopar's lead, before the 58 blocks), MTP and the loss last:
    # rank 0 holds chunks 0, 8, 16, 24 = E+dense, 2, 2, 2; rank 1 chunk 1 = 2 dense + 3 x 2
    assert layout_stage_blocks("Et|(tt|)*30mL", 8, 58) == (6, 6, 8, 8, 8, 8, 8, 6)
    # Bridge's (4, 4) layout: E + 4 layers, 14 chunks of 4, the last layer with MTP and loss
    assert layout_stage_blocks("Et*4|(t*4|)*14t,mL", 4, 58) == (13, 16, 16, 13)


def test_the_exports_layouts_read_back_as_the_plans_stages():
    chunks = [1, 3, 3, 3, 3, 3, 3, 2]  # 21 blocks on pp 4 x 2 chunks, uneven
    layout = layout_string(chunks)
    assert layout_stage_blocks(layout, 4, 21) == tuple(
        sum(chunks[r::4]) for r in range(4))


def test_layouts_the_plan_cannot_take_are_refused():
    with pytest.raises(AutoparError, match="not a multiple of pp=4"):
        layout_stage_blocks("Et|tt|ttL", 4, 5)
    with pytest.raises(AutoparError, match="places 5 transformer layers"):
        layout_stage_blocks("Et|tt|ttL", 3, 6)
