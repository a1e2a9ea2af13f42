"""``autopar.analysis.tracing.trace``: methods, shapes, FLOPs against closed forms, blocks, errors."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autopar.models as zoo
from autopar import AutoparError, TrainSpec
from autopar.analysis.graph import GraphIR, TensorMeta
from autopar.analysis.tracing import DEFAULT_SEQ_LEN, normalise_module_path, resolve_seq_len, trace
from autopar.analysis.ops import CANONICAL_OPS, OP_NAMES, forward_flop
from autopar.analysis.ops.naming import unmapped_ops

MATMUL_OPS = ("linear", "matmul", "bmm", "baddbmm", "sdpa", "einsum", "grouped_mm")


# ------------------------------------------------------------------ small local models


class _Attn(nn.Module):
    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.qkv, self.proj, self.heads = nn.Linear(h, 3 * h), nn.Linear(h, h), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, s, h))


class _Block(nn.Module):
    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(h), _Attn(h, heads), nn.LayerNorm(h)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _TinyLM(nn.Module):
    """The zoo's conventions with explicit matmul attention, a tied head and a loss."""

    def __init__(self, vocab: int = 64, h: int = 32, heads: int = 4, layers: int = 3) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList(_Block(h, heads) for _ in range(layers))
        self.norm_f = nn.LayerNorm(h)
        self.head = nn.Linear(h, vocab, bias=False)
        self.head.weight = self.tok_emb.weight

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tok_emb(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class _DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # the line the error must name
            return self.fc(x)
        return x


class _ItemLoop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(int(x.max().item())):  # the line the error must name
            x = self.fc(x)
        return x


class _WhereMoE(nn.Module):
    """A hand-written mixture of experts: each expert's rows found with ``torch.where``."""

    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(8, 4, bias=False)
        self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(0, 1)
        weights, chosen = torch.topk(self.router(flat).softmax(-1), 2, dim=-1)
        out = torch.zeros_like(flat)
        for i, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == i)  # the line the error must name
            out = out.index_add(0, rows, weights[rows, slot, None] * expert(flat[rows]))
        return out.view_as(x)


