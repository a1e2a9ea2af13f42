"""A user's own mixture-of-experts decoder written the way hand-written MoEs usually are
(``FILE.py:FACTORY`` models of the generic family's expert-parallel tests).

``make``: token + learned position embeddings, pre-norm blocks of SDPA attention and a sparse
MLP -- a bias-free ``router`` (h -> E), top-2 with the weights renormalised over the two chosen,
and an ``nn.ModuleList`` of GELU MLP experts, each run on the rows ``torch.where`` finds for it
(Mixtral's reference ``MoeLayer``, nanoMoE) --, a final LayerNorm and an untied head.
``make_shared``: the same with a shared expert beside the routed ones, which autopar does not
recognise as a mixture of experts (its trace stops at the data-dependent row counts).
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, WIDTH, HEADS, LAYERS, EXPERTS, TOP_K = 256, 32, 64, 4, 2, 4, 2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, 2 * WIDTH)
        self.out = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return self.out(F.gelu(self.fc(x)))


class SparseMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(WIDTH, EXPERTS, bias=False)
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))

    def forward(self, x):
        flat = x.reshape(-1, x.size(-1))
        weights, chosen = torch.topk(self.router(flat), TOP_K, dim=-1)
        weights = weights.softmax(dim=-1)
        out = torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == i)
            out = out.index_add(0, rows, weights[rows, slot, None] * expert(flat[rows]))
        return out.view_as(x)


class SharedMLP(SparseMLP):
    def __init__(self) -> None:
        super().__init__()
        self.shared = Expert()

    def forward(self, x):
        return super().forward(x) + self.shared(x)


class Block(nn.Module):
    def __init__(self, mlp=SparseMLP) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(WIDTH), Attention(), nn.LayerNorm(WIDTH)
        self.moe = mlp()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.moe(self.ln_2(x))


class NanoMoE(nn.Module):
    def __init__(self, mlp=SparseMLP) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.h = nn.ModuleList(Block(mlp) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make():
    return NanoMoE()


def make_shared():
    return NanoMoE(SharedMLP)
