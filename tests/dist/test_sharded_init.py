"""Sharded meta initialisation (``passes/materialize.py``) equals the one-process build.

Every case builds its model on the meta device, applies the plan there and materialises only
the rank's shards; every parameter's shards, gathered (``full_tensor``: a copy, no arithmetic),
must equal ``ModelSpec.build("cpu", seed)``'s parameter bit for bit (``torch.equal``, dtype
included), and every buffer too. The cases cover FSDP2's 2-D strided shards (dp x tp), its
uneven last shard (a vocabulary of 250 over 4 ranks: 63, 63, 63, 61 rows), sequence
parallelism, a tied embedding and head in one stage and across pipeline stages, the
interleaved schedule (two stage modules per rank), bf16-pure (the model cast before it is
materialised: the cast shards must equal the fp32 build cast), a mixture of experts, a
transformers Llama, and a seed other than 0. They run in ONE launch of 4 gloo processes, to
keep the test short: ``autopar verify``'s launcher and rank harness
(``verify.start_ranks``/``wait_ranks``, ``verify_worker.main``) run this file as the rank, and
each rank starts its program as ``verify_worker.sharded_program`` (the one ``verify`` and
``train.py`` start from).

The exported folder's ``train.py`` logs every rank's resident memory before the build and its
peak once its weights are in (``VmHWM``; not ``ru_maxrss``, which on Linux keeps the peak of
the process that started the rank): the growth must stay within the rank's shards
plus one whole parameter plus ``RSS_ALLOWANCE_BYTES``, against a process building the whole
model (``BIG``: ~100 MB of fp32 weights), which grows by at least the whole model; that process
measures with ``train.py``'s own functions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from launching import events, launch, losses_of

import autopar
from autopar import ParallelConfig, TrainSpec
from autopar.costmodel.cluster import process_cluster
from autopar.models.hf_llama import HF_LLAMA_TINY
from autopar.models.training import ModelSpec
from autopar.verify.launcher import start_ranks, wait_ranks

TRAIN = TrainSpec(global_batch=8, seq_len=32, precision="fp32")
GPT = ModelSpec("tiny-gpt")
GPT_UNEVEN = ModelSpec("tiny-gpt", {"vocab_size": 250})
LLAMA4 = ModelSpec("tiny-llama", {"num_layers": 4})
HF = ModelSpec.transformers_config("LlamaForCausalLM", HF_LLAMA_TINY)

CASES = {
    # name: (model, plan, precision, seed); every plan on 4 ranks
    "gpt-dp2xtp2-zero3-tied": (GPT, dict(dp=2, tp=2, zero=3, micro_batch=1), "fp32", 0),
    "gpt-dp4-zero3-uneven": (GPT_UNEVEN, dict(dp=4, zero=3, micro_batch=1), "fp32", 0),
    "gpt-tp2-sp-xpp2-tied-across-stages": (GPT, dict(tp=2, pp=2, sequence_parallel=True,
                                                     micro_batch=1), "fp32", 0),
    "llama-dp2xpp2-interleaved": (LLAMA4, dict(dp=2, pp=2, zero=1, schedule="interleaved",
                                               virtual_stages=2, micro_batch=1), "fp32", 0),
    "llama-dp2xtp2-sp-bf16-pure-seed-7": (ModelSpec("tiny-llama"), dict(
        dp=2, tp=2, zero=2, sequence_parallel=True, micro_batch=1), "bf16-pure", 7),
    "moe-dp2xtp2": (ModelSpec("tiny-moe"), dict(dp=2, tp=2, zero=3, micro_batch=1), "fp32", 0),
    "hf-llama-dp2xpp2-zero3": (HF, dict(dp=2, pp=2, zero=3, micro_batch=1), "fp32", 0),
    "hf-llama-dp2xtp2-sp": (HF, dict(dp=2, tp=2, sequence_parallel=True, micro_batch=1),
                            "fp32", 0),
}
NPROC = 4

BIG = ModelSpec("gpt", {"num_layers": 8, "hidden_size": 512, "num_heads": 8, "vocab_size": 256,
                        "seq_len": 32})
"""25.4 M parameters, 101.5 MB (96.8 MiB) in fp32; its largest parameter (fc1, 2048 x 512)
is 4.2 MB (4 MiB)."""
RSS_ALLOWANCE_BYTES = 24 * 2**20
"""What a rank's resident memory may grow by, from before the build to its peak once its
weights are in, besides its shards and one whole parameter: the meta model, the passes'
state (DTensor, FSDP2, process groups, pipeline stages) and the allocator's slack. Measured
9.0-9.5 MiB per rank (dp4 ZeRO-3 of ``BIG``, 6 runs); a whole-model build adds the model's
97 MiB."""


def _plans() -> list[dict]:
    jobs = []
    for name, (spec, fields, precision, seed) in CASES.items():
        config = ParallelConfig(**fields)
        train = TrainSpec(global_batch=8, seq_len=32, precision=precision)
        plan = autopar.plan_for(spec.build("meta"), process_cluster(config.world_size), train,
                                config, model_spec=spec)
        jobs.append({"name": name, "plan": plan.to_dict(), "model": spec.to_dict(),
                     "seed": seed})
    return jobs


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, list[dict]]:
    folder = tmp_path_factory.mktemp("sharded-init")
    start = time.monotonic()
    procs = start_ranks({"cases": _plans()}, NPROC, folder, worker=(__file__,))
    ranks = wait_ranks(procs, folder, timeout_s=240.0)
    print(f"{len(CASES)} cases on {NPROC} ranks: {time.monotonic() - start:.1f} s")
    return {case: [r[case] for r in ranks] for case in CASES}


@pytest.mark.parametrize("case", list(CASES))
def test_every_shard_equals_the_slice_of_the_one_process_build(checked, case):
    ranks = checked[case]
    for r, result in enumerate(ranks):
        assert result["checked"] > 0, (r, result)
        assert result["wrong"] == [], (r, result["wrong"])
        assert result["untied"] == [], (r, result["untied"])  # a tie inside a stage kept
        assert result["tied_held"], (r, result)  # TiedWeights holds the materialised params
        assert result["on_device"], (r, result)
    # between them the ranks hold every parameter and buffer of the model
    everything = set(ranks[0]["reference_names"])
    assert set().union(*(r["names"] for r in ranks)) == everything, case
    assert any(r["sharded"] for r in ranks), case  # DTensor shards: the slicing is checked


# ----- the scheme itself, in this process -----
def test_a_parameter_depends_on_the_seed_and_its_name_only():
    import torch

    two, three = ModelSpec("tiny-llama").build("cpu", 3), ModelSpec(
        "tiny-llama", {"num_layers": 3}).build("cpu", 3)
    assert torch.equal(two.layers[1].attn.q_proj.weight, three.layers[1].attn.q_proj.weight)
    assert not torch.equal(two.layers[0].attn.q_proj.weight, two.layers[1].attn.q_proj.weight)
    other_seed = ModelSpec("tiny-llama").build("cpu", 4)
    assert not torch.equal(two.tok_emb.weight, other_seed.tok_emb.weight)
    # the residual weights are scaled by 1/sqrt(2 L): L differs, so do they
    assert not torch.equal(two.layers[1].attn.o_proj.weight, three.layers[1].attn.o_proj.weight)


def test_the_laws_are_gpt2s_and_transformers():
    import math

    import torch

    gpt = ModelSpec("gpt", {"num_layers": 2, "hidden_size": 256, "num_heads": 4,
                            "vocab_size": 512, "seq_len": 32}).build("cpu", 0)
    assert gpt.head.weight is gpt.tok_emb.weight  # still tied
    assert gpt.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.02)
    assert gpt.layers[1].mlp.fc2.weight.std().item() == pytest.approx(0.02 / math.sqrt(4),
                                                                      rel=0.02)
    assert torch.equal(gpt.layers[0].ln1.weight, torch.ones(256))
    assert torch.equal(gpt.layers[0].attn.qkv.bias, torch.zeros(768))
    moe = ModelSpec("tiny-moe").build("cpu", 0)
    assert moe.layers[0].moe.experts.w_up.std().item() == pytest.approx(0.02, rel=0.05)
    hf = ModelSpec.transformers_config("LlamaForCausalLM", {**HF_LLAMA_TINY,
                                                            "initializer_range": 0.05,
                                                            "pad_token_id": 3}).build("cpu", 0)
    embed = hf.model.embed_tokens.weight
    assert torch.equal(embed[3], torch.zeros(64))  # transformers zeroes the padding row
    assert embed.std().item() == pytest.approx(0.05, rel=0.05)
    assert torch.equal(hf.model.norm.weight, torch.ones(64))
    tied = ModelSpec.transformers_config("LlamaForCausalLM", {
        **HF_LLAMA_TINY, "tie_word_embeddings": True}).build("cpu", 0)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight


def test_meta_then_init_weights_and_a_bf16_build_equal_the_fp32_build():
    import torch

    from autopar import models

    built = models.build("tiny-gpt", device="cpu", seed=2, attention="eager")
    late = models.build("tiny-gpt", attention="eager").to_empty(device="cpu")
    late.init_weights(2)
    low = models.build("tiny-gpt", device="cpu", dtype=torch.bfloat16, seed=2,
                       attention="eager")
    for (name, a), b, c in zip(built.state_dict().items(), late.state_dict().values(),
                               low.state_dict().values()):
        assert torch.equal(a, b), name
        assert torch.equal(a.to(c.dtype), c), name
    assert torch.equal(late.layers[0].attn.causal_mask, built.layers[0].attn.causal_mask)


# ----- the exported train.py's memory -----
WHOLE_BUILD = """
import json, sys
sys.path.insert(0, sys.argv[2])
import train  # the exported train.py: its imports (none counted below) and its measures
spec = train.ModelSpec.from_dict(json.loads(sys.argv[1]))
spec.build("meta")  # as train.py, which builds on meta after its memory is read
before = train.rss_bytes()
model = spec.build("cpu", 0)
print(json.dumps({"before": before, "after": train.peak_rss_bytes()}))
"""


def test_exported_run_holds_its_shards_plus_one_parameter_not_the_whole_model(tmp_path):
    config = ParallelConfig(dp=4, zero=3, micro_batch=1)
    meta = BIG.build("meta")
    train = TrainSpec(global_batch=4, seq_len=32, precision="fp32")  # one row per rank
    plan = autopar.plan_for(meta, process_cluster(4), train, config, model_spec=BIG)
    folder = plan.export(tmp_path / "big")
    log = tmp_path / "log.jsonl"
    wall, output = launch(folder, "--steps", "1", "--log-file", str(log),
                          "--checkpoint-dir", str(tmp_path / "ckpt"))
    assert sorted(losses_of(log)) == [1], output
    memory = events(log, "start")[0]["memory"]
    whole_bytes = sum(p.numel() * 4 for p in meta.parameters())
    largest_bytes = max(p.numel() * 4 for p in meta.parameters())
    whole = json.loads(subprocess.run(
        [sys.executable, "-c", WHOLE_BUILD, json.dumps(BIG.to_dict()), str(folder)], check=True,
        capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1")).stdout)
    grown_whole = whole["after"] - whole["before"]
    grown = [m["peak_rss_after_init_bytes"] - m["rss_before_build_bytes"] for m in memory]
    print(f"train.py {wall:.1f} s; model {whole_bytes / 2**20:.1f} MiB, largest parameter "
          f"{largest_bytes / 2**20:.2f} MiB; RSS growth per rank (MiB) "
          f"{[round(g / 2**20, 1) for g in grown]}, held "
          f"{[round(m['held_bytes'] / 2**20, 1) for m in memory]}; whole build "
          f"{grown_whole / 2**20:.1f} MiB")
    assert len(memory) == 4
    for m, g in zip(memory, grown):
        assert m["held_bytes"] < whole_bytes / 3, m  # a quarter, and the buffers
        assert g <= m["held_bytes"] + largest_bytes + RSS_ALLOWANCE_BYTES, (m, g)
    assert grown_whole >= whole_bytes, whole
    assert max(grown) < grown_whole - whole_bytes / 2, (grown, grown_whole)


# ----- one rank (this file run as a script, by verify_worker.main) -----
def _check_case(job: dict) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from autopar.core.plan import Plan
    from autopar.core.specs import Precision
    from autopar.verify.worker import full, sharded_program

    plan, spec, seed = Plan.from_dict(job["plan"]), ModelSpec.from_dict(job["model"]), job["seed"]
    reference = spec.build("cpu", seed)
    if plan.train.precision is Precision.BF16_PURE:
        reference = reference.to(torch.bfloat16)
    ref_params = dict(reference.named_parameters(remove_duplicate=False))
    ref_buffers = dict(reference.named_buffers(remove_duplicate=False))
    program = sharded_program(spec.build("meta"), plan, spec, seed)
    wrong, names, untied, sharded = [], set(), [], 0
    held = {id(p) for m in program.modules for p in m.parameters()}
    for module in program.modules:
        for name, p in module.named_parameters(remove_duplicate=False):
            sharded += isinstance(p, DTensor)
            whole, ref = full(p), ref_params[name].detach()
            if whole.dtype != ref.dtype or not torch.equal(whole, ref):
                wrong.append(name)
            names.add(name)
        for name, b in module.named_buffers(remove_duplicate=False):
            if b.dtype != ref_buffers[name].dtype or not torch.equal(b, ref_buffers[name]):
                wrong.append(name)
            names.add(name)
        mine = dict(module.named_parameters(remove_duplicate=False))
        for a, b in (("tok_emb.weight", "head.weight"),
                     ("model.embed_tokens.weight", "lm_head.weight")):
            if a in mine and b in mine and (ref_params[a] is ref_params[b]) != (mine[a] is mine[b]):
                untied.append(b)
    dist.barrier()
    return {"checked": len(names), "wrong": wrong, "names": sorted(names), "untied": untied,
            "sharded": sharded, "reference_names": sorted({*ref_params, *ref_buffers}),
            "tied_held": all(id(p) in held for p in program.tied.params),
            "on_device": all(t.device == torch.device("cpu") for m in program.modules
                             for t in (*m.parameters(), *m.buffers()))}


def _check_cases(job: dict) -> dict:
    results = {}
    for case in job["cases"]:
        start = time.monotonic()
        results[case["name"]] = _check_case(case)
        results[case["name"]]["seconds"] = time.monotonic() - start
    return results


if __name__ == "__main__":
    from autopar.verify.worker import main

    main(sys.argv[1:], work=_check_cases)
