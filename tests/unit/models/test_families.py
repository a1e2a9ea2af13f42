"""The model-family registry (``autopar.models.family``): every family answers for its models,
a family defined anywhere is found once registered, and the passes and the search name no model
class (checked on their source with ``ast``)."""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch
from torch import nn

import autopar.models as models
from autopar.core.errors import AutoparError
from autopar.core.model_spec import ModelSpec
from autopar.models import Family, ModelParts, Preset, family_of
from autopar.passes.model_parts import parts_of

ROOT = Path(__file__).resolve().parents[3]
FAMILY_FOLDERS = sorted(p.parent for p in (ROOT / "autopar" / "models").glob("*/__init__.py"))
"""``autopar/models/<family>/``: the only place a model class may be named."""
CHECKED = [*sorted((ROOT / "passes").rglob("*.py")),
           *sorted((ROOT / "autopar" / "search").rglob("*.py"))]
"""The sources that must ask the registry instead."""


def _check_parts(model: nn.Module, parts: ModelParts) -> None:
    """Every path of ``parts`` is a module of ``model``, and the blocks are a ModuleList."""
    assert isinstance(model.get_submodule(parts.blocks), nn.ModuleList)
    for path in (*parts.first, *parts.last, *parts.shared, parts.head, parts.embedding):
        model.get_submodule(path)
    assert parts.head in parts.last and parts.embedding in parts.first


# --- the registry answers --------------------------------------------------------------------

def test_every_family_is_registered_by_its_folder() -> None:
    families = [importlib.import_module(f"autopar.models.{folder.name}").FAMILY
                for folder in FAMILY_FOLDERS]
    assert all(f in models.registered() for f in families)
    assert len({f.name for f in families}) == len(FAMILY_FOLDERS)  # one family per folder
    assert {"gpt", "hf-llama", "llama", "moe"} <= {f.name for f in families}
    assert {"gpt", "llama", "moe"} <= set(models.families())  # those build() makes
    assert "hf-llama" not in models.families()  # transformers builds it


def _smallest_preset(family: str) -> str:
    presets = models.family_named(family).presets
    return next((p.name for p in presets if p.tiny), presets[0].name)


@pytest.mark.parametrize("name", [_smallest_preset(f) for f in models.families()])
def test_every_zoo_family_answers_for_its_models(name: str) -> None:
    model = models.build(name)  # meta: shapes only
    family = family_of(model)
    assert family.name == models.PRESETS[name].family
    assert isinstance(model.config, family.config_class)
    assert parts_of(model) is family.parts
    _check_parts(model, family.parts)


def test_a_transformers_llama_is_of_the_hf_llama_family() -> None:
    pytest.importorskip("transformers")
    spec = ModelSpec.parse("hf-llama", {"num_hidden_layers": 3})  # the family's shorthand
    assert spec.transformers["architecture"] == "LlamaForCausalLM"
    model = spec.build("meta")
    assert type(model).__name__ == "LlamaForCausalLM"
    family = family_of(model)
    assert family.name == "hf-llama" and family.config_class is None
    _check_parts(model, family.parts)
    assert len(model.get_submodule(family.parts.blocks)) == 3
    norm = model.get_submodule("model.norm")
    assert family.rms_norm(norm) == (norm.weight, norm.variance_epsilon)
    assert family_of(models.build("tiny-llama")).rms_norm(norm) is None  # not the zoo's own


_HF_TINY = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "max_position_embeddings": 64, "pad_token_id": None,
            "bos_token_id": None, "eos_token_id": None}


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "MistralForCausalLM",
                                          "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                                          "GemmaForCausalLM"])
def test_transformers_decoders_of_llamas_layout_are_of_the_hf_llama_family(
        architecture: str) -> None:
    pytest.importorskip("transformers")
    model = ModelSpec.transformers_config(architecture, _HF_TINY).build("meta")
    family = family_of(model)
    assert family.name == "hf-llama"
    _check_parts(model, family.parts)


