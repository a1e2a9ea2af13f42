"""The cost model's saved activations per block agree with what the executed program keeps.

One block of a tiny model runs forward on CPU in fp32 under each checkpoint policy, as the
passes run it (``autopar.passes.checkpointing.run_block``), and the bytes it leaves alive for the
backward pass are counted. They are compared with ``costmodel.memory.saved_bytes`` of the
workload's block at the same micro-batch, sequence length and precision (fp32: 4 bytes).

What is counted: the distinct storages kept alive for the backward once the forward returns,
each storage once at its full size (q, k and v are views of one fused QKV output; a transposed
view of a GEMM input is the GEMM input), excluding the model's parameters and buffers (the
weights, the RoPE tables) and the block's output (the caller holds it, not the backward).
Two ways in which a storage is kept, both collected:

* ``torch.autograd.graph.saved_tensors_hooks``: what autograd saves -- everything under
  ``none``; under ``full`` and ``selective`` only the block input, which non-reentrant
  checkpointing saves from outside its region. Inside a checkpointed region the checkpoint's
  own hooks take precedence, so the outer hooks see nothing there.
* what the selective policy caches is held by the checkpoint, not by autograd's saved
  tensors, so the hooks never see it. A ``TorchDispatchMode`` records a weak reference to the
  storage of every op output during the forward; after the forward (and a garbage
  collection) the storages still alive are kept by someone, and apart from the block's output
  that can only be the backward (the saved tensors or the checkpoint's cache).

With fusions (``apply_fusions`` on the executed model, the kernels under Triton's interpreter on
CPU; the cost model's workload traced from the unfused model with the fusions named), the same
count for the fused block under every policy and for the layers after the blocks (final norm,
head and loss, eager or fused).

Not counted: the CPU RNG state that checkpointing keeps to replay dropout (5 KiB per block, a
few bytes of CUDA state on a GPU).
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import autopar
from autopar import TrainSpec
from autopar.costmodel.compute import Split
from autopar.costmodel.memory import saved_bytes
from autopar.core.specs import Checkpoint
from autopar.passes.checkpointing import run_block
from autopar.passes.fuse import LinearCrossEntropyHead, apply_fusions
from autopar.passes.model_parts import parts_of

B, S = 2, 32
FP32 = 4


class _LiveOutputs(TorchDispatchMode):
    """Weak references to the storage of every op output, by address (a later allocation at a
    freed address replaces the earlier one, which is dead by then)."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                self.storages[st.data_ptr()] = (StorageWeakRef(st), st.nbytes())
        return out


Run = Callable[[torch.Tensor], tuple[torch.Tensor, tuple[torch.Tensor, ...]]]
"""(input) -> (output, other tensors the caller holds: the targets)."""


def _kept(model: torch.nn.Module, run: Run) -> int:
    """Bytes the backward keeps after ``run`` on a fresh (B, S, hidden) input."""
    held = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def forward() -> tuple[torch.Tensor, tuple[torch.Tensor, ...], _LiveOutputs]:
        # a non-leaf input, as a block's input is, held here by nothing but the graph
        x = torch.randn(B, S, model.config.hidden_size, requires_grad=True) * 1.0
        outputs = _LiveOutputs()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), outputs:
            y, caller = run(x)
        return y, caller, outputs

    y, caller, outputs = forward()
    gc.collect()
    kept = dict(saved)
    kept.update({ptr: n for ptr, (ref, n) in outputs.storages.items() if not ref.expired()})
    skip = held | {t.untyped_storage().data_ptr() for t in (y, *caller)}
    return sum(n for ptr, n in kept.items() if ptr not in skip)


