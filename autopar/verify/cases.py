"""Property-based verification: random small models and plans, each run through ``verify``.

The property: every case either passes ``autopar.verify.run`` (the sharded program computes what
the model computes, within ``verify.TOLERANCES``) or is refused before a process starts, with a
reason a person can act on. A crash (a rank dying, an error that is not an ``AutoparError``)
and a mismatch (a program that ran and differs) are failures.

``draw_case(rng)`` draws one case: a model -- half the time of a zoo family (``gpt``,
``llama``, ``moe``) with a random shape (odd vocabularies and sequence lengths, 1 to 8 heads
with any dividing number of key/value heads, widths tp may not divide, 1 to 4 blocks, 2 to 8
experts), else what newcomers bring (``autopar.verify.models``): a transformers config of any
architecture they tried (Llama to DeepSeek-V3, GPT-OSS, BERT and T5) or a hand-written decoder
of one of four styles, at a random tiny shape -- and a plan with every ``ParallelConfig``
field drawn (dp, tp, pp, cp, ep, ZeRO stage, micro-batching, schedule and virtual stages --
at pp = 1 too, which must be refused --, sequence parallelism, checkpointing uniform or per
block, offload, fusions) and a precision. ``run_case`` plans it with ``autopar.plan_for`` on a one-node cluster of as
many GPUs as processes, and verifies it. ``tests/dist/test_verify_cases.py`` runs a fixed-seed
sample in CI; ``bench/fuzz_verify.py`` a longer run (``bench/results/fuzz_verify.md``).
"""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from autopar.core.errors import AutoparError
from autopar.core.specs import KERNEL_FUSIONS
from autopar.core.model_spec import ModelSpec
from autopar.verify.models import ARCHITECTURES, DECODER_STYLES, Shape, decoder_spec, \
    transformers_spec

WORLD_SIZES = (1, 2, 2, 2, 4, 4, 4, 8)
"""Processes per case, drawn uniformly from this list (2 and 4 most often: 8 gloo processes
take twice as long on a 2-core machine)."""
FUSIONS = KERNEL_FUSIONS
PRECISIONS = ("fp32", "fp32", "bf16", "fp16", "bf16-pure")


class Outcome(StrEnum):
    PASSED = "passed"
    REFUSED = "refused"
    """Refused before any process started, with an ``AutoparError``: allowed."""
    MISMATCH = "mismatch"
    """The program ran and differs from the reference beyond the tolerance: a failure."""
    CRASHED = "crashed"
    """A rank failed, or something raised that is not an ``AutoparError``: a failure."""


@dataclass(frozen=True)
class Case:
    """One model, one plan, one precision."""

    index: int
    spec: ModelSpec
    shape: Shape
    """The model's shape (a zoo model's fields name it too)."""
    fields: dict[str, Any]
    """``ParallelConfig`` fields."""
    precision: str
    global_batch: int
    seq_len: int

    def describe(self) -> str:
        s = self.shape
        shape = (", ".join(f"{k}={v}" for k, v in self.spec.overrides.items()) if self.spec.name
                 else f"layers={s.layers}, heads={s.heads}/{s.kv_heads}x{s.head_dim}, "
                      f"vocab={s.vocab}")
        plan = " ".join(f"{k}={v}" for k, v in self.fields.items())
        return (f"#{self.index} {self.spec.label}({shape}) | {plan} | {self.precision} "
                f"batch {self.global_batch}x{self.seq_len}")


@dataclass
class Result:
    case: Case
    outcome: Outcome
    reason: str = ""
    """The refusal, the failure, or the verify table's worst measures."""
    wall_s: float = 0.0
    measures: dict[str, float] = field(default_factory=dict)
    """loss, grads, params measures of a run that verified (passed or mismatched)."""


DECODER_FOLDER = Path(tempfile.gettempdir()) / "autopar-verify-cases"
"""Where the hand-written decoders' files are written (one per shape, ``decoder_spec``)."""