@pytest.mark.parametrize(("architecture", "fields", "reason"), [
    ("Gemma2ForCausalLM", {}, "soft-caps the logits"),
    ("Gemma2ForCausalLM", {"final_logit_softcapping": None}, "pre_feedforward_layernorm"),
    ("GraniteForCausalLM", {"logits_scaling": 8.0}, "divides the logits"),
    ("GraniteForCausalLM", {"embedding_multiplier": 12.0}, "scales the embeddings"),
])
def test_transformers_decoders_of_another_layout_are_generic_with_hf_llamas_reason(
        architecture: str, fields: dict, reason: str) -> None:
    """hf-llama's stage calls lm_head(norm(x)) and embed_tokens(tokens): a model that scales
    or caps around them is not its, and the generic family reads it off its forward."""
    pytest.importorskip("transformers")
    from autopar.models.hf_llama.parts import mismatch

    model = ModelSpec.transformers_config(architecture, {**_HF_TINY, **fields}).build("meta")
    assert reason in (mismatch(model) or "")
    assert family_of(model).name == "generic"


@pytest.mark.parametrize(("architecture", "fields"), [
    ("MixtralForCausalLM", {"num_local_experts": 4}),
    ("Qwen2MoeForCausalLM", {"num_experts": 4, "moe_intermediate_size": 32,
                             "shared_expert_intermediate_size": 32}),
    ("Qwen3MoeForCausalLM", {"num_experts": 4, "moe_intermediate_size": 32}),
])
def test_transformers_moe_decoders_are_not_hf_llamas_but_hf_moes(
        architecture: str, fields: dict) -> None:
    pytest.importorskip("transformers")
    from autopar.models.family import family_named

    model = ModelSpec.transformers_config(architecture, {**_HF_TINY, **fields}).build("meta")
    assert "no linear mlp.gate_proj" in family_named("hf-llama").why_not(model)
    family = family_of(model)
    assert family.name == "hf-moe"
    _check_parts(model, family.parts)


def test_a_model_of_no_family_is_refused_with_each_familys_reason() -> None:
    with pytest.raises(AutoparError) as err:
        family_of(nn.Linear(2, 2))
    assert "gpt: not a GPT" in err.value.what and "hf-llama: it has no model.embed_tokens" \
        in err.value.what
    with pytest.raises(AutoparError, match="do not know how to split a Linear"):
        parts_of(nn.Linear(2, 2))


# --- a new family is its own code only -------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class _ToyConfig:
    family: ClassVar[str] = "toy"
    width: int
    vocab_size: int = 16
    num_layers: int = 2