class _SharedWhereMoE(_WhereMoE):
    """The same with a shared expert beside the routed ones: not a recognised layer."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + self.shared(x)


class _Wrapper(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.layers = nn.ModuleList([nn.Identity(), inner])

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x)
        return x.mean()


def _line_of(cls: type, marker: str) -> int:
    lines, start = inspect.getsourcelines(cls)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def _check_graph(g: GraphIR, model: nn.Module) -> None:
    """Invariants every trace keeps."""
    names = {n.name for n in g.nodes}
    assert len(names) == len(g.nodes)
    seen: set[str] = set()
    for n in g.nodes:
        assert set(n.inputs) <= seen, f"{n.name} reads a node that is not listed before it"
        seen.add(n.name)
        assert set(n.params) <= set(g.params), n.params
        if n.op == "view":
            assert n.fwd_bytes == 0
    assert g.num_params == sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------ fx path


def test_local_model_traces_with_fx_and_matmul_attention_flops() -> None:
    model = _TinyLM()
    b, s, h, vocab = 2, 16, 32, 64
    g = trace(model, batch=b, seq_len=s)
    _check_graph(g, model)
    assert g.method == "fx" and (g.batch, g.seq_len) == (b, s)
    assert g.blocks is not None and g.blocks.instances == ("layers.0", "layers.1", "layers.2")
    assert g.blocks.module_type == "_Block" and g.blocks.uniform
    block = [n for n in g.block_nodes(1) if n.op in MATMUL_OPS]
    assert sum(n.fwd_flop for n in block) == 24 * b * s * h * h + 4 * b * s * s * h
    assert [n.op for n in block] == ["linear", "matmul", "matmul", "linear", "linear", "linear"]
    head = g.node("head")
    assert head.fwd_flop == 2 * b * s * h * vocab and head.params == ("tok_emb.weight",)
    assert "head.weight" not in g.params
    assert g.outside_nodes()[-1].op == "cross_entropy"
    qkv = g.node("layers_0_attn_qkv")
    assert qkv.op == "linear" and qkv.module_path == "layers.0.attn.qkv" and qkv.block == 0
    assert qkv.inputs == ("layers_0_ln1",) and qkv.out == TensorMeta((b, s, 3 * h), torch.float32)
    assert qkv.params == ("layers.0.attn.qkv.weight", "layers.0.attn.qkv.bias")
    assert qkv.param_bytes == (3 * h * h + 3 * h) * 4
    assert qkv.fwd_bytes == 4 * (b * s * h + 3 * h * h + 3 * h + b * s * 3 * h)
    softmax = next(n for n in g.block_nodes(0) if n.op == "softmax")
    assert softmax.out is not None and softmax.out.shape == (b, 4, s, s)
    assert any(n.op == "layer_norm" and n.params for n in g.block_nodes(2))


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-llama", "tiny-moe"])
def test_zoo_tiny_models_trace_with_fx(name: str) -> None:
    model = zoo.build(name, device="meta")
    g = trace(model)
    _check_graph(g, model)
    assert g.method == "fx"
    assert g.seq_len == model.config.seq_len  # from the config
    assert g.blocks is not None and g.blocks.path == "layers" and g.blocks.count == 2
    assert g.blocks.uniform
    assert g.nodes[-1].op == "cross_entropy"
    assert not {"linear"} - {n.op for n in g.block_nodes(0)}
    assert g.fwd_flop > 0


def test_zoo_tiny_model_with_real_weights_traces_on_fake_tensors() -> None:
    model = zoo.build("tiny-gpt", device="cpu")
    g = trace(model, TrainSpec(global_batch=8, seq_len=16), batch=2)
    assert g.method == "fx" and g.seq_len == 16 and g.batch == 2
    assert next(p for p in model.parameters()).device.type == "cpu"
    assert model.training  # restored


def test_gpt_1_7b_meta_has_one_group_of_24_blocks() -> None:
    model = zoo.build("gpt-1.7b", device="meta")
    g = trace(model, seq_len=256)
    _check_graph(g, model)
    assert g.method == "fx"
    assert g.blocks is not None
    assert g.blocks.path == "layers" and g.blocks.module_type == "GPTBlock" and g.blocks.uniform
    assert g.blocks.instances == tuple(f"layers.{i}" for i in range(24))
    per_block = [len(g.block_nodes(i)) for i in range(24)]
    assert len(set(per_block)) == 1 and per_block[0] > 10
    assert {n.block for n in g.outside_nodes()} == {None}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_gpt_flops_match_megatron_closed_form(attention: str) -> None:
    # Narayanan et al. 2021, eq. 3 (forward = 1/3 of it): per layer 24 b s h^2 + 4 b s^2 h,
    # and the logit layer 2 b s h V.
    b, s, h, vocab = 2, 128, 256, 1000
    model = zoo.build("gpt", num_layers=3, hidden_size=h, num_heads=8, vocab_size=vocab,
                      seq_len=s, attention=attention, device="meta")
    g = trace(model, batch=b)
    for i in range(3):
        flops = sum(n.fwd_flop for n in g.block_nodes(i) if n.op in MATMUL_OPS)
        assert flops == 24 * b * s * h * h + 4 * b * s * s * h
    head = [n for n in g.outside_nodes() if n.op == "linear"]
    assert len(head) == 1 and head[0].fwd_flop == 2 * b * s * h * vocab
    assert head[0].params == ("tok_emb.weight",)  # tied: reported once, under the first name
    assert "head.weight" not in g.params
    assert g.num_params == sum(p.numel() for p in model.parameters())


def test_llama_gqa_attention_flops_count_query_heads() -> None:
    b, s = 1, 64
    model = zoo.build("tiny-llama", device="meta", seq_len=s)
    g = trace(model, batch=b)
    sdpa = [n for n in g.block_nodes(0) if n.op == "sdpa"]
    assert len(sdpa) == 1
    h = model.config.hidden_size
    assert sdpa[0].fwd_flop == 4 * b * s * s * h


def test_trace_without_targets_argument_ends_at_logits() -> None:
    class NoTargets(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.out = nn.Embedding(10, 8), nn.Linear(8, 10)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.out(self.emb(tokens))

    g = trace(NoTargets(), seq_len=5)
    assert [n.op for n in g.nodes] == ["embedding", "linear"] and g.blocks is None


# ------------------------------------------------------------------ export path


def _hf_models() -> dict[str, nn.Module]:
    transformers = pytest.importorskip("transformers")
    small = dict(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64)
    configs = {
        "llama": (transformers.LlamaConfig(intermediate_size=64, **small),
                  transformers.LlamaForCausalLM),
        "gpt2": (transformers.GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4,
                                         n_positions=64, bos_token_id=0, eos_token_id=0),
                 transformers.GPT2LMHeadModel),
        "mixtral": (transformers.MixtralConfig(intermediate_size=64, num_local_experts=4,
                                               num_experts_per_tok=2, **small),
                    transformers.MixtralForCausalLM),
    }
    models = {}
    for name, (config, cls) in configs.items():
        with torch.device("meta"):
            models[name] = cls(config)
    return models


@pytest.fixture(scope="module")
def hf_models() -> dict[str, nn.Module]:
    return _hf_models()


@pytest.mark.parametrize(
    ("name", "block_path", "block_type"),
    [("llama", "model.layers", "LlamaDecoderLayer"),
     ("gpt2", "transformer.h", "GPT2Block"),
     ("mixtral", "model.layers", "MixtralDecoderLayer")],
)
def test_transformers_models_trace_with_export(
    hf_models: dict[str, nn.Module], name: str, block_path: str, block_type: str
) -> None:
    model = hf_models[name]
    b, s = 2, 16
    g = trace(model, batch=b, seq_len=s)
    _check_graph(g, model)
    assert g.method == "export"
    assert g.blocks is not None and g.blocks.uniform
    assert g.blocks.path == block_path and g.blocks.module_type == block_type
    assert g.blocks.instances == (f"{block_path}.0", f"{block_path}.1")
    ops0 = [n.op for n in g.block_nodes(0)]
    assert ops0 == [n.op for n in g.block_nodes(1)]
    assert "sdpa" in ops0 and "linear" in ops0
    assert any(n.op == "cross_entropy" for n in g.outside_nodes())
    sdpa = next(n for n in g.block_nodes(0) if n.op == "sdpa")
    assert sdpa.fwd_flop == 4 * b * s * s * 32  # h = 32, counted over the query heads
    assert all(not p.startswith("p_") for n in g.nodes for p in n.params)
    assert any(n.module_path.startswith(f"{block_path}.0.") for n in g.block_nodes(0))


def test_transformers_gpt2_tied_head_and_conv1d_flops(hf_models: dict[str, nn.Module]) -> None:
    model = hf_models["gpt2"]
    b, s, h, vocab = 1, 16, 32, 128
    g = trace(model, batch=b, seq_len=s)
    block = [n for n in g.block_nodes(0) if n.op in MATMUL_OPS]
    assert sum(n.fwd_flop for n in block) == 24 * b * s * h * h + 4 * b * s * s * h
    head = next(n for n in g.outside_nodes() if n.op == "linear")
    assert head.params == ("transformer.wte.weight",) and head.fwd_flop == 2 * b * s * h * vocab


def test_transformers_mixtral_experts_are_grouped_matmuls(hf_models: dict[str, nn.Module]) -> None:
    model = hf_models["mixtral"]
    b, s, h, ffn, top_k = 1, 16, 32, 64, 2
    g = trace(model, batch=b, seq_len=s)
    experts = [n for n in g.block_nodes(0) if n.op == "grouped_mm"]
    assert [n.params for n in experts] == [("model.layers.0.mlp.experts.gate_up_proj",),
                                           ("model.layers.0.mlp.experts.down_proj",)]
    # every token runs top_k experts: gate+up (h -> 2 ffn) and down (ffn -> h)
    assert sum(n.fwd_flop for n in experts) == 2 * b * s * top_k * 3 * h * ffn
    assert any(n.op == "topk" for n in g.block_nodes(0))


def test_transformers_eager_experts_are_switched_to_a_static_path() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, experts_implementation="eager")
    with torch.device("meta"):
        model = transformers.MixtralForCausalLM(config)
    g = trace(model, seq_len=8)
    assert g.method == "export" and any(n.op == "grouped_mm" for n in g.nodes)
    assert model.get_experts_implementation() == {"": "eager"}  # restored


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("inner", "marker"),
    [(_DataDependent, "if x.sum() > 0:"), (_ItemLoop, "for _ in range(int(x.max().item())):")],
)
def test_untraceable_model_names_module_and_line(inner: type, marker: str) -> None:
    model = _Wrapper(inner()).to("meta")
    with pytest.raises(AutoparError) as info:
        trace(model, seq_len=4)
    err = info.value
    assert "layers.1" in err.where and inner.__name__ in err.where
    assert f"{__file__}:{_line_of(inner, marker)}" in err.where
    assert "control flow" in err.what and "torch.cond" in err.fix and "leaf" in err.fix


def test_data_dependent_shapes_name_the_module_and_line() -> None:
    """torch.export traces a ``torch.where`` expert loop (its row counts unbacked sizes), but
    nothing can size it without data: one clear error, not torch's guard traceback."""
    with pytest.raises(AutoparError) as info:
        trace(_Wrapper(_SharedWhereMoE()).to("meta"), seq_len=4)
    err = info.value
    assert "depend on its data" in err.what and "where" in err.what
    assert "layers.1" in err.where and "torch.where(chosen == i)" in err.where
    assert "capacity" in err.fix and "shared expert" in err.fix


