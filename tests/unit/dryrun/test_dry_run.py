"""The dry run: the emitted program of every rank role, one step on fake tensors, accounted.

The account is checked on real tensors where the bytes are known; the dry run on small plans
of the tiny models (every role runs, the kinds add up to the peak, the collectives are the
plan's), and from the command line.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import autopar
from autopar.cli.main import main
from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec
from autopar.core.specs import ParallelConfig, TrainSpec
from autopar.dryrun.memory_account import KINDS, MemoryAccount


def _plan(model: str, seq: int = 32, batch: int = 8, layers: int | None = None, **config):
    spec = ModelSpec.zoo(model)
    if layers is not None:
        spec = dataclasses.replace(spec, overrides={"num_layers": layers})
    config = ParallelConfig(**config)
    cluster = autopar.ClusterSpec.preset("hgx-h100-80g", nodes=max(1, config.world_size // 8))
    if config.world_size < 8:
        from autopar.costmodel.cluster import process_cluster

        cluster = process_cluster(config.world_size, "hgx-h100-80g")
    return autopar.plan_for(spec.build("meta"), cluster,
                            TrainSpec(global_batch=batch, seq_len=seq), config, model_spec=spec)


def test_the_account_counts_each_storage_once_until_it_is_freed() -> None:
    with MemoryAccount(lambda: ()) as account:
        a = torch.empty(1000)                      # 4000 bytes, made outside autograd
        view = a[10:]                              # same storage: not counted again
        b = torch.empty(250, dtype=torch.float64)  # 2000 bytes
        assert account.total == 6000
        del a, view
        assert account.total == 2000
        del b
    assert account.peak == 6000
    assert account.peak_breakdown["activations"] == 6000
    assert account.total == 0


def test_holders_take_precedence_at_the_peak() -> None:
    weight = torch.nn.Parameter(torch.zeros(100))

    def holders():
        yield "parameters", weight
        if weight.grad is not None:
            yield "gradients", weight.grad

    with MemoryAccount(holders) as account:
        account.track([weight], "parameters")
        weight.grad = torch.full((100,), 2.0)      # made outside autograd: "activations"...
        torch.empty(10)                            # ...until a new peak looks at the holders
    assert account.peak == 400 + 400 + 40
    assert account.peak_breakdown["parameters"] == 400
    assert account.peak_breakdown["gradients"] == 400
    assert account.peak_breakdown["activations"] == 40


def test_a_device_query_under_fake_tensors_makes_nothing() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), MemoryAccount(lambda: ()) as account:
        x = torch.empty(256)
        before = account.total
        # what the autograd engine and DTensor ask of a fake tensor, through the dispatcher
        assert torch.ops.prim.device.default(x) == torch.device("cpu")
        assert account.total == before == 1024


def test_every_role_of_a_pipelined_plan_runs_and_its_kinds_add_up() -> None:
    plan = _plan("tiny-llama", dp=2, tp=2, pp=2, zero=3, micro_batch=1,
                 sequence_parallel=True)
    seen: list[tuple[int, int]] = []
    run = autopar.dry_run(plan, progress=lambda done, total, what: seen.append((done, total)))
    assert [r.pp_rank for r in run.roles] == [0, 1]
    assert seen[-1] == (2, 2)
    for role in run.roles:
        assert role.peak_bytes > 0
        assert sum(role.peak_breakdown.values()) == pytest.approx(role.peak_bytes)
        assert set(role.peak_breakdown) == set(KINDS)
        assert role.peak_breakdown["parameters"] > 0 and role.peak_breakdown["optimizer"] > 0
        # the schedule's point-to-point traffic: one activation and one gradient per micro-batch
        # (in the micro-batches the role ran: autopar/dryrun/steady.py)
        assert role.step_microbatches == plan.config.microbatches(plan.train)
        assert role.collectives["send-recv"] == 2 * role.microbatches  # each send, each receive
        assert role.collectives["all-gather"] > 0 and role.collectives["reduce-scatter"] > 0
    assert run.roles[0].stages == (0,) and run.roles[1].stages == (1,)
    assert json.loads(json.dumps(run.to_dict()))["roles"][1]["pp_rank"] == 1


def test_a_stage_holds_the_receive_buffers_of_the_micro_batches_in_flight_only() -> None:
    # 1F1B on two stages keeps at most two micro-batches in flight on the first stage however
    # many the step has; torch's PipelineStage alone would keep a gradient receive buffer for
    # every micro-batch of the step (4 KiB each here: 32 tokens x 64 x bf16)
    peaks = {}
    for batch in (4, 16):
        plan = _plan("tiny-llama", batch=batch, pp=2, micro_batch=1, schedule="1f1b")
        peaks[batch] = autopar.dry_run(plan, pp_ranks=[0], workers=1,
                                       all_microbatches=True).roles[0].peak_bytes
    # what does grow: the schedule's split of the batch, 32 int64 token ids per micro-batch
    assert 0 <= peaks[16] - peaks[4] <= (16 - 4) * 32 * 8


def test_the_last_stage_holds_no_received_activation_of_a_finished_micro_batch() -> None:
    # the schedule keeps every micro-batch's loss until the step ends; attached, its graph held
    # the micro-batch's received activation (the input's AccumulateGrad) that long: 4 KiB
    # (32 tokens x 64 x bf16) per micro-batch on the last stage, which 1F1B keeps one of
    peaks = {}
    for batch in (4, 16):
        plan = _plan("tiny-llama", batch=batch, pp=2, micro_batch=1, schedule="1f1b")
        peaks[batch] = autopar.dry_run(plan, pp_ranks=[1], workers=1,
                                       all_microbatches=True).roles[0].peak_bytes
    # what does grow: the schedule's split of the targets, 32 int64 ids per micro-batch, and
    # the fp32 loss it keeps of each (48 KiB more without the detach)
    assert 0 <= peaks[16] - peaks[4] <= (16 - 4) * (32 * 8 + 4)


def test_a_plan_without_data_parallelism_issues_no_fsdp_collectives() -> None:
    plan = _plan("tiny-gpt", tp=2, micro_batch=2, batch=4)
    run = autopar.dry_run(plan)
    (role,) = run.roles
    assert "reduce-scatter" not in role.collectives and "send-recv" not in role.collectives
    assert role.collectives.get("all-reduce", 0) > 0   # tensor parallelism's row outputs


def _figures(roles) -> list[tuple]:
    return [(r.pp_rank, r.stages, r.blocks, r.peak_bytes, r.peak_breakdown, r.collectives)
            for r in roles]


def test_roles_run_side_by_side_give_the_figures_of_one_process() -> None:
    from autopar.dryrun.run import _RoleRuns
    from autopar.passes.mesh import executable_spec

    plan = _plan("tiny-llama", layers=4, dp=2, pp=4, micro_batch=1)
    alone = autopar.dry_run(plan, workers=1)
    # every role in a spawned process (two of them: one learns the shapes before its first
    # role), none here
    runs = _RoleRuns(plan, executable_spec(plan, None), [0, 1, 2, 3], None)
    runs.side_by_side(2, here=False)
    assert _figures(runs.roles()) == _figures(alone.roles)


def test_the_dry_run_refuses_no_workers() -> None:
    plan = _plan("tiny-llama", dp=2, pp=2, micro_batch=1)
    with pytest.raises(AutoparError, match="workers"):
        autopar.dry_run(plan, workers=0)


def test_the_dry_run_refuses_a_role_that_does_not_exist() -> None:
    plan = _plan("tiny-llama", dp=2, pp=2, micro_batch=1)
    with pytest.raises(AutoparError, match="pipeline ranks"):
        autopar.dry_run(plan, pp_ranks=[5])


def test_a_later_role_alone_learns_its_shapes_from_the_first_stage() -> None:
    plan = _plan("tiny-llama", dp=2, pp=2, micro_batch=1)
    (role,) = autopar.dry_run(plan, pp_ranks=[1]).roles
    assert role.pp_rank == 1 and role.peak_bytes > 0


def test_the_command_line_prints_a_table_per_role(tmp_path, capsys) -> None:
    plan = _plan("tiny-llama", dp=2, pp=2, micro_batch=1)
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    out_json = tmp_path / "dry.json"
    code = main(["dryrun", "--plan", str(path), "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0
    assert "memory per rank role" in out and "fits" in out
    assert len(json.loads(out_json.read_text())["roles"]) == 2


def test_the_command_line_refuses_a_missing_plan(tmp_path, capsys) -> None:
    assert main(["dryrun", "--plan", str(tmp_path / "nope.json")]) == 2
    assert "error" in capsys.readouterr().err


def test_the_fake_model_keeps_a_tied_head_one_parameter() -> None:
    # gpt-1.7b (2 layers, dp 8) dry-ran 0.87 GiB of parameters against 0.58 predicted: the
    # fake model's head had its own copy of the embedding table, which the real run keeps one
    from torch._subclasses.fake_tensor import FakeTensorMode

    import autopar
    from autopar.dryrun.run import _to_empty
    model = autopar.models.build("gpt", num_layers=1, hidden_size=16, num_heads=2,
                                 vocab_size=64, seq_len=8, device="meta")
    assert model.head.weight is model.tok_emb.weight
    with FakeTensorMode(allow_non_fake_inputs=True):
        _to_empty(model, "cpu")
    assert model.head.weight is model.tok_emb.weight and not model.head.weight.is_meta


def test_a_pipelined_model_with_a_tied_head_dry_runs_its_last_stage() -> None:
    # the first and last stages of a tied GPT share the embedding's gradient through a group
    # of their ranks, found from the mesh's layout: mesh.mesh holds no values under fake tensors
    plan = _plan("tiny-gpt", dp=2, pp=2, micro_batch=1)
    run = autopar.dry_run(plan)
    assert [r.pp_rank for r in run.roles] == [0, 1]
    assert all(role.peak_bytes > 0 for role in run.roles)
