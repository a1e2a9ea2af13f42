"""The cost model against published FP8 runs and their bf16 twins (``tests/data/fp8_runs.json``;
the table: ``python bench/validate_moe.py --runs tests/data/fp8_runs.json --precision all``,
``bench/results/fp8.md``).

Every run is priced as it ran (``autopar/measure/moe_validation.py``: a dense Llama-shaped model
in the ``llama`` family, a mixture of experts as the MoE runs; the FP8 recipe as ``Fp8Recipe``
maps it; Transformer Engine's fused casts for every FP8 run not on torchao, Inductor's for
torchao's runs under torch.compile), nothing fitted per run. The checks fail when the model drifts: the mean error over the FP8 runs priced stays at or
below what was measured when it was last changed, the pairs that differ in precision alone keep
their order (FP8 faster) and the memory difference the model gives them (torchao's casts are
transient: the same peak, as torchao's source prints it, 47.65 against 47.77 GB; Transformer
Engine keeps FP8 weight copies, more, and saves its linears' inputs in FP8, less: a peak of its
own -- the sources print no peak memory for its pairs), and the runs autopar cannot express
stay the ones listed, with the reason.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autopar.measure.moe_validation import MoERunCheck, check_moe_run, load_runs

RUNS = Path(__file__).resolve().parents[2] / "data" / "fp8_runs.json"
ALL = load_runs(RUNS, None)

MEAN_ERROR = 0.20
"""Mean |error| over the FP8 runs priced, measured 2026-11-28 (x86_64, torch 2.13): 0.1954 with
DeepSeek-V3's 256 B200 MXFP8 run recorded as its recipe ran it (Megatron-Bridge's
``DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2`` at 5acef9309, the config whose PP8 VP2 EP32 the
archive row states: DeepEP's flex dispatcher, the all-to-all overlapped, its pipeline layout,
mla_up_proj and mlp recomputed), +1.7 % where the run without them was priced +162 % (34 s of
all-to-all exposed over the network). Before, 0.2389 with
DeepSeek-V3's runs cut as the layouts they state cut them (``train.pipeline_layout``: 1024 H100
+52.1 %, was +85.5 %; 256 GB200, the card's, +0.9 %, was +11.9 %) and the runs' gradient dtype
priced (``TrainSpec.grad_dtype``, ``moe_validation.grad_dtype_of``: NeMo 24.09's
``grad_sync_dtype bf16`` among them, which takes the Llama 3.1 8B runs on 8 H100s from 79.5 and
77.3 GiB to 64.6 and 62.3, fitting; 0.2513 with the gradients alone); before either, 0.253 over
37 (H100 SXM 0.158 over 11, GB200 0.173 over 12, B200 0.457 over 9 -- torchao's B200 rows ran
power-limited at a limit their source does not state, -60 % and worse, bf16 too, and
DeepSeek-V3's 256 B200 run is priced +162 %, 34 s of it the all-to-all over the network --,
H100 (torchao's) 0.335 over 3, H200 0.213 over 2). It was 0.247 before the runs were priced with
the norm and activation kernels their engines fused (``moe_validation.ENGINE_KERNELS``): that
took 3.5-14 GiB off the dense runs' peaks (4 more of them fit) and 1-3 % off their times, which
moves the runs already priced too fast further out (torchtitan's and torchao's, -18 to -66 %:
their engine runs the same model at about 0.6 of Megatron's throughput per GPU on H100, which
the cost model does not price). 0.250 on 2026-11-27; the issue's target is 0.10."""

REFUSED = {
    "Nemotron-4-340B": "squared_relu",  # an un-gated MLP and LayerNorm: no zoo family
    "Llama-4-Maverick-17B-128E": "MLA",  # alternating dense and MoE layers, GQA with experts
    "H100-96GB-HBM2e-500W": "no cluster preset",  # Meta's Grand Teton H100: no preset yet
}
"""What autopar cannot price, by model or GPU, with the words of the reason."""

PRECISION_ONLY = re.compile(r"^precision(/recipe)? \((?!.*CUDA graph)[^+]*$")
"""A pair's ``varies`` naming precision (and recipe) alone: no CUDA graphs, no other change."""
LAYOUT = ("tp", "pp", "vpp", "cp", "ep", "micro_batch", "global_batch", "seq_len")
"""And the same layout and batch (a pair whose source changed them too is not one)."""


def _layout(c: MoERunCheck) -> tuple:
    return tuple(c.run["train"].get(k) for k in LAYOUT) + (c.run["cluster"]["num_gpus"],)


@pytest.fixture(scope="module")
def checks() -> dict[str, MoERunCheck]:
    graphs: dict = {}
    return {r["id"]: check_moe_run(r, graphs=graphs) for r in ALL}


def test_mean_error_over_the_fp8_runs_does_not_drift(checks):
    priced = [c for c in checks.values()
              if c.run["train"]["precision"] == "fp8" and c.error is not None]
    assert len(priced) >= 30
    mean = sum(abs(c.error) for c in priced) / len(priced)
    assert mean <= MEAN_ERROR, f"mean |error| {mean:.3f} over {len(priced)} FP8 runs"


def test_only_the_listed_runs_are_refused_and_for_their_reason(checks):
    for c in checks.values():
        key = next((k for k in REFUSED if k in (c.run["model"]["name"], c.run["cluster"]["gpu"])),
                   None)
        if key is None:
            assert not c.refused, (c.run["id"], c.refused)
        else:
            assert REFUSED[key] in c.refused, (c.run["id"], c.refused)


def _pairs(checks):
    groups: dict[str, list[MoERunCheck]] = {}
    for c in checks.values():
        pair = c.run.get("pair") or {}
        if pair.get("name") and PRECISION_ONLY.match(str(pair.get("varies", ""))) \
                and c.error is not None:
            groups.setdefault(pair["name"], []).append(c)
    out = []
    for group in groups.values():
        for bf16 in (c for c in group if c.run["train"]["precision"] == "bf16"):
            out += [(bf16, fp8) for fp8 in group if fp8.run["train"]["precision"] == "fp8"
                    and _layout(fp8) == _layout(bf16)]
    return out


def test_fp8_vs_bf16_pairs_keep_their_order_and_memory_sign(checks):
    pairs = _pairs(checks)
    assert len(pairs) >= 12
    for bf16, fp8 in pairs:
        assert (fp8.measured_s < bf16.measured_s) == (fp8.predicted_s < bf16.predicted_s), (
            bf16.run["id"], fp8.run["id"])
        torchao = "torchao" in str(fp8.run["train"]["fp8_recipe"]).lower()
        if torchao:  # transient casts: the same peak (the dry run agrees, memory grid)
            assert fp8.peak_gib == pytest.approx(bf16.peak_gib, rel=0.01)
        else:  # Transformer Engine keeps FP8 weight copies (more) and saves its linears'
            # inputs in FP8 (less): a peak of its own
            assert fp8.peak_gib != pytest.approx(bf16.peak_gib, rel=0.01), (
                bf16.run["id"], fp8.run["id"])