def test_recognised_where_loop_traces_on_its_mean_rows() -> None:
    """The same loop with nothing beside its router and experts is a recognised mixture of
    experts (``models/generic/experts.py``): traced on a dropless layer's mean rows, its
    experts' weights named as expert parameters, and the model left as it was."""
    model = _Wrapper(_WhereMoE()).to("meta")
    g = trace(model, seq_len=4)
    _check_graph(g, model)
    assert g.expert_params == {f"layers.1.experts.{i}.{p}" for i in range(4)
                               for p in ("weight", "bias")}
    assert any(n.target.endswith("dropless_rows") for n in g.nodes)
    assert "forward" not in model.layers[1].__dict__


def test_not_a_module_is_a_clear_error() -> None:
    with pytest.raises(AutoparError, match="needs a torch.nn.Module"):
        trace(lambda tokens: tokens)  # type: ignore[arg-type]


def test_forward_without_token_input_is_a_clear_error() -> None:
    class KeywordOnly(nn.Module):
        def forward(self, *, x: torch.Tensor) -> torch.Tensor:
            return x

    class ExtraRequired(nn.Module):
        def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return tokens

    with pytest.raises(AutoparError, match="no positional argument"):
        trace(KeywordOnly())
    with pytest.raises(AutoparError, match="'mask' has no default"):
        trace(ExtraRequired())


