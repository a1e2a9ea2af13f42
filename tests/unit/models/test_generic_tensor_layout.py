"""A generic decoder's blocks under tensor parallelism, read off their code
(``models/generic/tensor_parallel.py``): which linears split, the heads, the fused sections,
what is refused and why, and the rewritten code computing each rank's share (checked in one
process: the ranks' row-split partial outputs add up to the module's output)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autopar.core.model_spec import ModelSpec
from autopar.models.generic.feature_split import propagate
from autopar.models.generic.tensor_parallel import install, model_layout, rewrite

NANOGPT = Path(__file__).resolve().parents[2] / "data" / "nanogpt.py"


def _nanogpt(factory: str) -> nn.Module:
    torch.manual_seed(0)
    return ModelSpec.parse(f"{NANOGPT}:{factory}").build("cpu", 0)


def test_the_fused_attention_splits_by_sections_and_heads_and_the_mlp_by_features() -> None:
    layout = model_layout(_nanogpt("make"), "transformer.h")
    assert not isinstance(layout, str), layout
    attn, mlp = layout.found["attn"], layout.found["mlp"]
    assert dict(attn.columns) == {"c_attn": 3} and attn.rows == ("c_proj",)
    assert attn.heads == (4, 4) and layout.heads == (4, 4)
    assert dict(mlp.columns) == {"0": 1} and mlp.rows == ("2",)
    assert attn.problem(2) is None and "4 attention heads" in attn.problem(8)
    # split(c), three view(b, t, 4, c // 4) and reshape(b, t, c): five sizes a rank divides
    assert len(attn.sites) == 5


def _rank_module(module: nn.Module, region, layout, tp: int, rank: int) -> nn.Module:
    """A copy of ``module`` holding rank ``rank``'s shards, running the rewritten code."""
    import copy

    local = copy.deepcopy(module)
    for name, sections in layout.columns.items():
        lin = local.get_submodule(name)
        w = lin.weight.detach().chunk(sections, 0)
        lin.weight = nn.Parameter(torch.cat([s.chunk(tp, 0)[rank] for s in w]))
        b = lin.bias.detach().chunk(sections, 0)
        lin.bias = nn.Parameter(torch.cat([s.chunk(tp, 0)[rank] for s in b]))
    for name in layout.rows:
        lin = local.get_submodule(name)
        lin.weight = nn.Parameter(lin.weight.detach().chunk(tp, 1)[rank])
        if rank:
            lin.bias = nn.Parameter(torch.zeros_like(lin.bias))
    install(local, rewrite(region, layout, tp))
    return local


@pytest.mark.parametrize("factory", ["make", "make_separate"])
@pytest.mark.parametrize("tp", [2, 4])
def test_the_ranks_rewritten_code_adds_up_to_the_attention(factory: str, tp: int) -> None:
    model = _nanogpt(factory)
    layout = model_layout(model, "transformer.h")
    region = layout.regions["attn"]
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 8, 64)
    mask = None if factory == "make" else torch.ones(8, 8, dtype=torch.bool).tril()
    want = attn(x, mask)
    got = sum(_rank_module(attn, region, layout.found["attn"], tp, r)(x, mask)
              for r in range(tp))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class _Block(nn.Module):
    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attn = attention
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class _Model(nn.Module):
    def __init__(self, attention: type) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 32)
        self.blocks = nn.ModuleList(_Block(attention()) for _ in range(2))
        self.head = nn.Linear(32, 16)

    def forward(self, idx):
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class _NormedQ(nn.Module):
    """q normalised over all its features before the heads are cut: no rank has them all."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(32, 32) for _ in range(3))
        self.q_norm = nn.LayerNorm(32)
        self.o = nn.Linear(32, 32)

    def forward(self, x):
        b, t, c = x.shape
        q = self.q_norm(self.q(x)).view(b, t, 4, 8).transpose(1, 2)
        k, v = (p(x).view(b, t, 4, 8).transpose(1, 2) for p in (self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, c))


class _ReadsWidth(nn.Module):
    """The head count computed from the split features' own size."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.o = nn.Linear(32, 32)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, z.size(-1) // 8, 8).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, 32))


class _UnevenFused(nn.Module):
    """q, k and v fused with fewer key/value heads: sections of unequal width."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 64)
        self.o = nn.Linear(32, 32)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split([32, 16, 16], dim=-1)
        q = q.view(b, t, 4, 8).transpose(1, 2)
        k, v = (z.view(b, t, 2, 8).transpose(1, 2) for z in (k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, t, c))


@pytest.mark.parametrize("attention, reason", [
    (_NormedQ, "normalises over a column split's features"),
    (_ReadsWidth, "reads the size of a column split's features"),
    (_UnevenFused, "anywhere but into the equal sections"),
])
def test_an_attention_the_ranks_cannot_run_is_refused_with_the_op_and_the_mlp_still_splits(
        attention: type, reason: str) -> None:
    layout = model_layout(_Model(attention), "blocks")
    assert not isinstance(layout, str), layout
    assert isinstance(layout.found["attn"], str) and reason in layout.found["attn"]
    assert dict(layout.found["mlp"].columns) == {"0": 1}
    why = layout.problem({"attn.q": "column", "attn.qkv": "column", "attn.o": "row",
                          "mlp.0": "column", "mlp.2": "row"}, 2)
    assert why is not None and reason in why
    assert layout.problem({"mlp.0": "column", "mlp.2": "row"}, 2) is None


def test_a_plan_whose_row_split_is_not_where_the_columns_close_is_refused() -> None:
    layout = model_layout(_nanogpt("make"), "transformer.h")
    region = layout.regions["mlp"]
    assert propagate(region, frozenset({"0"})).rows == ("2",)
    why = layout.problem({"mlp.0": "column"}, 2)
    assert why is not None and "reach 2" in why