def _newcomer(rng: random.Random) -> tuple[ModelSpec, Shape]:
    """A transformers config of a random architecture or a hand-written decoder, tiny."""
    heads = rng.choice((2, 4))
    shape = Shape(layers=rng.choice((1, 2, 2, 3)), heads=heads,
                  kv_heads=rng.choice([k for k in (1, 2, 4) if heads % k == 0]),
                  head_dim=rng.choice((8, 16)), vocab=rng.randrange(64, 300),
                  ffn=rng.choice((32, 64, 128)), experts=4, top_k=rng.choice((1, 2)),
                  seq=rng.choice((32, 64)))
    if rng.random() < 0.75:
        return transformers_spec(rng.choice(sorted(ARCHITECTURES)), shape), shape
    return decoder_spec(rng.choice(DECODER_STYLES), shape, DECODER_FOLDER), shape


def _model(rng: random.Random) -> tuple[ModelSpec, Shape]:
    if rng.random() < 0.5:
        return _newcomer(rng)
    family = rng.choice(("gpt", "llama", "llama", "moe"))
    heads = rng.choice((1, 2, 3, 4, 4, 6, 8))
    head_dim = rng.choice((4, 8, 8, 16))  # even: RoPE rotates pairs
    fields: dict[str, Any] = dict(
        num_layers=rng.choice((1, 2, 2, 3, 4)), hidden_size=heads * head_dim, num_heads=heads,
        vocab_size=rng.randrange(40, 300), seq_len=rng.randrange(5, 41))
    if family == "gpt":
        fields["attention"] = rng.choice(("sdpa", "sdpa", "eager"))
        fields["ffn_hidden_size"] = rng.choice((None, 4 * heads * head_dim, 30, 100))
        fields["tie_embeddings"] = rng.random() < 0.7
    else:
        fields["tie_embeddings"] = rng.random() < 0.2
        fields["num_kv_heads"] = rng.choice([k for k in range(1, heads + 1) if heads % k == 0])
        fields["ffn_hidden_size"] = rng.choice((16, 24, 30, 48, 64, 100, 128))
    if family == "moe":
        fields["num_experts"] = rng.choice((2, 3, 4, 8))
        fields["top_k"] = rng.randint(1, min(2, fields["num_experts"]))
        fields["capacity_factor"] = rng.choice((1.0, 1.25, 2.0))
    shape = Shape(layers=fields["num_layers"], heads=heads,
                  kv_heads=fields.get("num_kv_heads", heads), head_dim=head_dim,
                  vocab=fields["vocab_size"], seq=fields["seq_len"])
    return ModelSpec(family, fields), shape


def _factor(world: int, rng: random.Random, shape: Shape) -> dict[str, int]:
    """dp, tp, pp, cp with product ``world``: cp > 1 rarely, and three
    times in four a tp that divides the heads (the rest exercises the refusal)."""
    heads = (shape.heads, shape.kv_heads)
    degrees = {"dp": 1, "tp": 1, "pp": 1, "cp": 1}
    left = world
    for axis in rng.sample(["dp", "tp", "pp", "cp"], 4):
        if axis == "cp" and rng.random() > 0.1:
            continue
        choices = [d for d in (1, 2, 4, 8) if left % d == 0]
        if axis == "tp" and rng.random() < 0.75:
            choices = [d for d in choices if all(h % d == 0 for h in heads)]
        if axis == "pp" and rng.random() < 0.75:
            choices = [d for d in choices if d <= shape.layers]
        degrees[axis] = rng.choice(choices)
        left //= degrees[axis]
    degrees["dp"] *= left
    return degrees


