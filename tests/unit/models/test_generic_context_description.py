"""Context parallelism of generic decoders (``FILE.py:FACTORY``): admitted where the blocks'
attention is causal SDPA with no mask and the positions an arange over the sequence
(``models/generic/context.py``), refused with the reason before any process starts otherwise;
and the function mode that runs a block's SDPA by its hook."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autopar import AutoparError, ParallelConfig, TrainSpec
from autopar.analysis.admissibility import check, facts_of
from autopar.core.model_spec import ModelSpec
from autopar.models.generic.context import ContextAttentionMode, sequence_positions

NANOGPT = Path(__file__).resolve().parents[2] / "data" / "nanogpt.py"
TRAIN = TrainSpec(global_batch=4, seq_len=32, precision="fp32")
VOCAB, SEQ, WIDTH, HEADS = 64, 32, 16, 2


def _file_model(factory: str) -> nn.Module:
    return ModelSpec.parse(f"{NANOGPT}:{factory}").build("cpu", 0)


def _refusal(model: nn.Module) -> str:
    with pytest.raises(AutoparError, match="cp=2") as err:
        check(facts_of(model), ParallelConfig(cp=2), TRAIN)
    return err.value.what


class HandAttention(nn.Module):
    """nanoGPT's own pre-flash attention: a registered causal-mask buffer, masked_fill, softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.c_attn, self.c_proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.register_buffer("bias", torch.tril(torch.ones(SEQ, SEQ)).view(1, 1, SEQ, SEQ))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class SdpaAttention(HandAttention):
    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, attention: type[nn.Module]) -> None:
        super().__init__()
        self.norm, self.attn = nn.LayerNorm(WIDTH), attention()

    def forward(self, x):
        return x + self.attn(self.norm(x))


class Decoder(nn.Module):
    def __init__(self, attention: type[nn.Module] = SdpaAttention) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(Block(attention) for _ in range(2))
        self.head = nn.Linear(WIDTH, VOCAB)

    def positions(self, idx):
        return torch.arange(idx.size(1), device=idx.device)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(self.positions(idx))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class OffsetPositions(Decoder):
    def positions(self, idx):  # positions from 1: not an arange the description can find
        return torch.arange(1, idx.size(1) + 1, device=idx.device) % SEQ


def test_nanogpt_with_causal_sdpa_and_arange_positions_is_admitted() -> None:
    facts = facts_of(_file_model("make"))
    assert facts.context_attention and facts.context_refused is None
    check(facts, ParallelConfig(cp=2), TRAIN)
    check(facts_of(Decoder()), ParallelConfig(cp=2), TRAIN)


def test_hand_written_masked_softmax_attention_is_refused_with_the_reason() -> None:
    what = _refusal(Decoder(HandAttention))
    assert "its block blocks.0 reads its buffer attn.bias" in what, what
    # plans without cp still run it
    check(facts_of(Decoder(HandAttention)), ParallelConfig(pp=2, micro_batch=1), TRAIN)


def test_a_mask_passed_to_sdpa_is_refused_with_the_reason() -> None:
    # make_separate: blocks take a tril mask built from the sequence length before them
    assert "with a mask" in _refusal(_file_model("make_separate"))


def test_positions_other_than_an_arange_over_the_sequence_are_refused() -> None:
    assert "not an arange over the tokens' sequence length" in _refusal(OffsetPositions())


class RopeTable(nn.Module):
    """A cached rotary table cut to the sequence: a buffer a cp rank would slice at [:t]."""

    def __init__(self) -> None:
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, WIDTH, 2).float() / WIDTH))
        self.register_buffer("table", torch.outer(torch.arange(SEQ).float(), inv_freq))

    def forward(self, t):
        return self.table[:t].cos()


class TableDecoder(Decoder):
    def __init__(self) -> None:
        super().__init__()
        self.rope = RopeTable()

    def forward(self, idx):
        x = self.wte(idx) + self.rope(idx.size(1)).repeat(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_rope_from_inv_freq_times_the_positions_is_admitted_and_a_sliced_table_refused():
    # inv_freq is read whole (outer with the arange the rank's global positions replace);
    # a cached table cut to [:t] would be cut at the rank's local positions
    from autopar.verify import decoders as verify_decoders

    llama = ModelSpec.parse(f"{verify_decoders.__file__}:make_llama").build("meta")
    facts = facts_of(llama)
    assert facts.context_refused is None, facts.context_refused
    check(facts, ParallelConfig(cp=2), TRAIN)
    assert "read the buffer rope.table" in _refusal(TableDecoder())


def test_the_mode_runs_a_blocks_causal_sdpa_by_its_hook_and_nothing_else() -> None:
    calls = []

    def hook(q, k, v, **kwargs):
        calls.append(kwargs)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=kwargs["scale"])

    block = Block(SdpaAttention)
    x = torch.randn(2, 8, WIDTH)
    with torch.no_grad():
        plain = block(x)
        with ContextAttentionMode(hook):
            hooked = block(x)
    assert len(calls) == 1 and calls[0]["scale"] is None and calls[0]["dropout_p"] == 0.0
    torch.testing.assert_close(hooked, plain)


def test_sequence_positions_is_the_arange_without_cp_and_the_ranks_positions_under_it() -> None:
    assert torch.equal(sequence_positions(None, 0, 4), torch.arange(4))
    held = torch.tensor([0, 1, 6, 7])
    assert torch.equal(sequence_positions(held, 4, dtype=torch.int32),
                       held.to(torch.int32))
    with pytest.raises(AutoparError):
        sequence_positions(held, 6)
