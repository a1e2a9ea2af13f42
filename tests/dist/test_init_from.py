"""``train.py --init-from DIR``: weights read from a checkpoint, each rank reading its slices.

* A transformers folder (``save_pretrained`` of a tiny ``LlamaForCausalLM``, written as several
  safetensors shards with ``model.safetensors.index.json``) under tp2 x pp2 with sequence
  parallelism gives the first loss of the one-process model ``from_pretrained`` loads.
* A DCP checkpoint ``train.py`` saved on one rank initialises a pp2 run of a GPT whose tied
  embedding and head sit on different pipeline stages: its first loss is the one-process
  reference's after that one step, on the first batch.
* A zoo model's ``state_dict`` saved with ``safetensors.torch.save_file`` loads (one process).
* A folder that is no checkpoint, or one that does not fit the model, is an ``AutoparError``
  naming what differs; ``train.py`` stops with exit status 2.

The ranks are started directly, with the environment torchrun would give them (the exported
``launch.sh`` runs in ``test_export.py`` and ``test_sharded_init.py``), and runs are judged by
the JSON log they write, not by exit statuses alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
from launching import free_port, losses_of

import autopar
from autopar import AutoparError, ParallelConfig, TrainSpec
from autopar.costmodel.cluster import process_cluster
from autopar.models.hf_llama import HF_LLAMA_TINY
from autopar.passes.materialize import check_checkpoint
from autopar.models.feed import logits_of
from autopar.models.training import ModelSpec, synthetic_batch
from autopar.verify.run import reference

TRAIN = TrainSpec(global_batch=8, seq_len=32, precision="fp32")
LOSS_REL = 1e-5
"""fp32; the bound ``test_export.py`` uses. The runs reduce in another order than the one
process (micro-batch means averaged, the vocabulary-parallel loss): measured, the first loss
differed by 8.6e-8 relative from ``from_pretrained``'s (safetensors, tp2 x pp2) and by 0 from
the reference's (DCP). Weights read wrongly move it more: one weight's two row halves swapped
(what a shard read by the wrong rank does) moved the first loss of these tiny models by 1.3e-5
(layer 1's q_proj) to 5e-3 (the embedding) relative."""


def _run(folder: Path, nproc: int, *args: str) -> tuple[list[int], str]:
    """``train.py ARGS`` as ``nproc`` ranks started directly (the environment torchrun sets,
    without its start-up); their exit statuses and output, for failure messages."""
    env = dict(os.environ, WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(folder / "train.py"), *args],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(nproc)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    return [p.returncode for p in procs], "\n".join(o[-3000:] for o in outputs)


def _plan(spec: ModelSpec, config: ParallelConfig):
    return autopar.plan_for(spec.build("meta"), process_cluster(config.world_size), TRAIN,
                            config, model_spec=spec)


def _first_loss(model: torch.nn.Module, seed: int = 0) -> float:
    """The loss of the global batch of step 1 (batch 0), in one forward."""
    vocab = model.config.vocab_size
    tokens, targets = synthetic_batch(0, TRAIN.global_batch, TRAIN.seq_len, vocab, seed)
    with torch.no_grad():
        logits = logits_of(model, tokens)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).item()


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny transformers Llama with transformers' own init, saved in three shards."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("hf-llama")
    torch.manual_seed(1)
    LlamaForCausalLM(LlamaConfig(**HF_LLAMA_TINY)).save_pretrained(folder,
                                                                    max_shard_size="200KB")
    return folder


def test_transformers_shards_under_tp2_pp2_give_the_from_pretrained_first_loss(hf_folder,
                                                                              tmp_path):
    from transformers import LlamaForCausalLM

    assert (hf_folder / "model.safetensors.index.json").exists()  # the sharded layout
    assert len(list(hf_folder.glob("*.safetensors"))) > 1
    spec = ModelSpec.parse(str(hf_folder))
    plan = _plan(spec, ParallelConfig(tp=2, pp=2, sequence_parallel=True, micro_batch=1))
    log = tmp_path / "log.jsonl"
    start = time.monotonic()
    _, output = _run(plan.export(tmp_path / "run"), 4, "--init-from", str(hf_folder),
                     "--steps", "1", "--log-file", str(log))
    print(f"tp2 x pp2 from safetensors: {time.monotonic() - start:.1f} s")
    losses = losses_of(log)
    assert sorted(losses) == [1], output
    expected = _first_loss(LlamaForCausalLM.from_pretrained(hf_folder))
    drawn = _first_loss(spec.build("cpu", 0))  # what --seed alone would have given
    print(f"first loss {losses[1]!r}, from_pretrained {expected!r}, "
          f"relative difference {abs(losses[1] - expected) / expected:.1e}")
    assert losses[1] == pytest.approx(expected, rel=LOSS_REL)
    assert abs(drawn - expected) > 100 * LOSS_REL * expected  # the weights came from the folder