def draw_case(rng: random.Random, index: int = 0) -> Case:
    """One random case (see the module docstring)."""
    spec, shape = _model(rng)
    world = rng.choice(WORLD_SIZES)
    fields: dict[str, Any] = _factor(world, rng, shape)
    if rng.random() < 0.1:
        fields["ep"] = rng.choice((2, 4))
    fields["zero"] = rng.choice((0, 1, 2, 3))
    fields["micro_batch"] = rng.choice((1, 1, 2))
    m = rng.choice((1, 2, 2, 3, 4))
    if rng.random() < 0.2:
        fields["num_microbatches"] = m
    if fields["pp"] > 1 or rng.random() < 0.05:  # at pp = 1: chunks nothing interleaves
        fields["schedule"] = rng.choice(("gpipe", "1f1b", "interleaved"))
        if fields["schedule"] == "interleaved":
            fields["virtual_stages"] = rng.choice((1, 2))
    if fields["tp"] > 1 and rng.random() < 0.6:
        fields["sequence_parallel"] = True
    layers = shape.layers
    r = rng.random()
    # odd cases run the matmuls policy where even ones run selective (an index, not a draw:
    # the seeded samples stay the cases they were)
    partial = "matmuls" if index % 2 else "selective"
    if r < 0.15:
        fields["checkpoint"] = tuple(p if p != "selective" else partial for p in (
            rng.choice(("none", "selective", "full")) for _ in range(layers)))
    elif r < 0.5:
        policy = rng.choice(("selective", "full"))
        fields["checkpoint"] = partial if policy == "selective" else policy
    if rng.random() < 0.1:
        fields["offload"] = True
    if rng.random() < 0.12:
        fields["fusions"] = tuple(sorted(rng.sample(FUSIONS, rng.randint(1, 3))))
    seq = rng.choice((shape.seq, rng.randrange(4, shape.seq + 1)))
    return Case(index, spec, shape, fields, rng.choice(PRECISIONS),
                fields["dp"] * fields["micro_batch"] * m, seq)


def draw_cases(seed: int, count: int) -> list[Case]:
    """``count`` cases from ``seed`` (the same list on every machine)."""
    rng = random.Random(seed)
    return [draw_case(rng, i) for i in range(count)]


def plan_case(case: Case):
    """The case's plan (``autopar.plan_for`` on a one-node cluster of its world size); raises
    ``AutoparError`` for a configuration the admissibility check refuses."""
    from autopar.api import plan_for
    from autopar.core.specs import ParallelConfig, TrainSpec
    from autopar.costmodel.cluster import process_cluster

    config = ParallelConfig(**case.fields)
    train = TrainSpec(global_batch=case.global_batch, seq_len=case.seq_len,
                      precision=case.precision)
    return plan_for(case.spec.build("meta"), process_cluster(config.world_size), train,
                            config, name=case.spec.name, model_spec=case.spec)


def run_case(case: Case, *, steps: int = 2, timeout_s: float = 240.0) -> Result:
    """Plan and verify ``case``; never raises for what the case does (see ``Outcome``)."""
    from autopar.verify.run import ProgramFailed, verify

    start = time.monotonic()
    try:
        plan = plan_case(case)
    except AutoparError as err:
        return Result(case, Outcome.REFUSED, err.paragraph(), time.monotonic() - start)
    except Exception as err:  # noqa: BLE001 - a crash of the planner is a finding
        return Result(case, Outcome.CRASHED, f"planning: {type(err).__name__}: {err}",
                      time.monotonic() - start)
    try:
        result = verify(None, plan, steps=steps, timeout_s=timeout_s)
    except AutoparError as err:
        crashed = isinstance(err, ProgramFailed)
        return Result(case, Outcome.CRASHED if crashed else Outcome.REFUSED, err.paragraph(),
                      time.monotonic() - start)
    except Exception as err:  # noqa: BLE001 - a crash of verify is a finding
        return Result(case, Outcome.CRASHED, f"verify: {type(err).__name__}: {err}",
                      time.monotonic() - start)
    measures = {"loss": result.loss.measure, "grads": result.grads.measure,
                "params": result.params.measure}
    worst = (f"loss {result.loss.measure:.2e}, grads {result.grads.measure:.2e} "
             f"({result.grads.where}), params {result.params.measure:.2e} "
             f"({result.params.where})")
    if result.missing:
        worst += f"; missing parameters {', '.join(result.missing)}"
    return Result(case, Outcome.PASSED if result.passed else Outcome.MISMATCH, worst,
                  time.monotonic() - start, measures)
