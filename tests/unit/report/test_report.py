"""What a person reads in a plan's or an estimate's report: the title, per-block checkpoint
policies, ops without a strategy rule and what data parallelism runs under pipelining."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console
from torch import nn

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.report.execution import execution_lines
from autopar.report.text import estimate_tables
from autopar.costmodel.cluster import process_cluster

TRAIN = TrainSpec(global_batch=4, seq_len=32, precision="fp32")


def _plan(name: str, train: TrainSpec = TRAIN, model: nn.Module | None = None, **fields):
    config = ParallelConfig(**fields)
    model = model if model is not None else autopar.models.build(name, device="meta")
    return autopar.plan_for(model, process_cluster(config.world_size), train, config,
                            name=name)


def test_the_title_is_one_line_and_never_breaks_the_configuration_summary():
    plan = _plan("tiny-llama", dp=2, tp=2)
    title = (f"tiny-llama on {plan.cluster} ({plan.nodes} x {plan.gpus_per_node} GPUs): "
             f"{plan.summary()}")
    assert len(title) <= 110
    assert plan.report().splitlines()[0].strip() == title
    # narrower than the title: the sentence wraps, the summary keeps a line of its own
    lines = [line.strip() for line in plan.report(width=len(title) - 10).splitlines()]
    assert plan.summary() in lines
    # autopar estimate: the same title
    buf = io.StringIO()
    Console(file=buf, width=110, color_system=None).print(
        estimate_tables(plan.estimate, None, title="tiny-llama on 4 GPUs"))
    assert buf.getvalue().splitlines()[0].strip() == \
        f"tiny-llama on 4 GPUs: {plan.estimate.summary()}"


def test_per_block_checkpointing_is_shown_whole_in_the_same_words_everywhere():
    model = autopar.models.build("tiny-llama", device="meta", num_layers=8)
    policies = ("full",) * 2 + ("selective",) * 5 + ("full",)
    plan = _plan("tiny-llama-8", model=model, dp=2, checkpoint=policies)
    words = "full: blocks 0-1, 7 (3); selective: blocks 2-6 (5)"
    report = plan.report()
    assert "…" not in report
    config_row = next(line for line in report.splitlines() if line.strip().startswith("checkp"))
    assert words in config_row
    assert f"ckpt:({words})" in plan.summary()
    runs = dict(execution_lines(plan.config, plan.train, 8))
    assert runs["checkpointing"].startswith(words)
    from autopar.core.estimate import checkpoint_text  # the one wording of all three

    assert checkpoint_text(plan.config.checkpoint) == words
    assert checkpoint_text(("none",) * 8) == "none"


class _Erf(nn.Module):
    """A block with an op the strategy registry has no rule for (erf)."""

    def __init__(self, h: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.special.erf(self.fc(x))


def _odd_model() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Embedding(256, 64), _Erf(), _Erf(), nn.Linear(64, 256))


def test_ops_without_a_rule_are_listed_once_as_the_strategy_registry_says():
    # MoE routing (repeat, scatter, ...) has rules: nothing is listed, in the plan or the estimate
    moe = _plan("tiny-moe", dp=2)
    assert moe.ops_without_rules == ()
    assert not any("without" in n for n in moe.estimate.notes)
    assert "without" not in moe.report().lower()
    odd_model = _odd_model()
    odd = _plan("odd", model=odd_model, dp=2)
    assert odd.ops_without_rules == ("special_erf",)
    report = odd.report()
    assert report.count("special_erf") == 1 and report.lower().count("without") == 1
    # the estimate alone (autopar estimate) names the same op, from the same owner
    est = autopar.estimate(odd_model, process_cluster(2), TRAIN, ParallelConfig(dp=2))
    assert [n for n in est.notes if "without" in n] == \
        ["ops without a sharding rule, costed as replicated: special_erf"]


def test_zero_under_pipelining_says_once_what_the_schedule_does():
    for zero in (2, 3):
        plan = _plan("tiny-llama", dp=2, pp=2, zero=zero, micro_batch=1)
        runs = dict(execution_lines(plan.config, plan.train, 2))
        dp, pipe = runs["data parallel"], runs["pipeline"]
        assert "reduce-scattered once per step, after" in dp
        assert "every micro-batch" not in dp
        assert "gradient" not in pipe
    assert "freed after every forward" in dp and "a backward keeps them" in dp
    # without pipelining ZeRO-3 does reduce-scatter every micro-batch
    flat = dict(execution_lines(ParallelConfig(dp=2, zero=3), TRAIN, 2))["data parallel"]
    assert "reduce-scattered every micro-batch" in flat


@pytest.mark.parametrize(("precision", "total"), [("bf16", 18), ("fp16", 18), ("fp32", 16),
                                                  ("bf16-pure", 8)])
def test_the_report_says_which_model_states_it_prices(precision: str, total: int) -> None:
    """The memory model prices the engine's states (fp32 gradients under mixed precision, as
    Megatron-LM's main gradient: 18 B per parameter with Adam, not ZeRO's 16)."""
    train = autopar.TrainSpec(global_batch=8, seq_len=128, precision=precision)
    rows = dict(execution_lines(autopar.ParallelConfig(dp=8), train, 4))
    assert f"= {total} B per parameter" in rows["model states"]


def test_an_interleaved_plan_of_one_chunk_says_what_it_runs():
    """Interleaved with one chunk per rank is no 1F1B: the summary shows the chunk count, and
    the report says what differs (the warm-up's micro-batches in flight)."""
    one = _plan("tiny-llama", dp=1, pp=2, micro_batch=1, schedule="interleaved",
                virtual_stages=1)
    assert "interleaved(v1)" in one.summary()
    text = " ".join(one.report(width=400).split())
    assert "one model chunk per rank" in text and "1F1B keeps pp-r" in text
    two = _plan("tiny-llama", dp=1, pp=2, micro_batch=1, schedule="interleaved",
                virtual_stages=2)
    assert "interleaved(v2)" in two.summary() and "one model chunk" not in two.report()
