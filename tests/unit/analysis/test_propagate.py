"""The trace's shape propagation runs each distinct call once (``autopar/analysis/propagate.py``),
and its tuple unpacking reads a function's instructions once (``fx_tracer._UnpackingProxy``):
the graphs are those of a run that calls every node, and only calls whose result is a function
of their key are run once."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from autopar import TrainSpec, models
from autopar.analysis import propagate
from autopar.analysis.tracing import trace

TRAIN = TrainSpec(global_batch=4, seq_len=32)


@pytest.fixture
def every_call(monkeypatch):
    monkeypatch.setattr(propagate.ShapeRecorder, "_once", lambda self, key, run: run())


def _graph(name: str, device: str = "meta"):
    g = trace(models.build(name, device=device), TRAIN, batch=2)
    return dataclasses.replace(g, fx=None)  # the fx graph object itself is a new one


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama", "tiny-moe", "tiny-deepseek",
                                  "tiny-gpt-oss"])
def test_the_graph_is_the_one_every_call_gives(name: str, request) -> None:
    once = _graph(name)
    request.getfixturevalue("every_call")
    assert _graph(name) == once


def test_on_fake_tensors_too(request) -> None:
    once = _graph("tiny-llama", device="cpu")
    request.getfixturevalue("every_call")
    assert _graph("tiny-llama", device="cpu") == once


def test_a_repeated_call_is_run_once_and_answered_with_new_tensors() -> None:
    class Twice(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.LayerNorm(8)

        def forward(self, x):
            a = self.norm(F.silu(x))
            return self.norm(F.silu(a)), a

    gm = torch.fx.symbolic_trace(Twice().to("meta"))
    runs = []
    recorder = propagate.ShapeRecorder(gm, gm.graph)
    real = torch.fx.Interpreter.call_module

    def counting(self, target, args, kwargs):
        runs.append(target)
        return real(self, target, args, kwargs)

    torch.fx.Interpreter.call_module = counting
    try:
        with torch.no_grad():  # as propagate runs it (else a's grad makes the calls differ)
            recorder.run(torch.empty(2, 8, device="meta"))
    finally:
        torch.fx.Interpreter.call_module = real
    assert runs == ["norm"]
    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "call_module"]
    assert vals[0] is not vals[1] and vals[0].shape == vals[1].shape == (2, 8)


def test_what_is_never_run_once() -> None:
    x = torch.empty(2, 8, device="meta")
    assert propagate._function_key(torch.relu_, (x,), {}) is None          # in place
    assert propagate._function_key(F.relu, (x,), {"inplace": True}) is None
    assert propagate._function_key(torch.add, (x, x), {"out": x}) is None
    assert propagate._function_key(print, (x,), {}) is None                # not torch's
    assert propagate._function_key(F.relu, (x, object()), {}) is None      # no key for it
    assert propagate._function_key(F.relu, (x,), {}) is not None

    class Mine(torch.nn.Linear):  # a user's subclass: its forward is its own
        pass

    mine = Mine(8, 8, device="meta")
    assert propagate._module_key(mine, (x,), {}) is None
    linear = torch.nn.Linear(8, 8, device="meta")
    assert propagate._module_key(linear, (x,), {}) is not None
    linear.register_forward_hook(lambda *a: None)
    assert propagate._module_key(linear, (x,), {}) is None


def test_unpacking_a_traced_shape_still_unpacks() -> None:
    class Unpack(torch.nn.Module):
        def forward(self, x):
            b, s, h = x.shape
            return x.view(b * s, h)

    from autopar.analysis.fx_tracer import RegistryLeaves

    graph = RegistryLeaves().trace(Unpack())  # no token input: fx's tracer itself
    assert [n.target for n in graph.nodes if n.op == "call_method"] == ["view"]
    assert [n.target.__name__ for n in graph.nodes if n.op == "call_function"] == [
        "getattr", "getitem", "getitem", "getitem", "mul"]


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-deepseek"])
def test_parameters_read_in_forward_are_the_nodes_fx_makes(name: str, monkeypatch) -> None:
    # the tracer finds a parameter read in forward (a MoE's expert weights: 8 reads here)
    # by a map made once per trace; fx's own walks the root's parameters at each read
    from autopar.analysis.fx_tracer import RegistryLeaves

    ours = _graph(name)
    monkeypatch.setattr(RegistryLeaves, "getattr", torch.fx.Tracer.getattr)
    assert _graph(name) == ours
