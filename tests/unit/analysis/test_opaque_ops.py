"""Ops autopar cannot see into are traced into, priced by torch's count, or refused -- never free.

Issue 28's rule (``autopar/analysis/ops/opaque.py`` argues it): a ``torch.nn`` module the op registry
does not know is traced into; an op no family owns gets the FLOPs torch counts for it, and is
refused when it reads parameters and torch counts none.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import register_flop_formula

import autopar
from autopar import AutoparError, ClusterSpec, ParallelConfig, TrainSpec
from autopar.core.roofline import OpKind
from autopar.analysis.ops import is_known, kind_of
from autopar.analysis.tracing import trace


def _encoder(vocab: int, d: int, layers: int, heads: int, seq: int, device: str = "cpu"
             ) -> nn.Module:
    """A stack of torch's ``nn.TransformerEncoderLayer`` (``autopar/verify/decoders.py``'s
    newcomer style ``encoder``: pre-norm, GELU MLP of 4d, causal mask, untied head)."""
    import tempfile

    from autopar.verify.models import Shape, decoder_spec

    shape = Shape(layers=layers, heads=heads, kv_heads=heads, head_dim=d // heads, vocab=vocab,
                  ffn=4 * d, seq=seq)
    return decoder_spec("encoder", shape, tempfile.gettempdir()).build(device)


def test_torch_nn_layer_without_a_rule_is_traced_into_and_its_gemms_counted() -> None:
    b, s, h, heads, layers = 2, 16, 32, 4, 2
    graph = trace(_encoder(64, h, layers, heads, s), batch=b, seq_len=s)
    assert not [n for n in graph.nodes if n.op == "TransformerEncoderLayer"]
    block = [n for n in graph.nodes if n.block == 0]
    # Megatron-LM's per-layer count (Narayanan et al. 2021): 24 b s h^2 for QKV, projection
    # and the 4h MLP, plus 4 b s^2 h for the attention scores and their product with V
    gemm = sum(n.fwd_flop for n in block if n.op == "linear")
    attention = sum(n.fwd_flop for n in block if n.op == "sdpa")
    assert gemm == 24 * b * s * h * h
    assert attention == 4 * b * s * s * h


def test_encoder_stack_is_priced_like_the_gpt_of_its_shape() -> None:
    """Issue 28's comparison at its flags (hgx-h100-80g, global batch 64, seq 2048, dp 8), at 4
    layers of width 2048 to keep the trace short. Same computation, so the step time and peak
    agree within 12 % and 4 %, the encoder above the gpt. The basis of each tolerance is what
    the two really differ in: the encoder's ``nn.MultiheadAttention`` copies its packed q/k/v
    projection (``.contiguous()``, 3 b s h elements read and written, forward and backward:
    ~6 % of a block at this shape) and builds the causal mask in the forward (``full`` +
    ``triu``), which its attention then reads whole, where the gpt's ``is_causal`` kernel skips
    the masked half of the scores (measured 2026-11-27: 1.104 with both, the attention ~4 %
    of the step more), and its head is untied (50304 x 2048 more parameters: +0.24 GiB of
    weights and optimizer state here, ~2 % of the peak). Before the fix the encoder was priced at ~1/6 of
    the gpt's step time (its layers as memory-bound leaves of 0 FLOPs)."""
    shape = dict(vocab=50304, d=2048, layers=4, heads=16, seq=2048)
    encoder = _encoder(**shape, device="meta")
    gpt = autopar.models.build("gpt", num_layers=4, hidden_size=2048, num_heads=16,
                               vocab_size=50304, seq_len=2048, device="meta")
    cluster = ClusterSpec.preset("hgx-h100-80g")
    train = TrainSpec(global_batch=64, seq_len=2048)
    config = ParallelConfig(dp=8, micro_batch=8, zero=1)
    enc = autopar.estimate(encoder, cluster, train, config)
    ref = autopar.estimate(gpt, cluster, train, config)
    assert 1.0 <= enc.step_time_s / ref.step_time_s <= 1.12
    assert 1.0 <= enc.peak_memory_bytes / ref.peak_memory_bytes <= 1.04
    assert enc.memory_breakdown["activations"] == pytest.approx(
        ref.memory_breakdown["activations"], rel=0.01)


# a torch.library op autopar cannot see into, reading a weight: once without a FLOP formula
# (refused), once with one (priced by it)
@torch.library.custom_op("autopar_test::opaque_scale", mutates_args=())
def _opaque_scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


@torch.library.custom_op("autopar_test::counted_scale", mutates_args=())
def _counted_scale(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * w


for _op in (_opaque_scale, _counted_scale):
    _op.register_fake(lambda x, w: torch.empty_like(x))

_COUNTED_FLOP = 12345


@register_flop_formula(torch.ops.autopar_test.counted_scale)
def _counted_scale_flop(x_shape: torch.Size, w_shape: torch.Size, out_shape: object = None,
                        **kwargs: object) -> int:
    return _COUNTED_FLOP


class _WithOp(nn.Module):
    def __init__(self, op: object) -> None:
        super().__init__()
        self.op = op
        self.emb, self.w, self.head = nn.Embedding(16, 8), nn.Parameter(torch.ones(8)), \
            nn.Linear(8, 16)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.op(self.emb(tokens), self.w)  # type: ignore[operator]
        return self.head(torch.roll(x, 1, dims=1))


def test_parameterised_op_torch_cannot_count_is_refused_naming_it() -> None:
    with pytest.raises(AutoparError, match=r"cannot price op 'opaque_scale' "
                       r"\(autopar_test\.opaque_scale\.default\): it reads parameters \(w\)"
                       r".*register_flop_formula"):
        trace(_WithOp(_opaque_scale), seq_len=4)


def test_op_torch_counts_is_priced_on_the_matmul_roofline_and_paramless_ops_by_bytes() -> None:
    graph = trace(_WithOp(_counted_scale), seq_len=4)
    by_op = {n.op: n for n in graph.nodes}
    assert by_op["counted_scale"].fwd_flop == _COUNTED_FLOP
    assert kind_of(by_op["counted_scale"]) is OpKind.MATMUL
    # roll: no family, no parameter, no count of torch's: memory-bound on its bytes
    assert not is_known("roll")
    assert by_op["roll"].fwd_flop == 0 and kind_of(by_op["roll"]) is OpKind.MEMORY
    assert by_op["roll"].fwd_bytes > 0


def test_an_aten_view_the_registry_does_not_name_is_a_view_not_an_opaque_op() -> None:
    # Falcon's attention reads its fused weight through `.T` (ATen numpy_T, which the registry
    # does not name): the rule refused it as a parameterised op of no FLOPs, but its schema
    # says its output aliases its input, so it is a view of the weight, folded into its reader
    pytest.importorskip("transformers")
    from autopar.verify.models import transformers_spec

    graph = trace(transformers_spec("falcon").build("meta"), seq_len=16)
    assert graph.method == "export" and not [n for n in graph.nodes if n.op == "numpy_T"]