def kept_bytes(model: torch.nn.Module, policy: Checkpoint) -> int:
    """Bytes block 0 of ``model`` keeps for its backward after one forward under ``policy``."""
    parts = parts_of(model)

    def run(x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        return run_block(parts.call_block, model.layers[0], x, parts.block_args(model, x, S),
                         policy), ()

    return _kept(model, run)


def loss_kept_bytes(model: torch.nn.Module) -> int:
    """Bytes the layers after the blocks (final norm, head, loss) keep for the backward, the
    loss computed as ``ParallelProgram.loss`` does: eager, or by the fused head."""
    parts = parts_of(model)
    head = model.get_submodule(parts.head)

    def run(x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        targets = torch.randint(0, model.config.vocab_size, (B, S))
        out = parts.finish(model, x)
        if isinstance(head, LinearCrossEntropyHead):
            return head.loss(out, targets), (targets,)
        return F.cross_entropy(out.flatten(0, 1), targets.flatten(0, 1)), (targets,)

    return _kept(model, run)


def predicted_bytes(model: torch.nn.Module, policy: Checkpoint, fusions: tuple[str, ...] = (),
                    layer: str = "block") -> float:
    train = TrainSpec(global_batch=B, seq_len=S, precision="fp32")
    work = autopar.workload_of(model, train, fusions)
    split = Split(micro_batch=B, tp=1, cp=1, sequence_parallel=False, act_bytes=FP32,
                  compute_dtype="tf32")
    return saved_bytes(getattr(work, layer), split, policy)


def _model(name: str, **overrides: object) -> torch.nn.Module:
    torch.manual_seed(0)
    model = autopar.models.build(name, device="cpu", **overrides)
    model.init_weights()
    return model.train()


MODELS = {
    "tiny-llama": lambda: _model("tiny-llama"),
    "tiny-gpt": lambda: _model("tiny-gpt"),
    "tiny-gpt-eager": lambda: _model("tiny-gpt", attention="eager"),
    "tiny-gpt-eager-dropout": lambda: _model("tiny-gpt", attention="eager", dropout=0.1),
    "tiny-moe": lambda: _model("tiny-moe"),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("policy", [Checkpoint.MATMULS, Checkpoint.FULL])
def test_checkpointed_block_keeps_what_the_cost_model_charges(name: str,
                                                               policy: Checkpoint) -> None:
    # Exact: full keeps the block input; matmuls keeps it and the cached outputs of the
    # linear layers (aten.mm/addmm) and of fused attention (output and log-sum-exp), nothing
    # of the recomputed ops (norms, RoPE, activations, the eager attention core, the MoE
    # experts' bmm, dropout masks, which the replayed RNG state regenerates).
    model = MODELS[name]()
    assert kept_bytes(model, policy) == predicted_bytes(model, policy)


def test_matmuls_keeps_the_gemm_outputs_of_a_llama_block() -> None:
    # input x, q, k and v (GQA: k and v are half of q), attention output and lse, o_proj,
    # gate, up, down: (1 + 1 + 0.5 + 0.5 + 1 + 1 + 2 + 2 + 1) tokens x h, plus lse
    model = MODELS["tiny-llama"]()
    h, heads = model.config.hidden_size, model.config.num_heads
    expected = B * S * (10 * h + heads) * FP32
    assert kept_bytes(model, Checkpoint.MATMULS) == expected


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-gpt-eager"])
def test_unchecked_block_keeps_what_autograd_saves(name: str) -> None:
    # Exact: LayerNorm keeps its input with fp32 mean and rstd, as the cost model counts; with
    # dropout off, the eager attention's dropout is its input itself, stored once.
    model = MODELS[name]()
    assert kept_bytes(model, Checkpoint.NONE) == predicted_bytes(model, Checkpoint.NONE)


def test_unchecked_llama_block_gap_is_the_cpu_rms_norm() -> None:
    # On CPU, F.rms_norm runs as separate ops (pow, mean, rsqrt, mul, mul) and autograd also
    # keeps the normalised input x * rstd for the weight's gradient: one more token x h tensor
    # per norm, two per block. On CUDA it is the fused aten._fused_rms_norm, which keeps the
    # input and rstd only, as the cost model counts.
    model = MODELS["tiny-llama"]()
    cpu_only = 2 * B * S * model.config.hidden_size * FP32
    assert kept_bytes(model, Checkpoint.NONE) == predicted_bytes(model, Checkpoint.NONE) + cpu_only


def test_unchecked_dropout_gap_is_the_cpu_mask_dtype() -> None:
    # On CPU, dropout keeps its mask as a float tensor of the input's dtype (at::dropout's
    # unfused path); CUDA's fused native_dropout keeps a one-byte bool mask, as the cost model
    # counts. Three masks: the attention probabilities', the two residual branches'.
    model = MODELS["tiny-gpt-eager-dropout"]()
    h = model.config.hidden_size
    mask_elements = B * (model.config.num_heads * S * S + 2 * S * h)
    extra = mask_elements * (FP32 - 1)
    assert kept_bytes(model, Checkpoint.NONE) == predicted_bytes(model, Checkpoint.NONE) + extra


@pytest.mark.parametrize("name", ["tiny-gpt", "tiny-gpt-eager"])
def test_selective_block_keeps_what_the_cost_model_charges(name: str) -> None:
    # Exact: what none keeps but the eager attention core's scores and probabilities, which the
    # checkpointed core rebuilds from q, k and v; with fused attention, what none keeps.
    model = MODELS[name]()
    assert kept_bytes(model, Checkpoint.SELECTIVE) == predicted_bytes(model, Checkpoint.SELECTIVE)


def test_selective_drops_the_eager_core_of_a_gpt_block_and_nothing_else() -> None:
    # Korthikanti et al.'s 5*a*s^2*b term without dropout is the scores once: softmax keeps
    # its output (fp32 here); the masked scores are freed, the dropout is the identity.
    model = MODELS["tiny-gpt-eager"]()
    core = B * model.config.num_heads * S * S * FP32
    assert kept_bytes(model, Checkpoint.NONE) - kept_bytes(model, Checkpoint.SELECTIVE) == core
    fused = MODELS["tiny-gpt"]()
    assert kept_bytes(fused, Checkpoint.SELECTIVE) == kept_bytes(fused, Checkpoint.NONE)


def test_selective_drops_the_eager_core_with_dropout_mask_and_output() -> None:
    # With dropout on: softmax's output, the dropout's mask (a float one on CPU, see
    # test_unchecked_dropout_gap_is_the_cpu_mask_dtype) and its output: 3 x a x s^2 x b
    # elements, the 5*a*s^2*b bytes of fp16 with a one-byte mask.
    model = MODELS["tiny-gpt-eager-dropout"]()
    core = 3 * B * model.config.num_heads * S * S * FP32
    assert kept_bytes(model, Checkpoint.NONE) - kept_bytes(model, Checkpoint.SELECTIVE) == core
    predicted = (predicted_bytes(model, Checkpoint.NONE)
                 - predicted_bytes(model, Checkpoint.SELECTIVE))
    assert predicted == B * model.config.num_heads * S * S * (2 * FP32 + 1)


# --- with the fused kernels (Triton's interpreter on CPU) ----------------------------------

FUSED = {
    "tiny-llama": ("rms_norm", "swiglu", "rope", "linear_cross_entropy"),
    "tiny-gpt": ("layer_norm", "gelu", "linear_cross_entropy"),
}


def _fused(name: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(the model as traced, the same model with its fusions applied, as executed)."""
    traced = MODELS[name]()
    executed = MODELS[name]()
    apply_fusions(executed, FUSED[name])
    return traced, executed


@pytest.mark.parametrize("name", sorted(FUSED))
@pytest.mark.parametrize("policy", [Checkpoint.NONE, Checkpoint.MATMULS, Checkpoint.FULL])
def test_fused_block_keeps_what_the_cost_model_charges(name: str, policy: Checkpoint) -> None:
    # Exact under every policy, on CPU too: the fused norms keep x alone (the kernels recompute
    # the statistics; the CPU gap of eager RMSNorm is gone), SwiGLU gate and up, RoPE nothing
    # but its tables (buffers), GELU its input; selective and full recompute the kernels.
    traced, executed = _fused(name)
    assert kept_bytes(executed, policy) == predicted_bytes(traced, policy, FUSED[name])


def test_fused_llama_block_keeps_less_than_eager_by_silu_and_the_norm_statistics() -> None:
    traced, executed = _fused("tiny-llama")
    c = traced.config
    dropped = B * S * (c.ffn_hidden_size * FP32 + 2 * FP32)  # silu(gate); two norms' rstd
    eager = predicted_bytes(traced, Checkpoint.NONE)
    assert kept_bytes(executed, Checkpoint.NONE) == eager - dropped


@pytest.mark.parametrize("name", sorted(FUSED))
def test_fused_loss_keeps_its_gradients_not_the_logits(name: str) -> None:
    # Exact: the final norm's input, then the fused loss's grad_hidden (tokens x hidden) and
    # grad_weight (vocab x hidden, whatever the micro-batch) instead of the logits.
    traced, executed = _fused(name)
    c = traced.config
    predicted = predicted_bytes(traced, Checkpoint.NONE, FUSED[name], layer="post")
    assert loss_kept_bytes(executed) == predicted
    assert predicted == (2 * B * S * c.hidden_size + c.vocab_size * c.hidden_size) * FP32


def test_eager_loss_keeps_the_fp32_log_probabilities() -> None:
    # Exact but for nll_loss's total_weight, a 4-byte scalar: LayerNorm's input, mean and
    # rstd, the head's input, log_softmax's output (tokens x vocab).
    model = MODELS["tiny-gpt"]()
    c = model.config
    predicted = predicted_bytes(model, Checkpoint.NONE, layer="post")
    assert loss_kept_bytes(model) == predicted + 4
    assert predicted == B * S * (2 * c.hidden_size + 2 + c.vocab_size) * FP32
