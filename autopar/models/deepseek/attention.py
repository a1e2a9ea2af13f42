"""Multi-head latent attention (MLA): DeepSeek-V2/V3's attention (DeepSeek-AI, "DeepSeek-V2",
arXiv 2405.04434, section 2.1, eq. 9-19; "DeepSeek-V3 Technical Report", arXiv 2412.19437,
section 2.1.1), as its reference code and transformers' ``DeepseekV3Attention`` compute it in
training (the latent is decompressed per head; no absorbed weights).

With ``H`` heads, ``d_nope`` (``qk_nope_head_dim``), ``d_rope`` (``qk_rope_head_dim``) and
``d_v`` (``v_head_dim``), for an input ``x`` (b, s, h):

* queries: ``q_b_proj(q_a_layernorm(q_a_proj(x)))`` -- h -> ``q_lora_rank`` -> RMSNorm ->
  ``H * (d_nope + d_rope)`` -- or one ``q_proj`` where ``q_lora_rank`` is ``None``
  (DeepSeek-V2-Lite); each head's last ``d_rope`` features are rotated;
* keys and values: ``kv_a_proj_with_mqa`` maps h to ``kv_lora_rank + d_rope``: the latent
  ``c_kv`` (RMSNorm ``kv_a_layernorm``, then ``kv_b_proj`` to ``H * (d_nope + d_v)``: each
  head's k_nope and v) and one rotated key part ``k_rope`` that every head shares (the
  decoupled RoPE key, eq. 15);
* scores over ``d_nope + d_rope`` = 192 features (q = [q_nope, q_rope], k = [k_nope, k_rope]),
  scaled by ``1/sqrt(d_nope + d_rope)``; causal SDPA with v of ``d_v`` = 128; ``o_proj``
  maps ``H * d_v`` to h.

RoPE is the rotate-half form of the Llama family (``llama/model.py``) on the ``d_rope``
features; DeepSeek's code rotates interleaved pairs, which is the same function up to a fixed
permutation of q_b_proj's and kv_a_proj's rope rows. DeepSeek-V3's YaRN scaling (its config's
``rope_scaling``, factor 40) extends the context after pre-training; pre-training at 4K uses
plain RoPE, as here.

Under tensor parallelism the heads split: ``q_b_proj`` and ``kv_b_proj`` by columns (whole
heads per rank), ``o_proj`` by rows; the low-rank projections and their norms run whole on
every rank on replicated DTensors (``passes/tensor_parallel.py``), and their weights'
gradients sum over the tp ranks. The shared ``k_rope`` leaves that replicated region for the
rank's heads through ``heads_share``: its gradient, each rank's heads' part, is a partial sum.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from autopar.models.llama.model import apply_rope
from autopar.models.routing import dtensor_module

if TYPE_CHECKING:
    from autopar.models.deepseek.model import DeepSeekConfig


def heads_share(t: torch.Tensor) -> torch.Tensor:
    """``t``, a tensor every head reads (MLA's shared rope key), as the rank's local tensor:
    a replicated DTensor of the tensor-parallel region becomes its local copy whose gradient
    -- the rank's heads' part -- is a partial sum over the tp ranks; a plain tensor is
    returned as is."""
    dtensor = dtensor_module(t)
    if dtensor is not None:
        return t.to_local(grad_placements=[dtensor.Partial()] * t.device_mesh.ndim)
    return t


class MLAttention(nn.Module):
    """Causal multi-head latent attention (module docstring); no biases."""

    def __init__(self, config: DeepSeekConfig) -> None:
        super().__init__()
        h, heads = config.hidden_size, config.num_heads
        self.nope, self.rope, self.v_dim = (config.qk_nope_head_dim, config.qk_rope_head_dim,
                                            config.v_head_dim)
        self.kv_lora_rank = config.kv_lora_rank
        self.scale = 1.0 / math.sqrt(self.nope + self.rope)
        qk = heads * (self.nope + self.rope)
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(h, qk, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, config.q_lora_rank, bias=False)
            self.q_a_layernorm = nn.RMSNorm(config.q_lora_rank, eps=config.norm_eps)
            self.q_b_proj = nn.Linear(config.q_lora_rank, qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.kv_lora_rank + self.rope, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(self.kv_lora_rank, eps=config.norm_eps)
        self.kv_b_proj = nn.Linear(self.kv_lora_rank, heads * (self.nope + self.v_dim),
                                   bias=False)
        self.o_proj = nn.Linear(heads * self.v_dim, h, bias=False)
        self.context_parallel: nn.Module | None = None
        """Set by ``passes/context_parallel.py`` under cp > 1: this rank's queries against the
        whole sequence's keys and values, in place of causal SDPA."""

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "q_proj"):
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: the same code runs on a tensor-parallel shard holding a subset of heads
        q = self._queries(x).view(b, s, -1, self.nope + self.rope).transpose(1, 2)
        q_nope, q_rope = torch.split(q, [self.nope, self.rope], dim=-1)
        latent, k_rope = torch.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank, self.rope],
                                     dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent))
        kv = kv.view(b, s, -1, self.nope + self.v_dim).transpose(1, 2)
        k_nope, v = torch.split(kv, [self.nope, self.v_dim], dim=-1)
        k_rope = heads_share(k_rope).view(b, 1, s, self.rope)  # one rope key for every head
        q = torch.cat((q_nope, apply_rope(q_rope, cos, sin)), dim=-1)
        k_rope = apply_rope(k_rope, cos, sin).expand(-1, k_nope.size(1), -1, -1)
        k = torch.cat((k_nope, k_rope), dim=-1)
        if self.context_parallel is not None:
            out = self.context_parallel(q, k, v, scale=self.scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))
