"""The residual stream is recognised by the graph (``ops.stream.residual_stream``), not by a
tensor's width: an MLP as wide as the hidden size -- a dense Llama with intermediate_size =
hidden_size, a Qwen2-MoE shared expert with shared_expert_intermediate_size = hidden_size --
keeps its column -> row split under a forced tp (before, ``autopar.plan_for`` failed with
"gate_proj is split by columns without a row split after it")."""

from __future__ import annotations

import torch

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import process_cluster
from autopar.analysis.ops.stream import residual_stream
from autopar.models.training import ModelSpec
from autopar.analysis.workload import layer_nodes

_SHAPE = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
LLAMA_AS_WIDE = ModelSpec.transformers_config("LlamaForCausalLM", {
    **_SHAPE, "intermediate_size": 64})
QWEN2_MOE_AS_WIDE = ModelSpec.transformers_config("Qwen2MoeForCausalLM", {
    **_SHAPE, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    "intermediate_size": 128, "shared_expert_intermediate_size": 64})
TRAIN = TrainSpec(global_batch=2, seq_len=32, precision="fp32")


def _block(spec: ModelSpec):
    graph = autopar.trace(spec.build("meta"), TRAIN)
    return graph, [n for n in layer_nodes(graph)[1] if n.out is not None]


def _op_in(nodes, op: str, module: str) -> str:
    return next(n.name for n in nodes if n.op == op and n.module_path.endswith(module))


def test_an_mlp_as_wide_as_the_stream_is_not_the_stream() -> None:
    graph, nodes = _block(LLAMA_AS_WIDE)
    names = {n.name for n in nodes}
    layer_input = next(i for n in nodes for i in n.inputs
                       if i not in names and graph.node(i).out.dtype.is_floating_point)
    stream = residual_stream(graph, nodes, layer_input, nodes[-1].name)
    inner = _op_in(nodes, "mul", ".mlp")  # act_fn(gate_proj(x)) * up_proj(x), 64 wide
    assert graph.node(inner).out.shape[-1] == 64
    assert inner not in stream
    residual_adds = [n.name for n in nodes if n.op == "add" and n.module_path.endswith(".0")]
    assert len(residual_adds) == 2 and set(residual_adds) <= stream
    assert _op_in(nodes, "mul", "post_attention_layernorm") in stream


def _forced_tp2(spec: ModelSpec) -> dict[str, str]:
    config = ParallelConfig(tp=2, micro_batch=1)
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2), TRAIN, config,
                            name=spec.label)
    return dict(plan.module_strategies)


def test_forced_tp_splits_a_dense_mlp_as_wide_as_the_stream() -> None:
    torch.set_flush_denormal(True)
    styles = _forced_tp2(LLAMA_AS_WIDE)
    assert styles["model.layers.*.mlp.gate_proj"] == styles["model.layers.*.mlp.up_proj"] \
        == "column"
    assert styles["model.layers.*.mlp.down_proj"] == "row"


def test_forced_tp_splits_a_shared_expert_as_wide_as_the_stream() -> None:
    torch.set_flush_denormal(True)
    styles = _forced_tp2(QWEN2_MOE_AS_WIDE)
    expert = "model.layers.*.mlp.shared_expert"
    assert styles[f"{expert}.gate_proj"] == styles[f"{expert}.up_proj"] == "column"
    assert styles[f"{expert}.down_proj"] == "row"
