"""Megatron-Bridge 0.6.2's own code on exported ``overrides.txt`` files, in a process of its own
(``tests/unit/exports/test_bridge_runs.py`` runs this).

    python bridge_recipe_run.py CASES.json DIR...

``DIR...``: the unpacked megatron-bridge and megatron-core wheels and Bridge's dependencies
(``scripts/fetch_frameworks.py``), put first on ``sys.path``. ``CASES.json``: ``[{"name",
"recipe", "overrides", "world_size"}]``. Each case runs what ``scripts/training/run_recipe.py``
runs before training: the recipe from ``megatron.bridge.recipes`` (the Hugging Face configs it
reads from the cache the test points ``HF_HUB_CACHE`` at, offline), the overrides through
``process_config_with_overrides`` (Hydra's parser, then Bridge's ``_apply_overrides``), the
sequence-length sync, then ``pretrain``'s first step, ``runtime_config_update`` (environment,
mixed precision, data-parallel size, communication overlap, ``ConfigContainer.validate``: each
section's ``finalize`` and Megatron-Core's ``__post_init__`` checks) on the plan's
``WORLD_SIZE``, and ``initialize``'s micro-batch calculator. Prints one JSON line per case: what
Bridge derived, or the error it refused the overrides with.

What this machine cannot answer as the plan's cluster would is stood in for, each named here and
where it is made:

* ``typing.override`` (Python 3.12's; Megatron-Core's model builders import it and this
  interpreter may be 3.11) is typing_extensions'.
* ``transformer_engine`` (not installed without CUDA): ``megatron/bridge/peft/lora_layers.py``
  imports it unguarded, and ``import megatron.bridge`` reaches that module through its model
  bridges' LoRA support; nothing on the recipe-and-overrides path calls LoRA. A stand-in
  module is in ``sys.modules`` only while that one module executes (every other guarded import
  of Transformer Engine, Megatron-Core's included, finds it absent, as here); its attributes
  raise, but for ``pytorch.ops.Sequential``, which that module's annotations name, a class that
  raises when made. The run fails if the stand-in is left anywhere else.
* Transformer Engine's version, which Megatron-Core's config checks ask
  (``megatron.core.utils.get_te_version``): answered as 2.14.0, the newest minimum any check of
  Megatron-Core 0.19.2 or Bridge 0.6.2 asks, so as any TE at least that new answers.
* Transformer Engine's fused RoPE, whose presence ``TransformerConfig.__post_init__`` checks
  under the recipes' ``apply_rope_fusion`` (``rope_utils.fused_apply_rotary_pos_emb``): a
  function that raises if called (nothing here calls it).
* whether Transformer Engine is installed, which ``CommOverlapConfig.setup`` asks before it
  keeps a TP communication overlap (``training/comm_overlap.py:HAVE_TE``, read at its import):
  answered yes, as the cluster's Transformer Engine does; its user buffers are made at launch,
  after what runs here.
* the weight-gradient accumulation fusion, which each model provider's
  ``gradient_accumulation_fusion`` asks for when it is made
  (``megatron/bridge/utils/fusions.py:can_enable_gradient_accumulation_fusion``: does
  ``transformer_engine.pytorch``, else APEX's ``fused_weight_gradient_mlp_cuda``, import?). The
  cluster's Transformer Engine answers yes; here an empty ``fused_weight_gradient_mlp_cuda``
  module answers it, put in ``sys.modules`` after every module is imported (Megatron-Core's own
  probe of it at import answered no, as here), and never called: its kernels run in the backward
  pass only.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import sys
import types
import typing
import warnings

from megatron_validate_run import _plain  # this folder: the driver's own, first on sys.path

TE_VERSION = "2.14.0"
LORA = "megatron.bridge.peft.lora_layers"


class _Absent(types.ModuleType):
    """A Transformer Engine module whose every attribute raises: nothing may use it."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        raise RuntimeError(f"{self.__name__}.{name}: the transformer_engine stand-in was used")


class _AnnotationOnly:
    """``transformer_engine.pytorch.ops.Sequential`` as lora_layers' annotations name it."""

    def __init__(self, *_: object, **__: object) -> None:
        raise RuntimeError("the transformer_engine stand-in was called")