# ------------------------------------------------------------------ ops table


def test_op_table_maps_fx_and_aten_spellings_to_one_name() -> None:
    same = {
        "linear": ["Linear", "linear", "addmm"],
        "sdpa": ["scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu"],
        "layer_norm": ["LayerNorm", "layer_norm", "native_layer_norm"],
        "softmax": ["Softmax", "softmax", "_softmax"],
        "dropout": ["Dropout", "dropout", "native_dropout"],
        "view": ["view", "reshape", "_unsafe_view", "transpose", "t", "alias", "getitem"],
        "matmul": ["matmul", "mm"],
        "contiguous": ["clone", "contiguous"],
    }
    for op, raws in same.items():
        assert {OP_NAMES[r] for r in raws} == {op}
    assert unmapped_ops(["linear", "frobnicate", "view"]) == ["frobnicate"]
    assert {"linear", "sdpa", "view", "cross_entropy", "rms_norm"} <= CANONICAL_OPS


def test_flop_formulas() -> None:
    f32 = torch.float32
    a, w = TensorMeta((2, 5, 7), f32), TensorMeta((11, 7), f32)
    assert forward_flop("linear", "linear", [a, w], [TensorMeta((2, 5, 11), f32)]) == 2 * 10 * 7 * 11
    bias, x, y = TensorMeta((11,), f32), TensorMeta((10, 7), f32), TensorMeta((7, 11), f32)
    assert forward_flop("linear", "addmm", [bias, x, y], [TensorMeta((10, 11), f32)]) == 2 * 770
    q, kv = TensorMeta((1, 8, 16, 4), f32), TensorMeta((1, 2, 32, 4), f32)
    assert forward_flop("sdpa", "sdpa", [q, kv, kv], [q]) == 4 * 8 * 16 * 32 * 4
    l, r = TensorMeta((3, 4, 5), f32), TensorMeta((3, 5, 6), f32)
    assert forward_flop("einsum", "einsum", [l, r], [TensorMeta((3, 4, 6), f32)],
                        ["bij,bjk->bik"]) == 2 * 3 * 4 * 5 * 6


def test_module_paths_are_normalised() -> None:
    assert normalise_module_path("L['self'].layers[3].attn") == "layers.3.attn"
    assert normalise_module_path("getattr(L['self'].layers, '3').mlp") == "layers.3.mlp"
    assert normalise_module_path("model.layers.0.self_attn") == "model.layers.0.self_attn"


def test_other_defaulted_arguments_are_fixed_and_mode_is_restored() -> None:
    class Defaults(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.out, self.drop = nn.Embedding(10, 8), nn.Linear(8, 10), nn.Dropout(0.1)

        def forward(self, idx: torch.Tensor, y: torch.Tensor | None = None,
                    mask: torch.Tensor | None = None, scale: float = 1.0) -> torch.Tensor:
            x = self.drop(self.emb(idx)) * scale
            if mask is not None:
                x = x * mask
            return F.cross_entropy(self.out(x).flatten(0, 1), y.flatten())

    model = Defaults().eval()
    g = trace(model, batch=3, seq_len=5)
    assert [n.op for n in g.nodes if n.op != "view"] == [
        "embedding", "dropout", "mul", "linear", "cross_entropy"]
    assert g.node("drop").scalar_args == (("p", 0.1),)
    assert not model.training


def test_default_sequence_length_stays_within_a_learned_position_table() -> None:
    """A model without a config is traced at ``DEFAULT_SEQ_LEN`` tokens, or at its position
    table's rows when it has fewer (a nanoGPT's ``wpe``); a given length is kept."""
    class Positions(nn.Module):
        def __init__(self, rows: int) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(16, 8), nn.Embedding(rows, 8)

    assert resolve_seq_len(Positions(32)) == 32
    assert resolve_seq_len(Positions(4 * DEFAULT_SEQ_LEN)) == DEFAULT_SEQ_LEN
    assert resolve_seq_len(Positions(32), seq_len=64) == 64
    assert resolve_seq_len(nn.Embedding(16, 8)) == DEFAULT_SEQ_LEN
