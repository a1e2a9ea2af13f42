"""What newcomers to autopar were seen to try outside the zoo (issue 28), each held here: it
plans and runs, or it is refused before any process starts with one paragraph -- what, where,
what to do -- and exit status 2. Nothing here starts a process; the runs themselves are in
``tests/dist/test_newcomers_run.py``."""

from __future__ import annotations

import pytest

from autopar import AutoparError, ParallelConfig, TrainSpec
from autopar.analysis.admissibility import check, facts_of
from autopar.cli.main import main
from cli_refusal import refused as _refused
from autopar.core.model_spec import ModelSpec

TRAIN = TrainSpec(global_batch=4, seq_len=32, precision="fp32")




def test_virtual_stages_at_pp_1_are_refused_before_any_process_starts(capsys):
    # they used to cut the model into chunks of which the one rank ran the first only
    facts = facts_of(ModelSpec.zoo("tiny-llama").build("meta"))
    with pytest.raises(AutoparError, match="virtual_stages=2 with pp=1"):
        check(facts, ParallelConfig(schedule="interleaved", virtual_stages=2), TRAIN)
    _refused(["verify", "--model", "tiny-llama", "--model-arg", "vocab_size=64",
              "--virtual-stages", "2", "--steps", "2"], capsys,
             "virtual_stages=2 with pp=1", "use virtual_stages=1 at pp=1")


def test_a_virtual_stages_constraint_no_pipeline_admits_says_so_itself(capsys):
    _refused(["plan", "--model", "tiny-llama", "--cluster", "hgx-h100-80g", "--global-batch",
              "8", "--virtual-stages", "2"], capsys,
             "virtual_stages=2 needs pp >= 2 pipeline ranks with 2 model chunks each")


def _transformers(arch: str, **config) -> ModelSpec:
    return ModelSpec.transformers_config(arch, config)


TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256)


def test_ep_of_experts_no_family_describes_is_refused_up_front():
    # GPT-OSS keeps its experts as transposed, biased stacked weights, which no family splits:
    # planned and exported, ep failed inside the ranks ~50 s later
    model = _transformers("GptOssForCausalLM", **TINY, num_local_experts=4,
                          num_experts_per_tok=2, head_dim=16, sliding_window=16).build("meta")
    facts = facts_of(model)
    assert facts.num_experts == 4 and facts.experts_refused
    check(facts, ParallelConfig(dp=2), TRAIN)
    with pytest.raises(AutoparError, match="ep=2: the passes cannot split this model's experts"):
        check(facts, ParallelConfig(dp=2, ep=2), TRAIN)


def test_estimate_without_a_configuration_says_what_it_takes():
    import autopar

    model = ModelSpec.zoo("tiny-llama").build("meta")
    with pytest.raises(AutoparError, match="config must be a ParallelConfig, not NoneType") as e:
        autopar.estimate(model, "hgx-h100-80g", TRAIN, None)
    assert "autopar.optimize" in e.value.fix


@pytest.fixture
def llama_folder(tmp_path):
    import json

    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **TINY}))
    return folder


@pytest.mark.parametrize("arg,needles", [
    # transformers keeps an unknown key as an attribute: the 2-layer model was planned
    ("num_layers=4", ("has no field 'num_layers'", "did you mean num_hidden_layers")),
    ("num_hidden_layers=two", ("holds an int (2 in this config), not a str ('two')",)),
    ("num_attention_heads=5", ("hidden size (64) is not a multiple of the number of attention "
                               "heads (5)",)),
])
def test_a_transformers_config_override_transformers_would_ignore_or_refuse_is_one_paragraph(
        llama_folder, capsys, arg, needles):
    _refused(["plan", "--model", str(llama_folder), "--model-arg", arg, "--cluster",
              "hgx-h100-80g", "--global-batch", "8", "--seq-len", "32"], capsys, *needles)


def test_a_transformers_override_under_a_mapped_name_sets_the_configs_own_field(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_layer": 2,
         "n_head": 4, "vocab_size": 256, "n_positions": 64}))
    spec = ModelSpec.parse(str(tmp_path), {"num_hidden_layers": 3})
    assert spec.transformers["config"]["n_layer"] == 3
    assert len(spec.build("meta").transformer.h) == 3


