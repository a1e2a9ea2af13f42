"""Token models that are not transformers plan with their mixing priced: a causal gated CNN
(``nn.Conv1d`` + ``F.glu`` + a causal ``F.pad``, the registry's ``convolution``, ``glu`` and
``pad``) and an MLP-mixer whose token mixing is an ``einsum`` by an (seq, seq) parameter -- the
newcomer models of ``autopar/verify/decoders.py``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import autopar
from autopar import ClusterSpec, ParallelConfig, TrainSpec
from autopar.verify import decoders as verify_decoders
from autopar.core.roofline import OpKind
from autopar.analysis.graph import TensorMeta
from autopar.analysis.ops import forward_flop, kind_of, ops_without_rules
from autopar.analysis.ops.naming import canonical_op
from autopar.analysis.tracing import trace

D = verify_decoders
"""The newcomer models of ``autopar/verify/decoders.py``: ``ConvLM`` (3 gated ``Conv1d`` blocks)
and ``Mixer``, both ``WIDTH`` wide over a vocabulary of ``VOCAB``."""
KERNEL = D.ConvBlock().kernel
"""``verify_decoders.ConvBlock``'s kernel (4)."""


class _ConvLMByExport(D.ConvLM):
    """``ConvLM``, branching on the input's length (torch.fx cannot trace a Python branch on a
    traced size, so the tracer falls back to torch.export and sees ATen's ``conv1d``, ``glu``,
    ``pad``)."""

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if tokens.shape[1] == 0:
            raise ValueError("empty sequence")
        return super().forward(tokens, targets)


def _torch_count(fn: object, *args: object) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*args)  # type: ignore[operator]
    return counter.get_total_flops()


def _meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(tuple(t.shape), t.dtype)


@pytest.mark.parametrize("raw, fn, x, w, scalars", [
    ("Conv1d", F.conv1d, (2, 8, 16), (6, 8, 3), ()),
    ("conv2d", lambda x, w: F.conv2d(x, w, stride=2, groups=2), (2, 8, 9, 9), (6, 4, 3, 3), ()),
    ("conv_transpose1d", F.conv_transpose1d, (2, 8, 16), (8, 6, 3), ()),
    ("convolution", lambda x, w: torch.ops.aten.convolution(x, w, None, [1], [0], [1], True,
                                                             [0], 1),
     (2, 8, 16), (8, 6, 3), (1, 0, 1, True, 0, 1)),
])
def test_convolution_flops_are_torchs_count_in_every_spelling(
        raw: str, fn: object, x: tuple[int, ...], w: tuple[int, ...], scalars: tuple) -> None:
    xt, wt = torch.randn(x), torch.randn(w)
    out = fn(xt, wt)  # type: ignore[operator]
    ins, outs = [_meta(xt), _meta(wt)], [_meta(out)]
    op = canonical_op(raw, ins, outs)
    assert op == "convolution"
    assert forward_flop(op, raw, ins, outs, scalars) == _torch_count(fn, xt, wt) > 0


@pytest.mark.parametrize("model_cls", [D.ConvLM, _ConvLMByExport])
def test_causal_cnn_traces_its_convolutions_glu_and_pad_with_rules(model_cls: type) -> None:
    b, s, d = 2, 16, D.WIDTH
    graph = trace(model_cls(), batch=b, seq_len=s)
    assert graph.method == ("fx" if model_cls is D.ConvLM else "export")
    assert ops_without_rules(graph.nodes) == ()
    block = {n.op: n for n in graph.nodes if n.block == 0}
    assert {"convolution", "glu", "pad"} <= set(block)
    conv = block["convolution"]
    # 2 x batch x output positions x kernel x out channels x in channels
    assert conv.fwd_flop == 2 * b * s * KERNEL * (2 * d) * d
    assert kind_of(conv) is OpKind.MATMUL and len(conv.params) == 2
    assert block["glu"].fwd_flop == 4 * b * s * d


def test_causal_cnn_plan_prices_the_convolutions_forward_and_backward() -> None:
    """The model FLOPs of a step are 3 x the forward's GEMM-class FLOPs (forward, input
    gradient, weight gradient): every block's convolution and the head, per token."""
    s = 32
    with torch.device("meta"):
        model = D.ConvLM()
    train = TrainSpec(global_batch=64, seq_len=s)
    est = autopar.estimate(model, ClusterSpec.preset("hgx-h100-80g"), train,
                           ParallelConfig(dp=8, micro_batch=8))
    d = D.WIDTH
    per_token = len(model.blocks) * 2 * KERNEL * (2 * d) * d + 2 * d * D.VOCAB
    assert est.model_flops_per_step == pytest.approx(3 * per_token * 64 * s, rel=1e-9)
    assert not any("without a sharding rule" in note for note in est.notes)


def test_mlp_mixer_token_einsum_is_priced_as_a_gemm() -> None:
    b, s, d = 2, 16, D.WIDTH
    graph = trace(D.Mixer(), batch=b, seq_len=s)
    mix = [n for n in graph.nodes if n.op == "einsum" and n.block == 0]
    assert len(mix) == 1
    assert mix[0].fwd_flop == 2 * b * s * s * d and kind_of(mix[0]) is OpKind.MATMUL
    assert ops_without_rules(graph.nodes) == ()
    plan = autopar.optimize(D.Mixer().to("meta"), "hgx-h100-80g",
                            TrainSpec(global_batch=16, seq_len=s), keep=1)
    assert plan.estimate.step_time_s > 0 and plan.config.world_size == 8
