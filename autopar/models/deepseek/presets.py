"""The ``deepseek`` presets: DeepSeek-V3 and a tiny one for tests.

DeepSeek-V3 is DeepSeek-AI, "DeepSeek-V3 Technical Report" (arXiv 2412.19437), section 4.2
(61 layers, hidden 7168, 128 attention heads, the first 3 layers dense, 1 shared and 256 routed
experts of intermediate 2048 per MoE layer, 8 routed per token, 671 B parameters in all, 37 B
activated; the balance loss weight alpha = 0.0001; no token dropped, section 2.1.2), with the
config.json of the Hugging Face model card deepseek-ai/DeepSeek-V3 (dense intermediate 18432,
vocabulary 129280). Pre-training sequence length 4096 (section 4.2). The attention is GQA, not
MLA (``model.py``): 128 key/value heads (multi-head, as MLA's 128 decompressed heads), so the
preset counts 672.1 B parameters where DeepSeek-V3's main model has 671 B.
"""

from __future__ import annotations

from types import MappingProxyType

from autopar.models.presets import Preset

PRESETS: tuple[Preset, ...] = (
    Preset("deepseek-v3", "deepseek", MappingProxyType(dict(
        num_layers=61, hidden_size=7168, num_heads=128, num_kv_heads=128, ffn_hidden_size=18432,
        moe_ffn_hidden_size=2048, num_experts=256, top_k=8, num_shared_experts=1,
        first_k_dense=3, vocab_size=129280, seq_len=4096, rope_theta=10000.0,
        capacity_factor=None, router_aux_loss_coef=0.0001)),
        "DeepSeek-V3 (GQA in place of MLA), 256 routed experts top-8 + 1 shared, first 3 "
        "layers dense; arXiv 2412.19437 sec. 4.2; HF deepseek-ai/DeepSeek-V3"),
    Preset("tiny-deepseek", "deepseek", MappingProxyType(dict(
        num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2, ffn_hidden_size=128,
        moe_ffn_hidden_size=32, num_experts=8, top_k=2, num_shared_experts=1, first_k_dense=1,
        vocab_size=256, seq_len=32, capacity_factor=None)),
        "Tiny DeepSeek-V3-style MoE (8 routed experts top-2, 1 shared, 1 dense layer, "
        "dropless) for tests and CPU verification", tiny=True),
)
"""By size, the tiny one last."""
