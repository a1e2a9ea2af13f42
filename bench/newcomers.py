"""The newcomer catalogue: every model issue 28's newcomers tried, planned, checked and verified.

    python bench/newcomers.py [--only NAME ...] [--markdown FILE] [--steps 2]

For each model -- a tiny transformers config of every architecture in
``autopar.verify.models.ARCHITECTURES``, ViT (``tests/data/vit``) and the hand-written decoder
styles of ``autopar/verify/decoders.py`` (a stack of torch's own ``nn.TransformerEncoderLayer``
among them) -- it runs what a new user runs:

1. ``plan``: ``autopar.optimize`` on one ``hgx-h100-80g`` node (8 GPUs), batch 16 x 32;
2. ``plan --check``: ``autopar.check_plans`` of that plan (every rank role one step on fake
   tensors);
3. ``verify``: the first of pp 2, tp 2 (with sequence parallelism) and dp 2 the admissibility
   check admits, on gloo CPU processes against one process (``autopar.verify.run``), with the
   reasons the others were refused.

Each step's outcome is one of: ok; refused (an ``AutoparError`` before any process started:
allowed, with its reason); crashed (anything else, or a rank failing: a failure); mismatch
(verify ran and differs: a failure). Prints a table and exits 1 when any step crashed or
mismatched; ``--markdown`` writes it (``bench/results/newcomers.md`` records a run).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

import autopar  # noqa: E402
from autopar import AutoparError, ParallelConfig, TrainSpec  # noqa: E402
from autopar.analysis.admissibility import check, facts_of  # noqa: E402
from autopar.core.model_spec import ModelSpec  # noqa: E402
from autopar.costmodel.cluster import ClusterSpec, process_cluster  # noqa: E402
from autopar.models.feed import fixed_seq_len  # noqa: E402
from autopar.verify.models import (ARCHITECTURES, DECODER_STYLES, Shape,  # noqa: E402
                                   decoder_spec, transformers_spec)

TRAIN = TrainSpec(global_batch=16, seq_len=32)
VERIFY_TRAIN = dict(seq_len=32, precision="fp32")
TRIES = (("pp2", dict(pp=2, micro_batch=1)),
         ("tp2 sp", dict(tp=2, sequence_parallel=True, micro_batch=1)),
         ("dp2", dict(dp=2, micro_batch=1)))
"""The verify plans tried in order: the first the admissibility check admits runs."""

@dataclass
class Row:
    name: str
    plan: str = ""
    check: str = ""
    verify: str = ""
    failed: bool = False
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def catalogue(folder: Path) -> dict[str, Callable[[], ModelSpec]]:
    """Model name -> the spec to build it (built lazily: a broken one fails its own row)."""
    models: dict[str, Callable[[], ModelSpec]] = {
        name: (lambda n=name: transformers_spec(n)) for name in ARCHITECTURES}

    vit = Path(__file__).resolve().parents[1] / "tests" / "data" / "vit"  # a saved config
    models["vit"] = lambda: ModelSpec.parse(str(vit))
    shape = Shape(seq=64)
    for style in DECODER_STYLES:
        models[f"hand-written {style}"] = lambda s=style: decoder_spec(s, shape, folder)
    return models


def _first_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:240]


def run_one(name: str, make: Callable[[], ModelSpec], steps: int) -> Row:
    from autopar.dryrun.plan_check import check_plans
    from autopar.verify.run import ProgramFailed, verify

    row = Row(name)
    start = time.monotonic()
    try:
        spec = make()
        model = spec.build("meta")
    except AutoparError as err:
        row.plan = f"refused: {_first_line(err.what)}"
        return row
    except Exception as err:  # noqa: BLE001 - a crash is a finding
        row.plan, row.failed = f"CRASHED building: {type(err).__name__}: {_first_line(err)}", True
        return row
    cluster = ClusterSpec.preset("hgx-h100-80g")
    own_seq = fixed_seq_len(model)  # an image model's: its patches and class token (ViT: 17)
    try:
        plan = autopar.optimize(model, cluster, dataclasses.replace(
            TRAIN, seq_len=own_seq or TRAIN.seq_len), model_spec=spec, keep=2)
        row.plan = plan.summary()
    except AutoparError as err:
        row.plan = f"refused: {_first_line(err.what)}"
        plan = None
    except Exception as err:  # noqa: BLE001
        row.plan, row.failed = f"CRASHED: {type(err).__name__}: {_first_line(err)}", True
        plan = None
    if plan is not None:
        try:
            checked = check_plans(plan, workers=1).checked[0]
            run = checked.run
            row.check = ("ok" if checked.kept else f"dropped: {checked.problem}") + (
                f" (dry run {run.peak_bytes / 2**20:.2f} MiB, predicted "
                f"{checked.plan.estimate.peak_memory_bytes / 2**20:.2f} MiB)" if run else "")
        except AutoparError as err:
            row.check = f"refused: {_first_line(err.what)}"
        except Exception as err:  # noqa: BLE001
            row.check, row.failed = f"CRASHED: {type(err).__name__}: {_first_line(err)}", True
    facts = facts_of(model)
    refusals = []
    for label, fields in TRIES:
        config = ParallelConfig(**fields)
        train = TrainSpec(global_batch=2 * config.dp * (2 if config.pp > 1 else 1),
                          **{**VERIFY_TRAIN, "seq_len": own_seq or VERIFY_TRAIN["seq_len"]})
        try:
            check(facts, config, train)
            verify_plan = autopar.plan_for(model, process_cluster(config.world_size), train,
                                           config, model_spec=spec)
        except AutoparError as err:
            refusals.append(f"{label}: {_first_line(err.what)}")
            continue
        except Exception as err:  # noqa: BLE001
            row.verify = f"{label} CRASHED planning: {type(err).__name__}: {_first_line(err)}"
            row.failed = True
            break
        try:
            result = verify(spec, verify_plan, steps=steps)
        except ProgramFailed as err:
            row.verify, row.failed = f"{label} CRASHED in the ranks: {_first_line(err.what)}", True
        except AutoparError as err:
            row.verify = f"{label} refused: {_first_line(err.what)}"
        except Exception as err:  # noqa: BLE001
            row.verify, row.failed = f"{label} CRASHED: {type(err).__name__}: {_first_line(err)}", True
        else:
            worst = (f"loss {result.loss.measure:.1e}, grads {result.grads.measure:.1e}, "
                     f"params {result.params.measure:.1e}")
            row.verify = f"{label} {'passed' if result.passed else 'MISMATCH'} ({worst})"
            row.failed |= not result.passed
        break
    else:
        row.verify = "refused: " + "; ".join(refusals)
    row.notes = refusals if row.verify and not row.verify.startswith("refused") else []
    row.seconds = time.monotonic() - start
    return row


def table(rows: list[Row], wall_s: float, steps: int) -> str:
    failed = sum(r.failed for r in rows)
    lines = [f"# Newcomer catalogue: {len(rows)} models", "",
             f"Machine: {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, "
             f"Python {platform.python_version()}; plan on hgx-h100-80g x 8 at batch "
             f"{TRAIN.global_batch} x {TRAIN.seq_len}; verify {steps} steps fp32; "
             f"{wall_s / 60:.1f} min in all. Failures (crash or mismatch): {failed}.", "",
             "| model | plan | plan --check | verify | s |", "|---|---|---|---|---|"]
    for r in rows:
        verify = r.verify + (f" (before it: {'; '.join(r.notes)})" if r.notes else "")
        lines.append(f"| {r.name} | {r.plan} | {r.check or '-'} | {verify or '-'} | "
                     f"{r.seconds:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--markdown", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="autopar-newcomers-"))
    models = catalogue(folder)
    names = args.only or list(models)
    unknown = [n for n in names if n not in models]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}: choose from {', '.join(models)}")
    start = time.monotonic()
    rows = []
    for name in names:
        row = run_one(name, models[name], args.steps)
        print(f"{name}: plan {row.plan} | check {row.check} | verify {row.verify} "
              f"({row.seconds:.0f} s)", flush=True)
        rows.append(row)
    text = table(rows, time.monotonic() - start, args.steps)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8")
    return 1 if any(r.failed for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
