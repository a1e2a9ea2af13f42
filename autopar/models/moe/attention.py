"""GPT-OSS's attention: learned sinks, a sliding window on some layers, biased projections.

OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv 2508.10925), section 2.1, and
transformers' ``GptOssAttention``/``eager_attention_forward`` (``models/gpt_oss/
modeling_gpt_oss.py``, transformers 5.x), which this module follows:

* **sinks**: a learned logit per query head, ``sinks`` (heads,), joins every softmax as one
  more column and is dropped after it, ``softmax([scores, sink])[..., :-1]``: the weights of a
  row sum to less than one, so a head can attend to nothing.
* **sliding window**: on the layers ``MoEConfig.layer_window`` names (GPT-OSS: the even ones,
  ``layer_types``), a query sees only its ``window`` latest keys, itself included
  (transformers' ``sliding_window_overlay``: ``q - k < window``); the other layers are causal.
* **biases** on q, k, v and o (``attention_bias``).

``sink_attention`` is the attention core -- scores, mask, the sink column, softmax, ``.v`` --
as one function, which ``torch.fx`` keeps as one call (``torch.fx.wrap`` below): the op
registry prices it as the fused kernel the engines run (Transformer Engine's learnable softmax
offset, FlashAttention-3's sinks), its FLOPs counting the window's band only
(``analysis/ops/attention.py``). Here it runs as transformers' eager form (the score matrix
materialised; no fused kernel with sinks and a backward exists in torch 2.13: FlexAttention has
no CPU backward), and the module takes the ``selective`` policy's core runner
(``ATTENTION_CORE_HOOK``), so under ``selective`` the core is recomputed from q, k and v in the
backward, as a fused kernel's backward recomputes its scores, and keeps no score matrix.

Under tensor parallelism a rank computes its own heads: ``passes/tensor_parallel.py`` splits
the parameters named by ``HEAD_PARAMS`` (the sinks) by heads with q, k and v, and the core
reads the local shard. Context parallelism is refused: its gathered-K/V attention
(``passes/context_parallel.py``) adds no sinks, so this module takes no context hook.
"""

from __future__ import annotations

import torch
import torch.fx
from torch import nn

from autopar.models.family import ATTENTION_CORE_HOOK, HEAD_PARAMS
from autopar.models.llama.model import DecoderConfig, rotary_qkv
from autopar.models.routing import local_weight


def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   sinks: torch.Tensor | None, window: int, scale: float) -> torch.Tensor:
    """Causal attention of q (b, heads, sq, d) over k, v (b, kv_heads, sk, d) with each head's
    sink logit in the softmax's denominator; ``window`` > 0: a query sees its ``window``
    latest keys only (0: every earlier key). The softmax runs in fp32. Queries are the last
    ``sq`` of the ``sk`` positions."""
    groups = q.size(1) // k.size(1)
    if groups > 1:  # each kv head serves its group of query heads (GQA)
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    sq, sk = q.size(-2), k.size(-2)
    scores = torch.matmul(q, k.transpose(-2, -1)).float() * scale
    rows = torch.arange(sq, device=q.device).unsqueeze(1) + (sk - sq)
    behind = rows - torch.arange(sk, device=q.device).unsqueeze(0)  # query pos - key pos
    hidden = behind < 0
    if window > 0:
        hidden = hidden | (behind >= window)
    scores = scores.masked_fill(hidden, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:
        sink = sinks.float().view(1, -1, 1, 1).expand(scores.size(0), -1, sq, 1)
        probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1).narrow(-1, 0, sk)
    return torch.matmul(probs.to(v.dtype), v)


# one node of the trace, priced by the op registry as fused attention (the module docstring)
torch.fx.wrap("sink_attention")


class SinkAttention(nn.Module):
    """GPT-OSS's grouped-query attention with RoPE: biased projections, per-head sinks, and
    a sliding window where ``window`` is set (the module docstring)."""

    def __init__(self, config: DecoderConfig, window: int | None) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        bias = getattr(config, "attention_bias", False)
        self.head_dim = d
        self.scale = d ** -0.5
        self.window = window
        """Keys a query sees, itself included; ``None``: every earlier key (a full layer)."""
        self.q_proj = nn.Linear(h, config.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(h, config.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(h, config.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(config.num_heads * d, h, bias=bias)
        self.sinks = (nn.Parameter(torch.empty(config.num_heads))
                      if getattr(config, "attention_sinks", False) else None)
        setattr(self, HEAD_PARAMS, ("sinks",) if self.sinks is not None else ())
        setattr(self, ATTENTION_CORE_HOOK, None)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = rotary_qkv(self, x, cos, sin)
        # the rank's heads of a DTensor split by heads (tensor parallelism)
        sinks = None if self.sinks is None else local_weight(self.sinks)
        window, scale = self.window or 0, self.scale
        runner = getattr(self, ATTENTION_CORE_HOOK)
        if runner is None:
            out = sink_attention(q, k, v, sinks, window, scale)
        else:
            out = runner(lambda q_, k_, v_: sink_attention(q_, k_, v_, sinks, window, scale),
                         q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))
