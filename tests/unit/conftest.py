from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_RUNS = REPO / "tests" / "data" / "published_runs.json"


@pytest.fixture(scope="session")
def published_runs_path() -> Path:
    if not SHARED_RUNS.exists():
        pytest.fail(f"{SHARED_RUNS} is missing: the published runs live in tests/data/")
    return SHARED_RUNS


GPT_BLOCK = dict(seq_len=256, hidden=64, heads=4, batch=2)
"""The GPT block ``solved_gpt_block`` traces (fp16, eager attention, dropout 0.1)."""


@pytest.fixture(scope="session")
def solved_gpt_block():
    """``of(t, sp)``: the block of a 2-layer GPT (``GPT_BLOCK``) the strategy solve prices at
    tp ``t`` with or without sequence parallelism, every linear layer split (``split_weights``:
    Megatron's column->row pairs); at t = 1 the base workload's, its backward walked whole."""
    import autopar
    from autopar.analysis.admissibility import facts_of
    from autopar.costmodel.efficiency import DEFAULT_EFFICIENCY
    from autopar.search.planner import strategies_of

    s, h, a, b = (GPT_BLOCK[k] for k in ("seq_len", "hidden", "heads", "batch"))
    model = autopar.models.build("gpt", num_layers=2, hidden_size=h, num_heads=a, vocab_size=128,
                                 seq_len=s, attention="eager", dropout=0.1, device="meta")
    graph = autopar.trace(model, autopar.TrainSpec(global_batch=b, seq_len=s, precision="fp16"))
    cluster = autopar.ClusterSpec.preset("dgx-a100-80g", nodes=1)
    train = autopar.TrainSpec(global_batch=64, seq_len=s, precision="fp16")  # for the solve
    strategies = strategies_of(graph, facts_of(model), "gpt", cluster, train,
                               efficiency=DEFAULT_EFFICIENCY, split_weights=True)

    def of(t: int, sp: bool = False):
        config = autopar.ParallelConfig(dp=8 // t, tp=t, micro_batch=1, sequence_parallel=sp)
        return strategies(config).block
    return of