def test_an_architecture_whose_code_is_on_the_hub_builds_as_transformers_maps_its_type():
    # InternLM3's config.json names InternLM3ForCausalLM (auto_map: remote code); transformers
    # maps model_type internlm3 to its own LlamaForCausalLM, as AutoModelForCausalLM builds it
    spec = _transformers("InternLM3ForCausalLM", model_type="internlm3", head_dim=16, **TINY)
    model = spec.build("meta")
    assert type(model).__name__ == "LlamaForCausalLM" and len(model.model.layers) == 2
    assert type(model.config).__name__ == "InternLM3Config"


def test_verify_of_a_plan_file_refuses_the_batch_flags_it_would_ignore(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert main(["plan", "--model", "tiny-llama", "--cluster", "hgx-h100-80g", "--global-batch",
                 "8", "--json", str(plan), "--no-explain"]) == 0
    capsys.readouterr()
    _refused(["verify", "--plan", str(plan), "--seq-len", "16"], capsys,
             "the plan fixes its batch (8 x 32 tokens", "--seq-len 16 would be ignored")


def test_a_per_head_norm_between_column_and_row_splits_runs_on_the_ranks_heads():
    # Qwen3's q_norm/k_norm normalise each head's features after q_proj's column split: the
    # solve keeps them on the width split, which the engine runs as WidthParallel (weights
    # whole, their gradient summed over tp); folded as "mixed" they refused every tp plan
    import autopar
    from autopar.core.layout import Style
    from autopar.costmodel.cluster import process_cluster

    spec = _transformers("Qwen3ForCausalLM", model_type="qwen3", head_dim=16, **TINY)
    plan = autopar.plan_for(spec.build("meta"), process_cluster(4), TRAIN,
                            ParallelConfig(dp=2, tp=2), model_spec=spec)
    styles = dict(plan.module_strategies)
    attn = "model.layers.*.self_attn"
    assert styles[f"{attn}.q_proj"] == Style.COLUMN and styles[f"{attn}.o_proj"] == Style.ROW
    assert styles[f"{attn}.q_norm"] == styles[f"{attn}.k_norm"] == Style.WIDTH


def test_a_path_that_names_no_model_says_what_is_wrong_with_it(tmp_path, capsys):
    # both used to say "unknown model ... use a preset"
    plan = ["plan", "--cluster", "hgx-h100-80g", "--global-batch", "8", "--model"]
    _refused([*plan, str(tmp_path / "missing") + "/"], capsys,
             "is neither a file nor a folder that exists")
    model = tmp_path / "mine.py"
    model.write_text("def helper(x):\n    return x\n\ndef make():\n    return None\n")
    _refused([*plan, str(model)], capsys, "names a file but not the function in it",
             "mine.py defines make, callable with no arguments", f"e.g. {model}:make")


def test_profiling_cuda_without_a_gpu_says_so_before_starting_processes(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    _refused(["profile", "--device", "cuda", "--quick", "--out", "/dev/null"], capsys,
             "the profile's 4 ranks on CUDA need a GPU each; this machine has no CUDA GPU")


def test_fusions_of_a_model_whose_final_norm_weight_is_its_own_parameter():
    # the generic description lists the root's norm_weight among the last stage's parts, which
    # the fusion pass walked as a module (found by the property run: every fused plan crashed)
    from autopar.verify import decoders as verify_decoders
    from autopar.passes.fuse import apply_fusions

    model = ModelSpec.parse(f"{verify_decoders.__file__}:make_llama").build("cpu")
    tokens = __import__("torch").randint(0, 256, (2, 16))
    before = model(tokens)
    counts = dict(apply_fusions(model, ("rms_norm", "swiglu"), tp=1))
    # its RMSNorm is the file's own class, which no family recognises: kept; both MLPs fused
    assert counts == {"rms_norm": 0, "swiglu": 2}
    __import__("torch").testing.assert_close(model(tokens), before, rtol=1e-5, atol=1e-5)


def test_tp_of_a_block_holding_its_own_q_k_v_projection_is_refused_up_front():
    # the block itself calls qkv and proj: no attention module whose code autopar rewrites for
    # a rank's shard (found by the property run: tp crashed in the ranks on the qkv split)
    import autopar
    from autopar.verify import decoders as verify_decoders
    from autopar.costmodel.cluster import process_cluster

    spec = ModelSpec.parse(f"{verify_decoders.__file__}:make_positions")
    with pytest.raises(AutoparError, match="qkv is split by columns, but it is the block's own"):
        autopar.plan_for(spec.build("meta"), process_cluster(2), TRAIN, ParallelConfig(tp=2),
                         model_spec=spec)
