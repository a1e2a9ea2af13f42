"""The tensor-parallel program communicates what the plan priced.

One process with torch's ``fake`` process-group backend (collectives return without moving
data) stands in for every rank of the tp group: ``CommDebugMode`` counts the collectives of a
forward and backward of the parallelized model, which must equal the tp collectives of the
plan's solved workload (pre-block layer + blocks x count + post layer), kind by kind; GPT's
tied embedding and head included. Under context parallelism the cp collectives the plan prices
(``costmodel.step.cp_collectives``: one K/V all-gather per attention forward, one dK/dV
reduce-scatter per backward) are counted beside the tp ones. The expert-parallel program's
all-to-alls likewise equal ``costmodel.step.ep_alltoalls`` per MoE layer, forward and backward.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

import autopar
from autopar.analysis.admissibility import facts_of
from autopar import ParallelConfig, TrainSpec
from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY
from autopar.costmodel.step import cp_collectives
from autopar.search.planner import strategies_of
from autopar.models.training import ModelSpec
from autopar.costmodel.cluster import process_cluster

KIND = {"c10d_functional.all_reduce": "all-reduce",  # CommDebugMode's names, and the ops'
        # (_c10d_functional.<name>.default) without the underscore and the overload
        "c10d_functional.all_gather_into_tensor": "all-gather",
        "c10d_functional.reduce_scatter_tensor": "reduce-scatter"}


@pytest.fixture
def fake_world(request):
    world = getattr(request, "param", 2)
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    yield
    dist.destroy_process_group()


def _predicted(spec: ModelSpec, train: TrainSpec, config: ParallelConfig) -> Counter:
    model = spec.build("meta")
    graph = autopar.trace(model, train)
    strategies = strategies_of(graph, facts_of(model), spec.label, process_cluster(config.world_size),
                               train, efficiency=DEFAULT_EFFICIENCY, split_weights=True)
    work = strategies(config)
    counts: Counter = Counter()
    for layer, times in ((work.pre, 1), (work.block, work.num_blocks), (work.post, 1)):
        for c in layer.tp_collectives:
            counts[c.kind] += times
        if config.cp > 1:
            for kind, _, _ in cp_collectives(layer):
                counts[kind] += times
    return counts


def _counted(plan, spec: ModelSpec) -> Counter:
    """The functional collectives of a forward and backward, by kind (``_Collectives``, not
    ``CommDebugMode``: its module tracker loses its place in transformers 5.25's Llama --
    ``IndexError`` in ``_CommModeModuleTracker._fw_set_module_hook`` -- and the counts here need
    no module)."""
    program = autopar.parallelize(spec.build("cpu"), plan, autopar.device_mesh(plan))
    tokens = torch.randint(256, (2, plan.train.seq_len // plan.config.cp))
    with _Collectives() as comm:
        loss = program.loss(program.modules[0](tokens), tokens)
        loss.backward()
    return comm.counts


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt", "hf-llama"])
def test_tp_collectives_match_the_plan(fake_world, sp, model):
    from autopar.models.hf_llama import HF_LLAMA_TINY

    spec = (ModelSpec.transformers_config("LlamaForCausalLM", HF_LLAMA_TINY)
            if model == "hf-llama" else ModelSpec(model))
    train = TrainSpec(global_batch=2, seq_len=32, precision="fp32")
    config = ParallelConfig(tp=2, sequence_parallel=sp, micro_batch=2)
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2), train, config)
    assert _counted(plan, spec) == _predicted(spec, train, config)


@pytest.mark.parametrize(("fake_world", "fields"), [
    (2, dict(cp=2)), (4, dict(cp=2, tp=2, sequence_parallel=True))],
    ids=["cp2", "cp2xtp2-sp"], indirect=["fake_world"])
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gpt"])
def test_cp_collectives_match_the_plan(fake_world, fields, model):
    # this rank's chunks of the sequence (the program's step cuts them; here any tokens do)
    spec = ModelSpec(model)
    train = TrainSpec(global_batch=2, seq_len=32, precision="fp32")
    config = ParallelConfig(micro_batch=2, **fields)
    plan = autopar.plan_for(spec.build("meta"), process_cluster(config.world_size), train,
                            config)
    predicted = _predicted(spec, train, config)
    assert predicted["all-gather"] >= 2  # one K/V gather per attention, two blocks
    counted = _counted(plan, spec)
    # cp > 1 puts the cp ranks under FSDP (ZeRO-0 here): the gradients' all-reduces over
    # dp x cp (and, under SP, the norms' gradient all-reduce over tp that FSDP's reduction
    # asks of their Partial DTensors) are the data-parallel term's, not counted here
    for kind in ("all-gather", "reduce-scatter"):
        assert counted[kind] == predicted[kind], kind


A2A = "c10d_functional.all_to_all_single"


def _moe_block_and_blocks(spec: ModelSpec, train: TrainSpec, config: ParallelConfig):
    model = spec.build("meta")
    strategies = strategies_of(autopar.trace(model, train), facts_of(model), spec.label,
                               process_cluster(config.world_size), train,
                               efficiency=DEFAULT_EFFICIENCY)
    work = strategies(config)
    return work.block, work.num_blocks


@pytest.mark.parametrize("checkpoint", ["none", "full", "moe"])
def test_ep_all_to_alls_match_the_plan(fake_world, checkpoint):
    """dp 2 x ep 2 (capacity dispatch, static shapes: the fake backend moves no data, which a
    dropless layer's count exchange needs): forward and backward all-to-alls per step equal
    the cost model's ``ep_alltoalls`` per MoE layer times the blocks (``full`` and ``moe``
    recompute the MoE layers, their dispatch and combine again)."""
    from autopar.core.specs import Checkpoint
    from autopar.costmodel.moe import ep_alltoalls

    spec = ModelSpec("tiny-moe")
    train = TrainSpec(global_batch=2, seq_len=32, precision="fp32")
    config = ParallelConfig(dp=2, ep=2, zero=1, checkpoint=checkpoint)
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2), train, config)
    program = autopar.parallelize(spec.build("cpu"), plan, autopar.device_mesh(plan))
    tokens = torch.randint(256, (1, 32))
    with CommDebugMode() as forward:
        loss = program.loss(program.modules[0](tokens), tokens)
    forward_a2a = forward.get_comm_counts().get(_op(forward, A2A), 0)
    # one mode over forward and backward: a mode entered for the backward alone loses track
    # of the modules a checkpointed block recomputes (CommDebugMode's module tracker, 2.13)
    with CommDebugMode() as step:
        loss = program.loss(program.modules[0](tokens), tokens)
        loss.backward()
    backward_a2a = step.get_comm_counts().get(_op(step, A2A), 0) - forward_a2a
    block, blocks = _moe_block_and_blocks(spec, train, config)
    fwd, bwd = ep_alltoalls(block, Checkpoint(checkpoint))
    assert fwd == 2 and bwd == (2 if checkpoint == "none" else 4)
    assert (forward_a2a, backward_a2a) == (fwd * blocks, bwd * blocks)


def _op(mode: CommDebugMode, name: str):
    """The counted op called ``name`` (the counts are keyed by op overload packets)."""
    return next((op for op in mode.get_comm_counts() if str(op) == name), name)


class _Collectives(TorchDispatchMode):
    """Counts the functional collectives dispatched while active, by kind. (CommDebugMode
    does not count the all-gathers a saved-tensor unpack hook issues in the backward.)"""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func).removeprefix("_").removesuffix(".default")
        if name in KIND:
            self.counts[KIND[name]] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("model, policy", [("tiny-gpt-eager", "selective"),
                                           ("tiny-llama", "selective"), ("tiny-moe", "moe")])
def test_regathering_policies_gather_the_kept_shards_again_in_the_backward(fake_world, model,
                                                                            policy):
    """tp 2 + SP, ``selective`` and ``moe`` (``Checkpoint.regathers``): the column-parallel
    linears' inputs are kept as sequence shards and gathered again in the backward
    (``passes/regather.py``): one all-gather more in the backward per forward all-gather of a
    block, as ``costmodel.step.tp_comm_s`` prices; nothing else changes (the recomputed
    attention core, and the MoE layer whose tokens stay sequence shards, issue no tp
    collective)."""
    from autopar.costmodel.workload import Phase

    spec = (ModelSpec("tiny-gpt", {"attention": "eager"}) if model == "tiny-gpt-eager"
            else ModelSpec(model))
    train = TrainSpec(global_batch=2, seq_len=32, precision="fp32")
    backward = {}
    for name in ("none", policy):
        config = ParallelConfig(tp=2, sequence_parallel=True, micro_batch=2, checkpoint=name)
        plan = autopar.plan_for(spec.build("meta"), process_cluster(2), train, config)
        program = autopar.parallelize(spec.build("cpu"), plan, autopar.device_mesh(plan))
        tokens = torch.randint(256, (2, 32))
        loss = program.loss(program.modules[0](tokens), tokens)
        with _Collectives() as mode:
            loss.backward()
        backward[name] = mode.counts
    built = spec.build("meta")
    work = strategies_of(autopar.trace(built, train), facts_of(built), spec.label,
                         process_cluster(2), train, efficiency=DEFAULT_EFFICIENCY,
                         split_weights=True)(config)
    again = work.num_blocks * sum(1 for c in work.block.tp_collectives
                                  if c.phase is Phase.FORWARD and c.kind == "all-gather")
    # the attention's and the MLP's inputs; a MoE block's attention's
    assert again == (1 if policy == "moe" else 2) * work.num_blocks
    assert backward[policy]["all-gather"] == backward["none"]["all-gather"] + again
    assert backward[policy]["reduce-scatter"] == backward["none"]["reduce-scatter"]


@pytest.mark.parametrize("checkpoint", ["none", "full", "selective"])
def test_zero3_gathers_each_unit_twice_whatever_the_recomputation(fake_world, checkpoint):
    """dp 2, ZeRO-3 (FSDP2 on every block and on the stage): each unit's weights are
    all-gathered before its forward and before its backward, and its gradients
    reduce-scattered once; a checkpointed block recomputes on the weights its backward
    gathered, so recomputation adds no gather (``costmodel.dp_comm.FSDP_GATHERS``, which the
    cost model prices per unit and micro-batch)."""
    from autopar.costmodel.dp_comm import FSDP_GATHERS

    spec = ModelSpec("tiny-llama", {"num_layers": 3})
    train = TrainSpec(global_batch=2, seq_len=32, precision="fp32")
    config = ParallelConfig(dp=2, zero=3, checkpoint=checkpoint)
    plan = autopar.plan_for(spec.build("meta"), process_cluster(2), train, config)
    program = autopar.parallelize(spec.build("cpu"), plan, autopar.device_mesh(plan))
    tokens = torch.randint(256, (1, 32))
    with CommDebugMode() as step:
        loss = program.loss(program.modules[0](tokens), tokens)
        loss.backward()
    counts = {str(op): n for op, n in step.get_comm_counts().items()}
    units = 3 + 1  # the blocks and the stage's own parameters (embedding, final norm, head)
    assert counts.get("c10d._allgather_base_") == FSDP_GATHERS * units
    assert counts.get("c10d._reduce_scatter_base_") == units
