"""The fusion pass (``passes/fuse.py``) on the tiny models, in one process.

Every pattern is found where the model has it (counts below), parameter names do not change, and
the fused model computes the unfused model's loss and gradients. The kernels run in Triton's CPU
interpreter here (tests/conftest.py); they compute in fp32 as the eager ops do, in another order,
so the bound is rounding: loss within 1e-5 relative and every gradient within 1e-4 of its
tensor's largest entry (measured: ~1e-7 and ~3e-6).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from autopar import kernels
from autopar.core.errors import AutoparError
from autopar.models.hf_llama import HF_LLAMA_TINY
from autopar.passes.fuse import FUSIONS, LinearCrossEntropyHead, apply_fusions
from autopar.models.feed import logits_of
from autopar.models.training import ModelSpec, synthetic_batch, vocab_size

pytestmark = pytest.mark.skipif(not kernels.available(),
                                reason="the kernels need CUDA or TRITON_INTERPRET=1")

EXPECTED = {
    # 2 blocks: two norms each and the final norm; one MLP, one attention (q and k) per block
    "tiny-llama": {"rms_norm": 5, "layer_norm": 0, "swiglu": 2, "gelu": 0, "rope": 2,
                   "linear_cross_entropy": 1},
    "tiny-gpt": {"rms_norm": 0, "layer_norm": 5, "swiglu": 0, "gelu": 2, "rope": 0,
                 "linear_cross_entropy": 1},
    # fx cannot trace transformers' LlamaAttention, so its rotary embedding stays eager
    "transformers-llama": {"rms_norm": 5, "layer_norm": 0, "swiglu": 2, "gelu": 0, "rope": 0,
                           "linear_cross_entropy": 1},
}
# 6 query heads of 8, 2 kv heads: once left fx dead code whose purity check needed the
# graph's owning module (found by the property-based run, bench/fuzz_verify.py)
EXPECTED["llama-6-heads"] = {"rms_norm": 5, "layer_norm": 0, "swiglu": 2, "gelu": 0, "rope": 2,
                             "linear_cross_entropy": 1}
SPECS = {"llama-6-heads": ModelSpec("llama", dict(
             num_layers=2, hidden_size=48, num_heads=6, num_kv_heads=2, ffn_hidden_size=100,
             vocab_size=40, seq_len=24)),
         "tiny-llama": ModelSpec("tiny-llama"), "tiny-gpt": ModelSpec("tiny-gpt"),
         "transformers-llama": ModelSpec.transformers_config("LlamaForCausalLM", HF_LLAMA_TINY)}
LOSS_REL, GRAD_REL = 1e-5, 1e-4


def _loss(model: torch.nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    out = logits_of(model, tokens)
    head = getattr(model, "head", None) or model.lm_head
    if isinstance(head, LinearCrossEntropyHead):  # the model now returns the final hidden state
        return head.loss(out, targets)
    return F.cross_entropy(out.float().flatten(0, 1), targets.flatten(0, 1))


@pytest.mark.parametrize("label", list(EXPECTED))
def test_fusion_finds_every_pattern_keeps_names_and_matches_the_unfused_model(label):
    reference = SPECS[label].build("cpu", seed=0)
    fused = copy.deepcopy(reference)
    names = [n for n, _ in fused.named_parameters(remove_duplicate=False)]
    assert dict(apply_fusions(fused, FUSIONS)) == EXPECTED[label]
    assert [n for n, _ in fused.named_parameters(remove_duplicate=False)] == names
    assert list(fused.state_dict()) == list(reference.state_dict())

    tokens, targets = synthetic_batch(0, 2, 16, vocab_size(reference))
    ref_loss, loss = _loss(reference, tokens, targets), _loss(fused, tokens, targets)
    ref_loss.backward()
    loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= LOSS_REL * abs(ref_loss.item())
    ref_grads = dict(reference.named_parameters())
    for name, p in fused.named_parameters():
        r = ref_grads[name].grad
        assert (p.grad - r).abs().max() <= GRAD_REL * r.abs().max(), name


def test_gpt_tied_head_keeps_sharing_the_embedding():
    model = SPECS["tiny-gpt"].build("cpu", seed=0)
    apply_fusions(model, ("linear_cross_entropy",))
    assert model.head.weight is model.tok_emb.weight


def test_unknown_or_kernel_less_fusion_names_raise():
    model = SPECS["tiny-llama"].build("meta")
    with pytest.raises(AutoparError, match="unknown fusion 'nope'"):
        apply_fusions(model, ("nope",))
    with pytest.raises(AutoparError, match="has no kernel"):
        apply_fusions(model, ("scale_mask_softmax",))


def test_fused_loss_is_refused_under_tensor_parallelism():
    with pytest.raises(AutoparError, match="tp=2"):
        apply_fusions(SPECS["tiny-llama"].build("meta"), ("linear_cross_entropy",), tp=2)
