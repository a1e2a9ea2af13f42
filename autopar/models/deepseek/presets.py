"""The ``deepseek`` presets: DeepSeek-V3, Kimi-K2 and a tiny one for tests.

DeepSeek-V3 is DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv 2412.19437), section 4.2
(61 layers, hidden 7168, 128 attention heads, MLA with kv compression 512, query compression
1536, 128-dim q/k heads plus a 64-dim decoupled RoPE part, the first 3 layers dense, 1 shared
and 256 routed experts of intermediate 2048 per MoE layer, 8 routed per token, 671 B parameters
in all, 37 B activated; the balance loss weight alpha = 0.0001; no token dropped, section
2.1.2), with the config.json of the Hugging Face model card deepseek-ai/DeepSeek-V3 (dense
intermediate 18432, vocabulary 129280, v_head_dim 128, rms_norm_eps 1e-6, rope_theta 10000).
Pre-training sequence length 4096 (section 4.2). The preset counts 671.0 B parameters: the
report's main model, without the 11.5 B of its multi-token prediction module (which the zoo
does not build).

Kimi-K2 is Kimi Team, "Kimi K2: Open Agentic Intelligence" (arXiv 2507.20534), section 2.3 and
table 2 (DeepSeek-V3's architecture with 384 routed experts, 64 attention heads and one dense
layer; 1.04 T parameters in all, 32 B activated), with the config.json of the Hugging Face
model card moonshotai/Kimi-K2-Instruct (61 layers, hidden 7168, 64 heads, q_lora_rank 1536,
kv_lora_rank 512, qk_nope/qk_rope/v head dims 128/64/128, 384 routed experts top-8, 1 shared,
first_k_dense_replace 1, moe_intermediate_size 2048, intermediate_size 18432, vocabulary
163840, rope_theta 50000, rms_norm_eps 1e-6). Pre-training sequence length 4096 (the report's
section 3.1: 4K tokens before the long-context stages). Kimi-K2's router is DeepSeek-V3's
(sigmoid, bias-balanced); this family's is stated in ``model.py``; the MuonClip optimizer is not
modelled (AdamW is priced). The preset counts 1.026 T parameters where the report says 1.04 T
and the model card 1 T (the count of these config.json dims; no MTP layer in Kimi-K2).

Both gate sigmoid top-k and scale the routed output (``routed_scaling_factor`` 2.5 / 2.827);
neither changes a FLOP or a byte, and the family computes softmax top-k (``model.py``).
"""

from __future__ import annotations

from types import MappingProxyType

from autopar.models.presets import Preset

MLA = dict(attention="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
           qk_rope_head_dim=64, v_head_dim=128)
"""DeepSeek-V3's and Kimi-K2's attention dims (both config.json files)."""

PRESETS: tuple[Preset, ...] = (
    Preset("deepseek-v3", "deepseek", MappingProxyType(dict(
        num_layers=61, hidden_size=7168, num_heads=128, num_kv_heads=128, ffn_hidden_size=18432,
        moe_ffn_hidden_size=2048, num_experts=256, top_k=8, num_shared_experts=1,
        first_k_dense=3, vocab_size=129280, seq_len=4096, rope_theta=10000.0, norm_eps=1e-6,
        capacity_factor=None, router_aux_loss_coef=0.0001, router_groups=8,
        router_group_topk=4, **MLA)),
        "DeepSeek-V3 (MLA), 256 routed experts top-8 + 1 shared in 8 groups, each token's "
        "within 4 of them, first 3 layers dense; "
        "arXiv 2412.19437 sec. 4.2; HF deepseek-ai/DeepSeek-V3"),
    Preset("kimi-k2", "deepseek", MappingProxyType(dict(
        num_layers=61, hidden_size=7168, num_heads=64, num_kv_heads=64, ffn_hidden_size=18432,
        moe_ffn_hidden_size=2048, num_experts=384, top_k=8, num_shared_experts=1,
        first_k_dense=1, vocab_size=163840, seq_len=4096, rope_theta=50000.0, norm_eps=1e-6,
        capacity_factor=None, router_aux_loss_coef=0.0001, **MLA)),
        "Kimi-K2 (MLA, 64 heads), 384 routed experts top-8 + 1 shared, first layer dense; "
        "arXiv 2507.20534; HF moonshotai/Kimi-K2-Instruct"),
    Preset("tiny-deepseek", "deepseek", MappingProxyType(dict(
        num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=4, ffn_hidden_size=128,
        moe_ffn_hidden_size=32, num_experts=8, top_k=2, num_shared_experts=1, first_k_dense=1,
        vocab_size=256, seq_len=32, capacity_factor=None, attention="mla", q_lora_rank=24,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12)),
        "Tiny DeepSeek-V3-style MoE (MLA: q/k heads of 16 + 8 rope dims, v of 12; 8 routed "
        "experts top-2, 1 shared, 1 dense layer, dropless) for tests and CPU verification",
        tiny=True),
)
"""By size, the tiny one last."""