def test_dcp_checkpoint_of_one_rank_initialises_pp2_with_the_tie_across_stages(tmp_path):
    spec = ModelSpec("tiny-gpt")  # the head is tok_emb.weight; under pp2 on another stage
    saving = _plan(spec, ParallelConfig(micro_batch=2))
    loading = _plan(spec, ParallelConfig(pp=2, micro_batch=1))
    ckpt = tmp_path / "ckpt"
    _, out_save = _run(saving.export(tmp_path / "one"), 1, "--steps", "1", "--save-every",
                       "1", "--checkpoint-dir", str(ckpt), "--log-file", str(tmp_path / "a"))
    assert (ckpt / "step-1" / ".metadata").exists(), out_save
    log = tmp_path / "b.jsonl"
    _, output = _run(loading.export(tmp_path / "pp2"), 2, "--init-from", str(ckpt / "step-1"),
                     "--steps", "1", "--log-file", str(log))
    losses = losses_of(log)
    assert sorted(losses) == [1], output
    model = spec.build("cpu", 0)  # the reference's weights after the saved step
    model.load_state_dict(reference(spec, saving, steps=1, seed=0).params)
    expected = _first_loss(model)
    print(f"first loss {losses[1]!r}, reference {expected!r}, "
          f"relative difference {abs(losses[1] - expected) / expected:.1e}")
    assert losses[1] == pytest.approx(expected, rel=LOSS_REL)


def test_zoo_safetensors_load_and_a_folder_of_no_checkpoint_exits_2(tmp_path):
    spec = ModelSpec("tiny-llama")
    folder = _plan(spec, ParallelConfig(micro_batch=2)).export(tmp_path / "one")
    saved = spec.build("cpu", 5)
    (tmp_path / "zoo").mkdir()
    safetensors.torch.save_file(saved.state_dict(), tmp_path / "zoo" / "model.safetensors")
    log = tmp_path / "log.jsonl"
    codes, output = _run(folder, 1, "--init-from", str(tmp_path / "zoo"), "--steps", "1",
                         "--log-file", str(log))
    assert codes == [0], output
    assert losses_of(log)[1] == pytest.approx(_first_loss(saved), rel=LOSS_REL)

    (tmp_path / "empty").mkdir()
    codes, output = _run(folder, 1, "--init-from", str(tmp_path / "empty"), "--steps", "1")
    assert codes == [2], output
    assert "holds neither a DCP checkpoint (.metadata) nor safetensors files" in output
    assert "Where: --init-from" in output


def test_a_checkpoint_that_does_not_fit_names_what_differs(tmp_path):
    model = ModelSpec("tiny-llama").build("meta")
    state = ModelSpec("tiny-llama").build("cpu", 0).state_dict()
    state.pop("layers.1.mlp.up_proj.weight")
    state["tok_emb.weight"] = state["tok_emb.weight"][:128]
    state["layers.0.extra"] = torch.zeros(2)
    safetensors.torch.save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(AutoparError) as err:
        check_checkpoint(model, tmp_path)
    assert "missing layers.1.mlp.up_proj.weight" in err.value.what
    assert "not in the model layers.0.extra" in err.value.what
    assert "of another shape tok_emb.weight (128, 64) (the model's (256, 64))" in err.value.what
    with pytest.raises(AutoparError, match="is not a folder"):
        check_checkpoint(model, tmp_path / "gone")
    step = tmp_path / "ckpt" / "step-3"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"")
    with pytest.raises(AutoparError, match="holds the checkpoints step-3: pass one of them"):
        check_checkpoint(model, tmp_path / "ckpt")
    with pytest.raises(AutoparError, match="cannot read the checkpoint"):
        check_checkpoint(model, step)  # an empty .metadata


def test_a_tied_head_is_read_under_the_embeddings_name(tmp_path):
    """A transformers checkpoint of tied embeddings holds no lm_head.weight; GPT's head reads
    tok_emb.weight the same way."""
    state = {k: v for k, v in ModelSpec("tiny-gpt").build("cpu", 0).state_dict().items()
             if k != "head.weight"}
    safetensors.torch.save_file(state, tmp_path / "model.safetensors")
    _, prefix, key_of = check_checkpoint(ModelSpec("tiny-gpt").build("meta"), tmp_path)
    assert prefix == "" and key_of["head.weight"] == "tok_emb.weight"
