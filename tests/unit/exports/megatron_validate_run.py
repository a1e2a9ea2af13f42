"""Megatron-LM's own ``parse_args`` and ``validate_args`` on exported ``megatron_args.sh`` files,
in a process of their own (``tests/unit/exports/test_megatron_validate.py`` runs this).

    python megatron_validate_run.py MEGATRON_DIR CASES.json

``CASES.json``: ``[{"name", "script", "world_size", "capability"}]``. Each script is sourced by bash as its
README says; its ``MEGATRON_ARGS`` and the launch's required extras (mock data, the null
tokenizer, one iteration, a learning rate) are parsed by Megatron with the environment the
script sets and the plan's ``WORLD_SIZE`` (rank 0). Prints one JSON line per case: the
arguments Megatron derived, or the assertion it refused them with.

Two stand-ins, named: ``typing.override`` (Python 3.12's, which Megatron's model builders import;
this interpreter may be 3.11) is typing_extensions'; and there is no GPU, so the CUDA device
``validate_args`` asks for (``torch.cuda.get_device_capability`` and ``get_device_properties``:
its architecture) answers with the plan's GPU's compute capability, the case's
``capability`` (H100 9.0, A100 8.0).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
import warnings

EXTRAS = ["--mock-data", "--tokenizer-type", "NullTokenizer", "--train-iters", "1",
          "--lr", "1e-4"]
READ_BACK = ("world_size", "data_parallel_size", "tensor_model_parallel_size",
             "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
             "context_parallel_size", "expert_model_parallel_size",
             "expert_tensor_parallel_size", "micro_batch_size", "global_batch_size",
             "seq_length", "sequence_parallel", "use_distributed_optimizer",
             "use_megatron_fsdp", "data_parallel_sharding_strategy", "ckpt_format",
             "recompute_granularity", "recompute_method", "recompute_num_layers",
             "recompute_modules", "bf16", "fp16", "fp8", "fp8_recipe", "num_layers",
             "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
             "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "params_dtype",
             "main_grads_dtype", "grad_reduce_in_fp32", "accumulate_allreduce_grads_in_fp32",
             "optimizer", "pipeline_model_parallel_layout", "decoder_first_pipeline_num_layers",
             "decoder_last_pipeline_num_layers", "optimizer_cpu_offload",
             "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
             "qk_pos_emb_head_dim", "v_head_dim", "rope_type", "moe_layer_freq",
             "moe_shared_expert_intermediate_size")


def _sourced(script: str) -> tuple[dict[str, str | None], list[str]]:
    """The ``CUDA_DEVICE_MAX_CONNECTIONS`` the script leaves and its ``MEGATRON_ARGS``."""
    out = subprocess.run(
        ["bash", "-c", f'source "{script}"; echo "${{CUDA_DEVICE_MAX_CONNECTIONS-<unset>}}"; '
                       'printf "%s\\n" "${MEGATRON_ARGS[@]}"'],
        capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}).stdout
    first, *args = out.splitlines()
    return {"CUDA_DEVICE_MAX_CONNECTIONS": None if first == "<unset>" else first}, args


def _layers_per_rank(parsed) -> list[int] | None:
    """Transformer layers on each pipeline rank (all its virtual stages) as Megatron's
    ``PipelineParallelLayerLayout`` places them, where the arguments give a layout (the
    model's config builds one from the string the same way)."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout)

    if parsed.pipeline_model_parallel_layout is None:
        return None
    layout = PipelineParallelLayerLayout(parsed.pipeline_model_parallel_layout,
                                         parsed.pipeline_model_parallel_size).layout
    return [sum(chunk.count(LayerType.decoder) for chunk in rank) for rank in layout]


def _dests() -> dict[str, str]:
    """Each option string of Megatron's parser -> the argument it stores into."""
    import argparse

    from megatron.training.arguments import add_megatron_arguments

    parser = add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    return {flag: action.dest for action in parser._actions for flag in action.option_strings}


def _plain(value: object) -> object:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def main() -> None:
    megatron_dir, cases = sys.argv[1], json.loads(open(sys.argv[2]).read())
    sys.path.insert(0, megatron_dir)
    import typing_extensions

    if not hasattr(typing, "override"):
        typing.override = typing_extensions.override  # the stand-in named in the docstring
    warnings.filterwarnings("ignore")
    from megatron.training.arguments import parse_args, validate_args

    import torch
    from types import SimpleNamespace

    dests = _dests()
    for case in cases:
        major, minor = case["capability"]  # the stand-in GPU named in the docstring
        torch.cuda.get_device_capability = lambda *_, m=(major, minor): m
        torch.cuda.get_device_properties = \
            lambda *_, m=(major, minor): SimpleNamespace(major=m[0], minor=m[1])
        env, args = _sourced(case["script"])
        for key, value in env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        os.environ.update(WORLD_SIZE=str(case["world_size"]), RANK="0", LOCAL_RANK="0")
        sys.argv = ["pretrain_gpt.py", *args, *EXTRAS]
        result: dict[str, object] = {"name": case["name"]}
        try:
            parsed = parse_args()
            validate_args(parsed)
        except (AssertionError, ValueError, SystemExit) as err:
            result["refused"] = f"{type(err).__name__}: {err}"
        else:
            result["args"] = {k: _plain(getattr(parsed, k, None)) for k in READ_BACK}
            # each flag the export wrote, read from where Megatron keeps it
            result["flags"] = {f: _plain(getattr(parsed, dests[f], None)) if f in dests
                               else "<not an option>" for f in case.get("read", ())}
            result["layers_per_rank"] = _layers_per_rank(parsed)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
