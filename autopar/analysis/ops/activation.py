"""Activations and pointwise math: ``gelu``, ``silu``, ``relu``, ``tanh``, ``sigmoid``, ``exp``...

* FLOPs per output element: GELU 5 (tanh approximation: cube, fma, tanh, add, multiply), SiLU 4
  (x * sigmoid(x): exp, add, divide, multiply), the others 1 (rough counts: they matter for the
  roofline's memory side, not the FLOP side).
* Saved: GELU, SiLU, tanh, sigmoid, pow, log, sin, cos and abs keep their input; ReLU, rsqrt, exp
  and sqrt their output.
* Strategies: any split passes through (``elementwise.elementwise_rule``).
* Fusions: ``gelu`` (saves its input) and ``swiglu`` (``silu(gate) * up``: saves gate and up,
  silu(gate) is recomputed), the kernels of ``autopar.kernels``.

``glu`` (``F.glu(x, dim)``, ``nn.GLU``: ``a * sigmoid(b)`` of the two halves of ``x`` along
``dim``) counts 4 FLOPs per output element, as SiLU (exp, add, divide, multiply), and keeps its
input. It runs whole on every tp rank (``rules.whole``): it multiplies the two halves of one dim,
which a split of that dim would deal to different ranks, and a layout does not say which dim it
cuts once the tensor has been transposed (a gated convolution's channels, ``conv.py``).
"""

from __future__ import annotations

from autopar.analysis.graph import NodeInfo
from autopar.analysis.ops.elementwise import elementwise_rule
from autopar.analysis.ops.norm import keeps_first_input
from autopar.analysis.ops.registry import FusionPattern, OpFamily, Saver, register
from autopar.analysis.ops.rules import whole


def saves_input(node: NodeInfo, saver: Saver) -> None:
    for i in node.inputs[:1]:
        saver.keep(i)


def saves_output(node: NodeInfo, saver: Saver) -> None:
    saver.keep(node.name)


def swiglu_saves(chain: list[NodeInfo], saver: Saver) -> None:
    """The SwiGLU kernel keeps gate and up."""
    first, last = chain[0], chain[-1]
    saver.keep(first.inputs[0])
    for i in last.inputs:
        if i != first.name:
            saver.keep(i)


ACTIVATION = register(OpFamily(
    "activation", ops=("gelu", "silu", "tanh", "sigmoid", "pow", "log", "sin", "cos", "abs"),
    aliases={"GELU": "gelu", "SiLU": "silu", "Tanh": "tanh", "Sigmoid": "sigmoid"},
    flop_per_element={"gelu": 5, "silu": 4, "tanh": 1, "sigmoid": 1, "pow": 1, "abs": 1},
    saves=saves_input, rule=elementwise_rule,
    fusions=(FusionPattern("gelu", ("gelu",), kernel_saves=keeps_first_input),
             FusionPattern("swiglu", ("silu", "mul"), kernel_saves=swiglu_saves))))

ACTIVATION_SAVING_OUTPUT = register(OpFamily(
    "activation_saving_output", ops=("relu", "rsqrt", "exp", "sqrt"), aliases={"ReLU": "relu"},
    flop_per_element={"relu": 1, "rsqrt": 1, "exp": 1}, saves=saves_output,
    rule=elementwise_rule))

GATED = register(OpFamily(
    "gated", ops=("glu",), aliases={"GLU": "glu"}, flop_per_element={"glu": 4},
    saves=saves_input, rule=whole))
