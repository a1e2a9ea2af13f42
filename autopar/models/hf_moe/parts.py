"""Recognising a transformers MoE decoder by its layout (``mismatch``).

The layout is ``hf_llama``'s (``model.embed_tokens``, ``model.layers``, ``model.norm``,
``model.rotary_emb``, ``lm_head``; each block ``self_attn`` with separate q/k/v/o projections,
``mlp`` and two pre-norms) with the MLP of some blocks a *sparse MoE block*: ``mlp.gate``, a
top-k router holding a ``weight`` (E, h) and ``top_k``, and ``mlp.experts``, transformers'
stacked-weights experts -- ``gate_up_proj`` (E, 2I, h) and ``down_proj`` (E, h, I), gate and up
concatenated, not transposed, no bias, called ``experts(hidden, top_k_index, top_k_weights)``
-- and optionally a dense ``shared_expert`` MLP with its sigmoid ``shared_expert_gate``
(Qwen2-MoE). Other blocks may be dense (Qwen2-MoE's ``mlp_only_layers``, ``decoder_sparse_step``).
"""

from __future__ import annotations

from torch import nn

from autopar.models.hf_llama.parts import BLOCK_CHILDREN, root_mismatch, submodule

ATTENTION_LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                     "self_attn.o_proj")
DENSE_LINEARS = ("gate_proj", "up_proj", "down_proj")
SPARSE_CHILDREN = frozenset({"gate", "experts"})
SHARED_CHILDREN = frozenset({"shared_expert", "shared_expert_gate"})
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")
"""The experts' stacked parameters, (E, 2I, h) and (E, h, I)."""

_LAYOUT_FLAGS = {"is_transposed": False, "has_bias": False, "has_gate": True,
                 "is_concatenated": True, "has_post_expert_norm": False}
"""transformers' ``use_experts_implementation`` flags of the one stacked layout handled."""


def is_sparse(mlp: nn.Module) -> bool:
    """Whether a block's ``mlp`` is a sparse MoE block (it has a router ``gate`` and
    ``experts``)."""
    return submodule(mlp, "gate") is not None and submodule(mlp, "experts") is not None


def sparse_blocks(module: nn.Module) -> list[nn.Module]:
    """Every sparse MoE block under ``module``, in module order."""
    return [m for m in module.modules()
            if isinstance(getattr(m, "experts", None), nn.Module) and is_sparse(m)
            and _experts_mismatch(m) is None]


def mismatch(model: nn.Module) -> str | None:
    """``None`` for a transformers MoE decoder of the layout above, else why not."""
    why = root_mismatch(model)
    if why is not None:
        return why
    sparse = 0
    for i, block in enumerate(model.get_submodule("model.layers")):
        where = f"its block model.layers.{i}"
        lacking = [p for p in ATTENTION_LINEARS
                   if not isinstance(submodule(block, p), nn.Linear)]
        if lacking:
            return f"{where} has no linear {', '.join(lacking)}"
        children = {name for name, _ in block.named_children()}
        if children != BLOCK_CHILDREN:
            return (f"{where} holds {', '.join(sorted(children))}, not "
                    f"{', '.join(sorted(BLOCK_CHILDREN))}")
        mlp = block.get_submodule("mlp")
        if not is_sparse(mlp):
            if any(not isinstance(submodule(mlp, p), nn.Linear) for p in DENSE_LINEARS):
                return f"{where}.mlp is neither a gated MLP nor a sparse MoE block"
            continue
        why = _experts_mismatch(mlp)
        if why is not None:
            return f"{where}.mlp {why}"
        sparse += 1
    if not sparse:
        return "it has no sparse MoE block (a dense model is hf-llama's)"
    return None


def _experts_mismatch(mlp: nn.Module) -> str | None:
    children = {name for name, _ in mlp.named_children()}
    extra = children - SPARSE_CHILDREN - SHARED_CHILDREN
    if extra:
        return f"holds {', '.join(sorted(extra))} beside its router and experts"
    if SHARED_CHILDREN & children and not SHARED_CHILDREN <= children:
        return "has a shared expert without its gate (or a gate without it)"
    shared = submodule(mlp, "shared_expert")
    if shared is not None and any(not isinstance(submodule(shared, p), nn.Linear)
                                  for p in DENSE_LINEARS):
        return "has a shared expert that is not a gated MLP"
    gate, experts = mlp.get_submodule("gate"), mlp.get_submodule("experts")
    weight = getattr(gate, "weight", None)
    top_k = getattr(gate, "top_k", None)
    if not isinstance(weight, nn.Parameter) or weight.dim() != 2 or not isinstance(top_k, int):
        return "has a router without a (experts, hidden) weight and a top_k"
    e, h = weight.shape
    stacked = [getattr(experts, n, None) for n in EXPERT_WEIGHTS]
    if not all(isinstance(p, nn.Parameter) and p.dim() == 3 for p in stacked):
        return ("has experts without stacked gate_up_proj (E, 2I, h) and down_proj (E, h, I) "
                "(a list of expert MLPs is another layout)")
    gate_up, down = stacked
    i = down.shape[2]
    if tuple(gate_up.shape) != (e, 2 * i, h) or tuple(down.shape) != (e, h, i):
        return (f"has experts of shapes {tuple(gate_up.shape)} and {tuple(down.shape)}, not "
                f"(E, 2I, h) and (E, h, I) for its router's E={e}, h={h}")
    odd = [f"{k}={getattr(experts, k)}" for k, want in _LAYOUT_FLAGS.items()
           if getattr(experts, k, want) != want]
    if odd:
        return f"has experts of another stacked layout ({', '.join(odd)})"
    if not callable(getattr(experts, "act_fn", None)):
        return "has experts without an act_fn"
    return None