def _transformer_engine() -> dict[str, types.ModuleType]:
    te, pytorch = _Absent("transformer_engine"), _Absent("transformer_engine.pytorch")
    te.__path__, pytorch.__path__ = [], []
    pytorch.ops = types.SimpleNamespace(Sequential=_AnnotationOnly)
    te.pytorch = pytorch
    return {"transformer_engine": te, "transformer_engine.pytorch": pytorch}


STAND_INS: list[types.ModuleType] = []


class _LoraLayersFinder(importlib.abc.MetaPathFinder):
    """Finds ``megatron.bridge.peft.lora_layers`` as Python would, and runs its module code
    with the Transformer Engine stand-in in ``sys.modules`` (the stand-in named in the
    docstring), taken out again when it is done."""

    def find_spec(self, name, path, target=None):
        if name != LORA:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        real = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, s):
                return real.create_module(s)

            def exec_module(self, module):
                stand_in = _transformer_engine()
                if set(stand_in) & set(sys.modules):
                    raise RuntimeError("transformer_engine is imported already")
                STAND_INS.extend(stand_in.values())
                sys.modules.update(stand_in)
                try:
                    real.exec_module(module)
                finally:
                    for key in stand_in:
                        sys.modules.pop(key, None)

        spec.loader = Loader()
        return spec


def _stand_in_holders() -> list[str]:
    """Modules other than lora_layers that hold the Transformer Engine stand-in."""
    out = []
    for name, module in list(sys.modules.items()):
        if name == LORA or module is None:
            continue
        values = getattr(module, "__dict__", {}).values()
        if any(any(v is s for s in STAND_INS) for v in values):
            out.append(name)
    return out


