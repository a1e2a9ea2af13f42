"""Hand-written decoders in the styles newcomers write, as ``FILE.py:FACTORY`` models.

Each is what a user brings that no autopar family describes, written the way the tutorials
write it:

``make_llama``: Llama-style -- the blocks as ``self.blocks``, RoPE from an ``inv_freq`` buffer
and ``torch.arange`` positions (the rotate-half form), grouped-query attention through causal
SDPA with ``enable_gqa``, a SwiGLU MLP, RMSNorm modules in the blocks and the final norm
written inline in ``forward`` with a parameter of the model root. ``make_positions``:
GPT-style -- the learned position table is ``self.positions`` and the blocks ``self.blocks``
(the names a pipeline stage once kept for itself). ``make_mixer``: a token MLP-mixer -- each
block mixes the tokens by a causal (lower-triangular) learned (seq, seq) matrix. ``make_conv``:
a causal convolutional language model -- gated ``nn.Conv1d`` blocks in an ``nn.Sequential``.
``make_encoder``: a stack of torch's own ``nn.TransformerEncoderLayer`` (pre-norm, GELU, a
causal mask), learned positions and an untied head -- GPT's computation through a layer
autopar's op registry does not know, which must be traced into, not priced as one opaque op.

The shape is the one line of constants below: ``autopar.verify.models.decoder_file`` writes a
copy of this file with its own values for each property case (``autopar.verify.cases``), which
every rank then loads by path, as a user's file is; the tests load this file itself.
"""

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, SEQ, WIDTH, HEADS, KV_HEADS, FFN, LAYERS = 256, 32, 64, 4, 2, 128, 2


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Rotary(nn.Module):
    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, t: int):
        pos = torch.arange(t, device=self.inv_freq.device, dtype=self.inv_freq.dtype)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.head_dim = WIDTH // HEADS
        self.wq = nn.Linear(WIDTH, HEADS * self.head_dim, bias=False)
        self.wk = nn.Linear(WIDTH, KV_HEADS * self.head_dim, bias=False)
        self.wv = nn.Linear(WIDTH, KV_HEADS * self.head_dim, bias=False)
        self.wo = nn.Linear(HEADS * self.head_dim, WIDTH, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, HEADS, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, KV_HEADS, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, KV_HEADS, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(WIDTH, FFN, bias=False)
        self.w3 = nn.Linear(WIDTH, FFN, bias=False)
        self.w2 = nn.Linear(FFN, WIDTH, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(WIDTH), Attention()
        self.mlp_norm, self.mlp = RMSNorm(WIDTH), SwiGLU()

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class LlamaStyle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)
        self.rotary = Rotary(WIDTH // HEADS)
        self.blocks = nn.ModuleList(LlamaBlock() for _ in range(LAYERS))
        self.norm_weight = nn.Parameter(torch.ones(WIDTH))
        self.out = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens, targets=None):
        x = self.tok(tokens)
        cos, sin = self.rotary(tokens.shape[1])
        for block in self.blocks:
            x = block(x, cos, sin)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm_weight
        logits = self.out(x)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class GPTBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln_2(x))


class PositionsStyle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(SEQ, WIDTH)
        self.blocks = nn.ModuleList(GPTBlock() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class MixerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm_1, self.norm_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.token_mix = nn.Parameter(torch.randn(SEQ, SEQ) * 0.02)
        self.channel_mix = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                         nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        t = x.shape[1]
        mix = torch.tril(self.token_mix[:t, :t])
        x = x + torch.einsum("st,btd->bsd", mix, self.norm_1(x))
        return x + self.channel_mix(self.norm_2(x))


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(MixerBlock() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens, targets=None):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class ConvBlock(nn.Module):
    def __init__(self, kernel: int = 4) -> None:
        super().__init__()
        self.kernel = kernel
        self.norm = nn.LayerNorm(WIDTH)
        self.conv = nn.Conv1d(WIDTH, 2 * WIDTH, kernel)

    def forward(self, x):
        h = self.norm(x).transpose(1, 2)
        h = self.conv(F.pad(h, (self.kernel - 1, 0)))
        return x + F.glu(h, dim=1).transpose(1, 2)


class ConvLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(*(ConvBlock() for _ in range(LAYERS)))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens, targets=None):
        logits = self.head(self.blocks(self.embed(tokens)))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class EncoderStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(SEQ, WIDTH)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(
            WIDTH, HEADS, FFN, dropout=0.0, batch_first=True, norm_first=True,
            activation="gelu") for _ in range(LAYERS))
        self.norm, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, tokens, targets=None):
        t = tokens.shape[1]
        x = self.emb(tokens) + self.pos(torch.arange(t, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        for layer in self.layers:
            x = layer(x, src_mask=mask, is_causal=True)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_llama() -> nn.Module:
    return LlamaStyle()


def make_positions() -> nn.Module:
    return PositionsStyle()


def make_mixer() -> nn.Module:
    return Mixer()


def make_conv() -> nn.Module:
    return ConvLM()


def make_encoder() -> nn.Module:
    return EncoderStack()
