"""The on-disk cache of traced graphs (``autopar/analysis/trace_cache.py``): a second trace of
the same model is read back equal, any change to what the trace reads is a new entry, a broken
entry is traced again, and ``cache=False`` / ``--no-cache`` touch nothing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import autopar
from autopar import TrainSpec
from autopar.analysis import trace_cache
from autopar.analysis.trace_cache import cache_key, traced
from autopar.cli.main import main
from autopar.core.model_spec import ModelSpec

TRAIN = TrainSpec(global_batch=8, seq_len=32)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(trace_cache.CACHE_ENV, str(tmp_path))
    calls = []
    real = trace_cache.trace

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(trace_cache, "trace", counting)
    return tmp_path / "traces", calls


def test_a_second_trace_is_read_back_equal(cache):
    folder, calls = cache
    model = autopar.models.build("tiny-llama", device="meta")
    first = traced(model, TRAIN)
    second = traced(autopar.models.build("tiny-llama", device="meta"), TRAIN)
    assert len(calls) == 1 and len(list(folder.glob("*.pkl"))) == 1
    assert second.nodes == first.nodes and second.params == first.params
    assert second.blocks == first.blocks and second.seq_len == first.seq_len == 32
    assert second.gm is None  # the GraphModule is not stored
    # the search gives the same plan from either
    cluster = autopar.ClusterSpec.preset("hgx-h100-80g", nodes=1)
    assert (autopar.optimize(second, cluster, TRAIN).to_dict()["config"]
            == autopar.optimize(first, cluster, TRAIN).to_dict()["config"])


def test_what_the_trace_reads_makes_a_new_entry(cache):
    base = autopar.models.build("tiny-llama", device="meta")
    key = cache_key(base, 1, 32)
    assert cache_key(autopar.models.build("tiny-llama", device="meta"), 1, 32) == key
    assert cache_key(base, 2, 32) != key and cache_key(base, 1, 64) != key
    deeper = autopar.models.build("tiny-llama", device="meta", num_layers=3)
    assert cache_key(deeper, 1, 32) != key
    # a config field that changes no shape (the norms' epsilon, an op's scalar argument)
    eps = autopar.models.build("tiny-llama", device="meta", norm_eps=1e-3)
    assert [p.shape for p in eps.parameters()] == [p.shape for p in base.parameters()]
    assert cache_key(eps, 1, 32) != key
    flagged = autopar.models.build("tiny-llama", device="meta")
    next(m for m in flagged.modules() if m is not flagged).some_flag = True  # a forward may read it
    assert cache_key(flagged, 1, 32) != key
    assert cache_key(base.to("meta").train(False), 1, 32) == key  # the mode trace() sets anyway


def test_a_config_object_s_fields_are_read():
    """A module's config -- a dataclass, as the zoo's -- is read field by field: its forward
    may branch on a field no shape shows."""
    from torch import nn

    @dataclasses.dataclass
    class Cfg:
        causal: bool = True

    def net(causal: bool) -> nn.Module:
        with torch.device("meta"):
            m = nn.Linear(4, 4)
        m.cfg = Cfg(causal)
        return m

    assert cache_key(net(True), 1, 8) == cache_key(net(True), 1, 8)
    assert cache_key(net(True), 1, 8) != cache_key(net(False), 1, 8)


def test_an_edited_factory_file_is_a_new_entry(tmp_path):
    source = tmp_path / "factory.py"
    body = ("import torch\nfrom torch import nn\n\n"
            "class Net(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.emb = nn.Embedding(64, 16)\n"
            "        self.out = nn.Linear(16, 64)\n"
            "    def forward(self, tokens):\n"
            "        return self.out(self.emb(tokens))\n")
    source.write_text(body)
    spec = ModelSpec.parse(f"{source}:Net")
    key = cache_key(spec.build("meta"), 1, 16)
    source.write_text(body.replace("self.emb(tokens)", "self.emb(tokens) * 2"))
    assert cache_key(spec.build("meta"), 1, 16) != key


def test_a_broken_entry_is_traced_again(cache):
    folder, calls = cache
    model = autopar.models.build("tiny-llama", device="meta")
    traced(model, TRAIN)
    (entry,) = folder.glob("*.pkl")
    entry.write_bytes(b"not a pickle")
    again = traced(model, TRAIN)
    assert len(calls) == 2 and again.gm is not None  # traced, not read
    assert traced(model, TRAIN).nodes == again.nodes and len(calls) == 2  # rewritten


def test_without_the_cache_nothing_is_read_or_written(cache):
    folder, calls = cache
    model = autopar.models.build("tiny-llama", device="meta")
    traced(model, TRAIN, cache=False)
    traced(model, TRAIN, cache=False)
    assert len(calls) == 2 and not folder.exists()


def test_plan_uses_the_cache_unless_told_not_to(cache, capsys):
    folder, calls = cache
    args = ["plan", "--model", "tiny-llama", "--cluster", "hgx-h100-80g", "--nodes", "1",
            "--global-batch", "8", "--seq-len", "32", "--no-explain"]
    assert main([*args, "--no-cache"]) == 0 and not folder.exists()
    capsys.readouterr()
    assert main(args) == 0 and len(list(folder.glob("*.pkl"))) == 1
    first = capsys.readouterr().out
    assert main(args) == 0 and len(calls) == 2  # the third plan read the second's trace
    assert capsys.readouterr().out == first


def test_estimate_reads_the_cache_the_plan_filled(cache, capsys):
    folder, calls = cache
    model = ["--model", "tiny-llama", "--cluster", "hgx-h100-80g", "--nodes", "1",
             "--global-batch", "8", "--seq-len", "32"]
    assert main(["estimate", *model, "--dp", "8", "--no-cache"]) == 0 and not folder.exists()
    assert main(["plan", *model, "--no-explain"]) == 0 and len(calls) == 2
    assert main(["estimate", *model, "--dp", "8"]) == 0 and len(calls) == 2  # read, not traced
    assert len(list(folder.glob("*.pkl"))) == 1


def test_a_graph_that_does_not_pickle_is_traced_and_not_kept(cache, monkeypatch):
    """An op argument of a user's model that pickle refuses costs the cache, not the command:
    the traced graph is returned, and neither an entry nor a temporary file is left."""
    folder, calls = cache
    real = trace_cache.trace

    def unpicklable(*args, **kwargs):
        graph = real(*args, **kwargs)
        graph.nodes[0] = dataclasses.replace(graph.nodes[0], scalar_args=(lambda: None,))
        return graph

    monkeypatch.setattr(trace_cache, "trace", unpicklable)
    graph = traced(autopar.models.build("tiny-llama", device="meta"), TRAIN)
    assert graph.nodes and not list(folder.glob("*"))