def _layers(model) -> list[list[int]]:
    """Transformer layers each pipeline rank builds in each of its model chunks, as
    Megatron-Core's ``get_num_layers_to_build`` (or the layout it was given) places them."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp, vp = model.pipeline_model_parallel_size, model.virtual_pipeline_model_parallel_size
    if model.pipeline_model_parallel_layout is not None:
        layout = model.pipeline_model_parallel_layout.layout
        return [[chunk.count(LayerType.decoder) for chunk in rank] for rank in layout]
    return [[get_num_layers_to_build(model, vp_stage=v if vp else None, pp_rank=r)
             for v in range(vp or 1)] for r in range(pp)]


MODEL = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
         "virtual_pipeline_model_parallel_size", "context_parallel_size",
         "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
         "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
         "num_query_groups", "kv_channels", "qk_layernorm", "add_qkv_bias", "add_bias_linear",
         "gated_linear_unit", "normalization", "layernorm_zero_centered_gamma",
         "position_embedding_type", "rotary_base",
         "layernorm_epsilon", "share_embeddings_and_output_weights", "num_moe_experts",
         "moe_ffn_hidden_size", "moe_router_topk", "moe_shared_expert_intermediate_size",
         "moe_layer_freq", "moe_expert_capacity_factor", "mtp_num_layers",
         "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
         "qk_pos_emb_head_dim", "v_head_dim", "recompute_granularity", "recompute_method",
         "recompute_num_layers", "recompute_modules", "params_dtype", "pipeline_dtype", "fp16",
         "bf16", "fp8", "fp8_recipe", "fp8_param", "first_last_layers_bf16", "tp_comm_overlap",
         "seq_length")
DDP = ("use_distributed_optimizer", "use_megatron_fsdp", "data_parallel_sharding_strategy",
       "grad_reduce_in_fp32")
OPTIMIZER = ("optimizer", "use_distributed_optimizer", "optimizer_cpu_offload",
             "optimizer_offload_fraction", "use_precision_aware_optimizer", "main_grads_dtype",
             "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype", "initial_loss_scale",
             "loss_scale_window", "hysteresis")


def _resolve(cfg, key: str) -> object:
    """The value at a dotted override key (``model.num_layers``) of the config container."""
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _named(value: object) -> object:
    """A value for the test: a function (an activation) by its name, else ``_plain``."""
    return value.__name__ if callable(value) and hasattr(value, "__name__") else _plain(value)


def _derived(cfg) -> dict[str, object]:
    """What Bridge derived, section by section."""
    from megatron.core import num_microbatches_calculator as nmc

    model = cfg.model
    out = {f"model.{k}": _plain(getattr(model, k, None)) for k in MODEL}
    out["model.activation_func"] = _named(model.activation_func)
    out.update({f"ddp.{k}": _plain(getattr(cfg.ddp, k)) for k in DDP})
    out.update({f"optimizer.{k}": _plain(getattr(cfg.optimizer, k)) for k in OPTIMIZER})
    out.update({"data_parallel_size": cfg.data_parallel_size,
                "train.micro_batch_size": cfg.train.micro_batch_size,
                "train.global_batch_size": cfg.train.global_batch_size,
                "dataset.seq_length": cfg.dataset.seq_length,
                "checkpoint.ckpt_format": cfg.checkpoint.ckpt_format,
                "dist.use_megatron_fsdp": cfg.dist.use_megatron_fsdp,
                "comm_overlap.tp_comm_overlap": getattr(cfg.comm_overlap, "tp_comm_overlap",
                                                        None),
                "CUDA_DEVICE_MAX_CONNECTIONS": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
                "layers": _layers(model)})
    # initialize_megatron's first step (training/initialize.py), before torch.distributed
    nmc.init_num_microbatches_calculator(0, cfg.train.rampup_batch_size,
                                         cfg.train.global_batch_size,
                                         cfg.train.micro_batch_size, cfg.data_parallel_size,
                                         cfg.train.decrease_batch_size_if_needed)
    try:
        out["num_microbatches"] = nmc.get_num_microbatches()
    finally:
        nmc.destroy_num_microbatches_calculator()
    return out


def main() -> None:
    cases, dirs = json.loads(open(sys.argv[1]).read()), sys.argv[2:]
    sys.path[:0] = dirs
    import typing_extensions

    if not hasattr(typing, "override"):
        typing.override = typing_extensions.override  # the stand-in named in the docstring
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    sys.meta_path.insert(0, _LoraLayersFinder())
    import megatron.bridge.recipes as recipes
    import megatron.bridge.training.comm_overlap as comm_overlap
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    import megatron.core.utils as core_utils
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides
    from packaging.version import Version

    if "transformer_engine" in sys.modules or _stand_in_holders():
        raise RuntimeError(f"the transformer_engine stand-in reached {_stand_in_holders()}")
    core_utils._te_version = Version(TE_VERSION)  # the stand-ins named in the docstring

    def fused_rope_stand_in(*_: object, **__: object) -> None:
        raise RuntimeError("Transformer Engine's fused RoPE stand-in was called")

    rope_utils.fused_apply_rotary_pos_emb = fused_rope_stand_in
    comm_overlap.HAVE_TE = True
    sys.modules["fused_weight_gradient_mlp_cuda"] = types.ModuleType(
        "fused_weight_gradient_mlp_cuda")

    environment = dict(os.environ)
    for case in cases:
        os.environ.clear()  # each case as a fresh launch: the recipe's variables set anew
        os.environ.update(environment)
        result: dict[str, object] = {"name": case["name"]}
        try:
            config = getattr(recipes, case["recipe"])()
            config = process_config_with_overrides(config, cli_overrides=case["overrides"])
            if config.model.seq_length != config.dataset.seq_length:  # run_recipe.py's sync
                config.model.seq_length = config.dataset.seq_length
            os.environ.update(WORLD_SIZE=str(case["world_size"]), RANK="0", LOCAL_RANK="0")
            runtime_config_update(config)
            result["derived"] = _derived(config)
            # every key the overrides set, as the config holds it after the runtime update
            result["overridden"] = {key: _named(_resolve(config, key)) for key in
                                    (o.partition("=")[0] for o in case["overrides"])}
        except Exception as err:  # noqa: BLE001 -- Bridge's verdict, reported to the test
            result["refused"] = f"{type(err).__name__}: {err}"
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
