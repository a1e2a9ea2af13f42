"""The op registry (``autopar.analysis.ops``) is the one place op knowledge lives: every op the tracer
emits is in it, "ops without a rule" has one answer, and a family registered later is known to
the tracer, the cost tables, the strategy solve and the plan alike."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import autopar
from autopar import ClusterSpec, ParallelConfig, TrainSpec
from autopar.core.layout import Layout
from autopar.analysis.graph import TensorMeta
from autopar.analysis.ops import (CANONICAL_OPS, FAMILIES, OP_NAMES, PATTERNS, VIEW, FusionPattern,
                         OpFamily, family_of, find_fusions, has_rule, is_known, kind_of,
                         ops_without_rules, register, strategies_for, unregister)
from autopar.analysis.ops.elementwise import elementwise_rule
from autopar.analysis.ops.registry import saves_nothing
from autopar.analysis.ops.naming import canonical_op, unmapped_ops
from autopar.analysis.workload import saved_tensors

CLUSTER = ClusterSpec.preset("dgx-a100-80g", nodes=1)
TRAIN = TrainSpec(global_batch=16, seq_len=64)
ZOO = ["tiny-gpt", "tiny-llama", "tiny-moe"]


def test_every_op_the_table_maps_to_is_a_family_op() -> None:
    assert set(OP_NAMES.values()) == CANONICAL_OPS
    owners = [op for fam in FAMILIES.values() for op in fam.ops]
    assert len(owners) == len(set(owners)), "an op belongs to two families"
    assert all(family_of(op).name == fam.name for fam in FAMILIES.values() for op in fam.ops)
    # what canonical_op returns by itself, beyond the table
    f32 = TensorMeta((2, 3), torch.float32)
    assert canonical_op("getitem", [f32, f32], [f32], tensor_index=True) == "index"
    assert canonical_op("to", [f32], [f32]) == VIEW
    assert canonical_op("size", [f32], []) == VIEW
    assert {"index", VIEW} <= CANONICAL_OPS
    for pattern in PATTERNS.values():
        assert all(is_known(op) for op in pattern.ops + pattern.side_ops), pattern.name


@pytest.mark.parametrize("name", ZOO)
def test_every_op_the_tracer_emits_for_the_zoo_is_in_the_registry(name: str) -> None:
    model = autopar.models.build(name, device="meta")
    graph = autopar.trace(model, TrainSpec(global_batch=2, seq_len=model.config.seq_len))
    assert unmapped_ops(graph) == []
    assert all(is_known(n.op) for n in graph.nodes)


class _Erf(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.special.erf(self.fc1(x)))


class _ErfModel(nn.Module):
    """A block with an op the built-in registry does not know (``special_erf``)."""

    def __init__(self, h: int = 64, vocab: int = 128) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList([_Erf(h) for _ in range(2)])
        self.head = nn.Linear(h, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _erf_model() -> nn.Module:
    with torch.device("meta"):
        return _ErfModel()


@pytest.fixture(autouse=True)
def erf_model_family():
    """A model family for ``_ErfModel`` (its layout, tensor parallelism allowed: no attention
    heads to keep whole), as a user registers one: the generic description refuses tp for a
    model it cannot prove safe, and these tests plan tp = 2 to see the op rules at work."""
    from autopar.models.family import Family, register as register_family, \
        unregister as unregister_family
    from autopar.models.parts import ModelParts

    parts = ModelParts(blocks="layers", first=("emb",), last=("head",), head="head",
                       embedding="emb", embed=lambda root, tokens: root.emb(tokens),
                       finish=lambda root, x: root.head(x))
    register_family(Family(name="test-erf", parts=parts, model_class=_ErfModel))
    yield
    unregister_family("test-erf")


def test_an_op_without_a_rule_runs_replicated_and_is_reported() -> None:
    plan = autopar.optimize(_erf_model(), CLUSTER, TRAIN, constraints={"tp": 2})
    assert "special_erf" in plan.ops_without_rules
    strategies = dict(plan.block_strategies)
    erf = next(k for k in strategies if "erf" in k)
    assert strategies[erf] == "replicated"
    assert "erf" in plan.report()


def test_ops_without_a_rule_have_one_answer() -> None:
    model = _erf_model()
    graph = autopar.trace(model, TRAIN)
    assert not is_known("special_erf") and not has_rule("special_erf")
    assert ops_without_rules(graph.nodes) == ("special_erf",)
    assert unmapped_ops(graph) == ["special_erf"]
    erf = next(n for n in graph.nodes if n.op == "special_erf")
    strategies = strategies_for(erf, graph, sequence_parallel=False, tp=2)
    assert [s.output for s in strategies] == [Layout.R]
    # the cost model's note (tp = 1, the base workload) and the plan's list (tp = 2, solved)
    est = autopar.estimate(model, CLUSTER, TRAIN, ParallelConfig(dp=8))
    assert "ops without a sharding rule, costed as replicated: special_erf" in est.notes
    plan = autopar.optimize(model, CLUSTER, TRAIN, {"tp": 2})
    assert plan.ops_without_rules == ("special_erf",)
    assert "ops without a sharding rule, costed as replicated: special_erf" in plan.estimate.notes
    # an op the registry knows but has no rule for (no built-in family is one since pad, glu
    # and the convolutions run whole by rule, ``rules.whole``)
    assert has_rule("pad")
    family = register(OpFamily("test_ruleless", ops=("ruleless",), saves=saves_nothing,
                               rule=None))
    try:
        assert is_known("ruleless") and not has_rule("ruleless")
    finally:
        unregister(family.name)


@pytest.fixture
def erf_family():
    """``erf`` as a family of its own: the raw ``special_erf`` maps to it, 3 FLOPs an element,
    keeps its input, elementwise strategies, and a fusion with the linear before it."""
    def keeps_input(node, saver) -> None:
        saver.keep(node.inputs[0])

    family = register(OpFamily(
        "test_erf", ops=("erf",), aliases={"special_erf": "erf"},
        flop_per_element={"erf": 3}, saves=keeps_input, rule=elementwise_rule,
        fusions=(FusionPattern("test_linear_erf", ("linear", "erf")),)))
    yield family
    unregister(family.name)
    assert not is_known("erf") and "special_erf" not in OP_NAMES


def test_a_family_registered_later_is_known_everywhere(erf_family: OpFamily) -> None:
    model = _erf_model()
    graph = autopar.trace(model, TRAIN)  # the tracer maps the raw name through the registry
    erf = next(n for n in graph.nodes if n.block == 0 and n.op == "erf")
    assert erf.fwd_flop == 3 * erf.out.numel
    assert kind_of(erf).value == "memory" and unmapped_ops(graph) == []
    assert ops_without_rules(graph.nodes) == ()
    strategies = strategies_for(erf, graph, sequence_parallel=False, tp=2)
    assert has_rule("erf") and {s.output for s in strategies} == {Layout.R, Layout.S}
    # the cost tables keep what the family says: the erf's input (fc1's output), once
    block = graph.block_nodes(0)
    saved = {t.name for t in saved_tensors(graph, block)}
    assert erf.inputs[0] in saved
    fused = find_fusions(graph, block, ("test_linear_erf",))
    assert [[n.op for n in chain] for _, chain in fused] == [["linear", "erf"]]
    # the plan: the solve knows the op, the report lists nothing, the fusion is priced
    plan = autopar.optimize(model, CLUSTER, TRAIN, {"tp": 2, "fusions": ["test_linear_erf"]})
    assert plan.ops_without_rules == ()
    assert dict(plan.block_strategies)[erf.name] in ("replicated", "width")
    est = autopar.estimate(model, CLUSTER, TRAIN, plan.config)
    assert est.step_time_s == plan.estimate.step_time_s
    assert not any("sharding rule" in note for note in est.notes)


def test_the_fusion_names_are_one_vocabulary() -> None:
    """The op patterns price exactly the kernels' fusions and Megatron's priced ones, the
    kernels are the kernel fusions, and every reader refuses an unknown name in one way."""
    import pytest

    from autopar.analysis.ops import PATTERNS
    from autopar.core.errors import AutoparError
    from autopar.core.specs import KERNEL_FUSIONS, PRICED_FUSIONS, ParallelConfig
    from autopar.kernels import KERNELS
    from autopar.passes.fuse import check_fusions

    assert set(PATTERNS) == set(KERNEL_FUSIONS + PRICED_FUSIONS)
    assert KERNELS == KERNEL_FUSIONS
    messages = set()
    for refuse in (lambda: ParallelConfig(fusions=("flash",)), lambda: check_fusions(("flash",))):
        with pytest.raises(AutoparError, match="unknown fusion 'flash'") as err:
            refuse()
        messages.add((err.value.what, err.value.fix))
    assert len(messages) == 1
    with pytest.raises(AutoparError, match="priced by the cost model but has no kernel"):
        check_fusions(PRICED_FUSIONS[:1])
