"""FP8 linears (``passes/float8.py``, ``autopar/core/fp8.py``): which layers, the FP8
all-gather's transport on gloo, and what the cost model makes of them."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.core.fp8 import fp8_gemm
from autopar.passes import float8
from autopar.passes.float8 import BytesAllGather, apply_float8, apply_fp8_transport

pytest.importorskip("torchao.float8", reason="fp8 runs on torchao's float8 training")
pytestmark = pytest.mark.filterwarnings("ignore:FSDP2-wrapped module")


def test_the_rule_keeps_routers_and_odd_shapes_in_bf16():
    assert fp8_gemm("mlp.up_proj", (512, 256))
    assert not fp8_gemm("mlp.router", (256, 512))  # the zoo's router
    assert not fp8_gemm("mlp.gate", (64, 512))  # transformers' MoE router
    assert fp8_gemm("mlp.gate_proj", (512, 256))  # a SwiGLU gate is no router
    assert not fp8_gemm("attn.q_proj", (520, 256))  # 520 is no multiple of 16
    assert not fp8_gemm("attn.q_proj", None)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(64)
        self.up = nn.Linear(64, 128, bias=False)
        self.down = nn.Linear(128, 64, bias=False)
        self.router = nn.Linear(64, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x)))) + self.router(x).sum(-1, True)


def test_only_the_chosen_linears_are_swapped_and_only_under_fp8():
    blocks = [Block(), Block()]
    assert apply_float8(blocks, TrainSpec(global_batch=1, precision="bf16"), fsdp=False) == []
    names = apply_float8(blocks, TrainSpec(global_batch=1, precision="fp8"), fsdp=False)
    assert names == ["up", "down", "up", "down"]
    assert type(blocks[0].router) is nn.Linear and type(blocks[0].up) is not nn.Linear


def test_float8_is_gathered_as_bytes_on_gloo(one_rank):
    """gloo has no float8 dtype: the default all-gather fails on an FP8 buffer, the bytes one
    moves it. (FSDP2 skips the collective on one rank, so this calls the comm itself; the
    ZeRO-3 case of ``tests/dist/test_fp8_parity.py`` runs it under FSDP on two.)"""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

    shard = torch.randn(8).to(torch.float8_e4m3fn)
    out = torch.empty(8, dtype=torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="scalar type"):
        DefaultAllGather()(output_tensor=out, input_tensor=shard, group=dist.group.WORLD)
    BytesAllGather()(output_tensor=out, input_tensor=shard, group=dist.group.WORLD)
    assert torch.equal(out.view(torch.uint8), shard.view(torch.uint8))


def test_tensorwise_sets_the_byte_transport_on_every_fsdp_module(one_rank):
    train = TrainSpec(global_batch=1, precision="fp8", fp8_recipe="tensorwise")
    block = Block()
    apply_float8([block], train, fsdp=True)
    fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    apply_fp8_transport(block.modules(), train)
    comm = block._get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm
    assert isinstance(comm, BytesAllGather)
    block(torch.randn(2, 8, 64)).float().sum().backward()
    assert block.up.weight.grad is not None


def test_rowwise_gathers_in_bf16(one_rank):
    train = TrainSpec(global_batch=1, precision="fp8", fp8_recipe="rowwise")
    block = Block()
    apply_float8([block], train, fsdp=True)
    fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    apply_fp8_transport(block.modules(), train)  # nothing to carry: no FP8 all-gather
    assert not any(getattr(m, "_get_fsdp_state", None) and
                   isinstance(m._get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm,
                              BytesAllGather) for m in block.modules())
    block(torch.randn(2, 8, 64)).float().sum().backward()


def test_a_missing_torchao_is_a_clear_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_torchao(name, *args, **kwargs):
        if name.startswith("torchao"):
            raise ImportError("No module named 'torchao'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torchao)
    with pytest.raises(autopar.AutoparError, match="pip install"):
        float8._torchao_float8()


def test_fp8_prices_the_gemms_faster_and_the_casts_as_each_engine_runs_them():
    """Llama 3 8B on 8 H100s: under torch.compile (``fp8_compiled_casts``, torchtitan's float8)
    the step is faster in fp8 (the FP8 peak is twice bf16's) but by less than twice
    (attention, norms and the casts stay bf16-priced); torchao's eager float8, which the engine
    runs, is slower than bf16 (measured on an H200: tests/data/gpu_steps.json); the FSDP
    all-gather of tensorwise moves fewer bytes than rowwise's."""
    model = autopar.models.from_config(autopar.models.make_config("llama3-8b"), device="meta")
    cluster = autopar.ClusterSpec.preset("hgx-h100-80g")
    config = ParallelConfig(dp=8, zero=3, micro_batch=1)

    def est(fusions=(), **train):
        return autopar.estimate(model, cluster, TrainSpec(global_batch=64, seq_len=4096, **train),
                                replace(config, fusions=fusions))

    bf16, eager = est(precision="bf16"), est(precision="fp8")
    compiled = est(("fp8_compiled_casts",), precision="fp8")
    rowwise = est(("fp8_compiled_casts",), precision="fp8", fp8_recipe="rowwise")
    assert 0.5 * bf16.time_breakdown["compute"] < compiled.time_breakdown["compute"]
    assert compiled.time_breakdown["compute"] < 0.85 * bf16.time_breakdown["compute"]
    assert compiled.step_time_s < bf16.step_time_s < eager.step_time_s
    assert compiled.time_breakdown["comm_dp"] <= rowwise.time_breakdown["comm_dp"]


def test_matmuls_policy_reruns_the_eager_fp8_casts_it_does_not_save():
    """The matmuls policy saves a linear's output, not its FP8 operands: under eager fp8 the
    recomputed forward casts the input and the weight again, so its recompute exceeds the same
    plan's in bf16 by those casts; under Transformer Engine's fused casts it does not."""
    model = autopar.models.from_config(autopar.models.make_config("llama3-8b"), device="meta")
    cluster = autopar.ClusterSpec.preset("hgx-h100-80g")
    config = ParallelConfig(dp=8, zero=3, micro_batch=1, checkpoint="matmuls")

    def recompute(fusions=(), precision="fp8"):
        return autopar.estimate(model, cluster, TrainSpec(global_batch=64, seq_len=4096,
                                                          precision=precision),
                                replace(config, fusions=fusions)).time_breakdown["recompute"]

    assert recompute(precision="bf16") * 1.5 < recompute()
    assert recompute(("fp8_fused_casts",)) == pytest.approx(recompute(precision="bf16"))


def test_precision_auto_searches_bf16_and_fp8_and_says_so():
    """``optimize(precisions=...)``: the faster precision's plan, the other's best among the
    runner-ups, and a GPU without FP8 tensor cores leaves fp8 out with the reason."""
    model = autopar.models.build("tiny-llama")
    train = TrainSpec(global_batch=8, seq_len=32)
    plan = autopar.optimize(model, "hgx-h100-80g", train, keep=3, precisions=("bf16", "fp8"))
    precisions = {plan.train.precision.value, *(a.train.precision.value
                                                for a in plan.alternatives)}
    assert precisions == {"bf16", "fp8"}
    assert any(n.startswith("precision searched: ") for n in plan.estimate.notes)
    a100 = autopar.optimize(model, "dgx-a100-80g", train, precisions=("bf16", "fp8"))
    assert a100.train.precision.value == "bf16"
    assert any("fp8: A100" in n and "no fp8 peak" in n for n in a100.estimate.notes)


def test_cli_precision_auto_and_lists(capsys):
    from autopar.cli.plan import precisions_of

    assert precisions_of("auto") == ("bf16", "fp8")
    assert precisions_of("bf16,fp8") == ("bf16", "fp8")
    with pytest.raises(autopar.AutoparError, match="fp7"):
        precisions_of("bf16,fp7")


def test_transformer_engine_fp8_weights_cost_their_transpose_or_a_copy_beside_bf16():
    """Transformer Engine keeps each FP8 linear's weight transposed in FP8 all step; with the
    weights FP8 themselves (``--fp8-param-gather``: tensorwise under the distributed optimizer)
    that is all, the same bytes as bf16's weight (1 + 1 against 2); without, an FP8 copy
    beside the bf16 weight (2 + 2): two bytes more per FP8 parameter, as under ZeRO-0, where
    Megatron gathers no parameters."""
    model = autopar.models.from_config(autopar.models.make_config("llama3-8b"), device="meta")
    cluster = autopar.ClusterSpec.preset("hgx-h100-80g")

    def params(zero, **train):
        config = ParallelConfig(dp=8, zero=zero, micro_batch=1, fusions=("fp8_fused_casts",))
        return autopar.estimate(model, cluster, TrainSpec(global_batch=64, seq_len=4096, **train),
                                config).memory_breakdown["params"]

    fp8 = sum(m.weight.numel() for name, m in model.named_modules()
              if type(m) is nn.Linear and name.startswith("layers.")
              and fp8_gemm(name, tuple(m.weight.shape)))
    assert 6.9e9 < fp8 < 7.0e9  # the blocks' seven linears, 218 M a block
    assert params(1, precision="fp8") == pytest.approx(params(1, precision="bf16"), rel=1e-3)
    assert params(1, precision="fp8", fp8_recipe="rowwise") == pytest.approx(
        params(1, precision="bf16") + 2.0 * fp8, rel=1e-3)
    assert params(0, precision="fp8") == pytest.approx(
        params(0, precision="fp8", fp8_recipe="rowwise"))
