"""A user's own nanoGPT-style decoder (``FILE.py:FACTORY`` models of the generic family's tests).

``make``: token + learned position embeddings, an ``nn.ModuleList`` of pre-norm blocks (a fused
``c_attn`` read by a fixed head count, SDPA, a GELU MLP), a final LayerNorm and ``lm_head`` tied
to the token embedding; ``forward(idx, targets=None)`` -> logits. ``make_skip``: the same
blocks, but each block's output is added to the embedding (not a chain: pp = 1 only).
``make_separate``: q, k and v as separate ``nn.Linear`` layers and blocks that take a causal
mask computed before them from the sequence length.
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, WIDTH, HEADS, LAYERS = 256, 32, 64, 4, 4


class FusedAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, mask=None):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class SeparateAttention(FusedAttention):
    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.c_proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, mask=None):
        b, t, c = x.shape
        q, k, v = (p(x).view(b, t, -1, c // HEADS).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, attention=FusedAttention) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(WIDTH), attention(), nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    def __init__(self, attention=FusedAttention) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, WIDTH), wpe=nn.Embedding(SEQ, WIDTH), drop=nn.Dropout(0.0),
            h=nn.ModuleList(Block(attention) for _ in range(LAYERS)), ln_f=nn.LayerNorm(WIDTH)))
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def embed(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        return self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))

    def forward(self, idx, targets=None):
        x = self.embed(idx)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class SkipGPT(NanoGPT):
    def forward(self, idx, targets=None):
        x0 = x = self.embed(idx)
        for block in self.transformer.h:
            x = block(x) + x0
        return self.lm_head(self.transformer.ln_f(x))


class MaskedGPT(NanoGPT):
    def forward(self, idx, targets=None):
        t = idx.size(1)
        mask = torch.ones((t, t), dtype=torch.bool, device=idx.device).tril()
        x = self.embed(idx)
        for block in self.transformer.h:
            x = block(x, mask)
        return self.lm_head(self.transformer.ln_f(x))


def make():
    return NanoGPT()


def make_skip():
    return SkipGPT()


def make_separate():
    return MaskedGPT(SeparateAttention)