class _Toy(nn.Module):
    """Embedding, a stack of linear blocks, a head: the layout ``_TOY_PARTS`` describes."""

    def __init__(self, config: _ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.emb = nn.Embedding(config.vocab_size, config.width)
        self.stack = nn.ModuleList(nn.Linear(config.width, config.width)
                                   for _ in range(config.num_layers))
        self.out = nn.Linear(config.width, config.vocab_size, bias=False)

    def init_weights(self) -> None:
        for m in self.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()


_TOY_PARTS = ModelParts(blocks="stack", first=("emb",), last=("out",), head="out",
                        embedding="emb", embed=lambda root, tokens: root.emb(tokens),
                        finish=lambda root, x: root.out(x))


def test_a_family_registered_here_is_found_built_and_listed() -> None:
    toy = Family(name="toy", parts=_TOY_PARTS, config_class=_ToyConfig, model_class=_Toy,
                 presets=(Preset("toy-8", "toy", {"width": 8}, "a toy for this test"),))
    assert "toy" not in models.families()
    models.register(toy)
    try:
        model = models.build("toy-8")
        assert family_of(model) is toy and parts_of(model) is _TOY_PARTS
        assert models.build("toy", width=4).stack[0].weight.shape == (4, 4)
        assert "toy" in models.families() and "toy-8" in models.names()
        assert ModelSpec.of(model) == ModelSpec("toy-8")  # a preset's own shape, named so
        with torch.no_grad():  # the stage's calling convention is the family's
            x = _TOY_PARTS.embed(models.build("toy-8", device="cpu"), torch.tensor([[1, 2]]))
        assert x.shape == (1, 2, 8)
        with pytest.raises(AutoparError, match="registered already"):
            models.register(Family(name="toy", parts=_TOY_PARTS, model_class=_Toy))
    finally:
        models.unregister("toy")
    assert "toy-8" not in models.names() and "toy" not in models.families()
    with pytest.raises(AutoparError, match="no model family describes a _Toy"):
        family_of(_Toy(_ToyConfig(width=4)))


def test_a_family_recognised_by_its_layout_needs_no_class() -> None:
    def mismatch(model: nn.Module) -> str | None:
        return None if hasattr(model, "stack") and hasattr(model, "out") else "no stack, out"

    layout = models.register(Family(name="zz-layout", parts=_TOY_PARTS, mismatch=mismatch))
    try:
        assert family_of(_Toy(_ToyConfig(width=4))) is layout
        assert family_of(models.build("tiny-gpt")).name == "gpt"
    finally:
        models.unregister("zz-layout")


def test_a_family_must_say_how_it_recognises_and_builds_its_models() -> None:
    with pytest.raises(AutoparError, match="neither"):
        Family(name="x", parts=_TOY_PARTS)
    with pytest.raises(AutoparError, match="model_class, which is missing"):
        Family(name="toy", parts=_TOY_PARTS, mismatch=lambda m: None, config_class=_ToyConfig)
    with pytest.raises(AutoparError, match="family is not 'x'"):
        Family(name="x", parts=_TOY_PARTS, config_class=_ToyConfig, model_class=_Toy)
    with pytest.raises(AutoparError, match="is family 'gpt'"):  # a preset name taken
        models.register(Family(name="toy", parts=_TOY_PARTS, config_class=_ToyConfig,
                               model_class=_Toy, presets=(Preset("tiny-gpt", "toy", {}),)))
    assert "toy" not in models.families()


# --- the passes and the search name no model class -------------------------------------------

def _zoo_names() -> tuple[set[str], set[str]]:
    """(every class defined in a family folder, every class name a family matches as a string:
    transformers' ``LlamaForCausalLM``, ``SiLUActivation``, the ``RMSNorm`` suffix)."""
    classes: set[str] = set()
    strings: set[str] = set()
    for folder in FAMILY_FOLDERS:
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    classes.add(node.name)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and re.fullmatch(r"[A-Z][a-z]+[A-Z]\w*|[A-Z]{2,}[a-z]\w*", node.value):
                    strings.add(node.value)
    return classes, strings


def _named(node: ast.AST) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def _class_name_uses(tree: ast.AST, classes: set[str], strings: set[str]) -> list[str]:
    """``isinstance``/``issubclass`` against a zoo class or an import of one (torch's own
    classes, ``nn.RMSNorm``, are not the zoo's), a zoo class name as a string, and any
    comparison or prefix/suffix test of a ``__name__``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _named(node.func) in ("isinstance", "issubclass") \
                and len(node.args) == 2:
            kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            found += [f"isinstance(..., {_named(k)})" for k in kinds if _named(k) in classes
                      and not (isinstance(k, ast.Attribute) and _named(k.value) in ("nn", "torch"))]
        elif isinstance(node, ast.ImportFrom):
            found += [f"import {a.name}" for a in node.names if a.name in classes]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value in classes | strings:
            found.append(repr(node.value))
        elif isinstance(node, ast.Compare) and any(
                isinstance(n, ast.Attribute) and n.attr == "__name__"
                for n in (node.left, *node.comparators)):
            found.append("a comparison of __name__")
        elif isinstance(node, ast.Call) and _named(node.func) in ("startswith", "endswith") \
                and isinstance(node.func, ast.Attribute) \
                and _named(node.func.value) == "__name__":
            found.append(f"__name__.{node.func.attr}(...)")
    return found


def test_the_check_sees_the_class_names_it_forbids() -> None:
    classes, strings = _zoo_names()
    assert {"GPT", "Llama", "DecoderLM", "MoETransformer", "MoELayer"} <= classes
    assert {"LlamaForCausalLM", "SiLUActivation", "RMSNorm"} <= strings
    old = """
from autopar.models.gpt import GPT
def parts_of(model):
    if isinstance(model, (nn.RMSNorm, GPT)):
        return 1
    if type(model).__name__.endswith("RMSNorm") or type(model).__name__ == "SiLUActivation":
        return 2
"""
    assert sorted(_class_name_uses(ast.parse(old), classes, strings)) == sorted([
        "import GPT", "isinstance(..., GPT)", "__name__.endswith(...)",
        "a comparison of __name__", "'RMSNorm'", "'SiLUActivation'"])


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_passes_and_search_ask_the_registry_instead_of_naming_classes(path: Path) -> None:
    found = _class_name_uses(ast.parse(path.read_text()), *_zoo_names())
    assert not found, f"{path.relative_to(ROOT)}: {', '.join(found)}"
