"""The compiled Triton kernels on a CUDA GPU against plain PyTorch, on larger odd shapes.

Skipped without CUDA. ``autopar.kernels`` is imported by a fixture, not at collection: importing
it imports Triton, and on a CPU machine ``tests/kernels`` wants to turn Triton's interpreter on
before that (see tests/kernels/conftest.py). Tolerances: ``kernel_parity.TOLERANCE``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))

from kernel_parity import assert_matches_reference, bench_module  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = [torch.float32, torch.bfloat16]
ROWS, COLS = 3001, 5000  # neither a power of two; 5000 pads to an 8192-wide row block


@pytest.fixture(scope="module")
def kernels():
    from autopar import kernels
    from autopar.kernels._launch import interpreting

    if interpreting():
        pytest.skip("TRITON_INTERPRET is on: tests/kernels covers the interpreter")
    return kernels


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, scale: float = 1.0,
          grad: bool = True) -> torch.Tensor:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(*shape, generator=generator, device="cuda") * scale
    return x.to(dtype).requires_grad_(grad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_match_reference_on_gpu(kernels, dtype):
    x = randn(ROWS, COLS, dtype=dtype, scale=2.0) + 1.0
    w, b = randn(COLS, dtype=dtype, seed=1), randn(COLS, dtype=dtype, seed=2)
    assert_matches_reference(kernels.rms_norm, kernels.rms_norm_reference, [x, w, 1e-6])
    assert_matches_reference(kernels.layer_norm, kernels.layer_norm_reference, [x, w, b, 1e-5])


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_match_reference_on_a_wide_row(kernels, dtype):
    x, w = randn(257, 8192, dtype=dtype), randn(8192, dtype=dtype, seed=1)
    assert_matches_reference(kernels.rms_norm, kernels.rms_norm_reference, [x, w, 1e-6])


@pytest.mark.parametrize("dtype", DTYPES)
def test_activations_match_reference_on_gpu(kernels, dtype):
    gate, up = randn(ROWS, COLS, dtype=dtype, scale=3.0), randn(ROWS, COLS, dtype=dtype, seed=1)
    assert_matches_reference(kernels.swiglu, kernels.swiglu_reference, [gate, up])
    assert_matches_reference(kernels.gelu, kernels.gelu_reference, [gate])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_matches_reference_on_gpu(kernels, dtype):
    from autopar.models.llama import rope_tables

    batch, q_heads, kv_heads, seq, head_dim = 2, 32, 8, 1000, 128
    cos, sin = rope_tables(seq, head_dim, 500000.0, device="cuda")
    q = randn(batch, seq, q_heads, head_dim, dtype=dtype, grad=False).transpose(1, 2)
    k = randn(batch, kv_heads, seq, head_dim, dtype=dtype, seed=1, grad=False)
    assert_matches_reference(kernels.rope, kernels.rope_reference,
                             [q.requires_grad_(), k.requires_grad_(), cos, sin])


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_cross_entropy_matches_reference_on_gpu(kernels, dtype):
    vocab, hidden_size = 50257, 1024
    hidden = randn(2, 1000, hidden_size, dtype=dtype)
    weight = randn(vocab, hidden_size, dtype=dtype, seed=1, scale=0.05)
    target = torch.randint(0, vocab, (2, 1000), device="cuda")
    target[1, :100] = -100
    assert_matches_reference(kernels.linear_cross_entropy, kernels.linear_cross_entropy_reference,
                             [hidden, weight, target])


def test_fused_loss_peak_memory_is_under_an_eighth_of_eager_at_llama3_vocabulary(kernels):
    from autopar.models.layers import lm_loss

    peak_bytes_above_start = bench_module().peak_bytes_above_start  # the benchmark's measure
    hidden = randn(4096, 1024, dtype=torch.bfloat16)
    weight = randn(128256, 1024, dtype=torch.bfloat16, seed=1, scale=0.05)
    target = torch.randint(0, 128256, (4096,), device="cuda")
    eager = peak_bytes_above_start(lambda: lm_loss(hidden @ weight.T, target).backward())
    hidden.grad = weight.grad = None
    fused = peak_bytes_above_start(
        lambda: kernels.linear_cross_entropy(hidden, weight, target).backward())
    # Both peaks include the gradients of hidden and weight (263 MB here).
    assert fused <= eager / 8, (fused, eager)
