"""Whether a configuration can run for a model: the one admissibility check.

``problems(facts, config, train)`` lists, with what to do, every reason a ``ParallelConfig``
cannot run for the model ``facts`` describes; ``check`` raises the first. Every entry point
calls it before anything starts: ``autopar.estimate``, ``plan_for`` and ``optimize`` (whose
search space enumerates candidates and keeps only those it admits, so the search never returns
a plan it refuses), and, through ``check_plan``, ``verify``, ``export`` and ``parallelize``,
which add the engine's own limits (``autopar.passes.mesh.check_executable``).

The rules, each with the reason the program could not run otherwise:

* **heads**: tp divides the attention heads and the key/value heads; a column split of q, k
  and v hands each rank whole heads (and ``view(b, s, -1, head_dim)`` needs them).
* **tensor parallelism**: the model's family can split it (``Family.tensor_parallel``: the
  generic decoder family, fused projections and GPT-2's ``Conv1D`` cannot); a model of no family
  is not split either.
* **stages**: 1 <= pp <= blocks; under the interleaved schedule pp x virtual_stages chunks of at
  least one block each, and virtual stages only with pp > 1 (the schedule interleaves chunks
  over pipeline ranks); a model without repeated blocks has one stage.
* **micro-batches**: dp x micro_batch divides the global batch (``ParallelConfig.
  microbatches``); torch.distributed.pipelining's ``Schedule1F1B`` needs at least one
  micro-batch per stage; ``ScheduleInterleaved1F1B`` needs the micro-batches to be a multiple
  of its rounds, ``max(1, m // pp)``.
* **sequence**: the sequence fits the model's positions (a learned position table or RoPE
  table has that many rows); under sequence parallelism tp divides the sequence (the engine's
  ``SequenceParallel`` shards it evenly, and so does Megatron-LM, which asserts it); context
  parallelism splits it into 2 x cp load-balanced chunks and needs fused attention.
* **checkpointing**: the ``moe`` policy checkpoints the MoE layers the model's family gives as
  modules (``ExpertLayer.module``), so it needs a model with such layers (``moe_problem``).
* **experts**: ep divides the experts (and ep x etp the ranks the experts' mesh folds over,
  ``ParallelConfig``); ep > 1 needs experts, in layers the model's family describes
  (``Family.expert_layers``), since the passes split those layers only. Under sequence
  parallelism with tp > 1 the MoE layers run on each tp rank's own tokens (the fold), which
  needs a family that gives the MoE module and routes over a split call (``fold_problem``); a
  mixture of experts under cp needs the latter too. etp > 1 needs a family that says how to
  split an expert (``etp_problem``).

``check_plan`` adds what a solved plan decides: its stages hold the model's blocks, every
module it names exists in the model (a plan made for another model fails here), and every
weight it splits is a layer the engine's styles apply to (an ``nn.Linear`` split by rows or
columns, an ``nn.Embedding`` by vocabulary rows) whose split dimension tp divides. The strategy
search offers only such splits (``splittable``), so plans it makes pass.

Where a user would expect a case to work, the planner plans around it rather than refusing:
a sequence tp does not divide is planned without sequence parallelism, a vocabulary or width tp
does not divide keeps that layer whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from autopar.core.stages import ENDS_AS_CHUNKS
from autopar.core.errors import AutoparError
from autopar.core.layout import ENGINE_STYLES, SPLITS, Style, splittable
from autopar.core.specs import Checkpoint, ParallelConfig, Schedule, TrainSpec

if TYPE_CHECKING:
    from autopar.core.plan import Plan


@dataclass(frozen=True)
class ModelFacts:
    """What the check needs to know of a model (``facts_of``); ``None``: unknown, unchecked."""

    num_blocks: int
    """Repeated blocks (transformer layers); 0 when the model has none."""
    num_heads: int | None = None
    num_kv_heads: int | None = None
    num_experts: int | None = None
    """Experts per MoE layer; ``None`` for a dense model."""
    vocab_size: int | None = None
    max_positions: int | None = None
    """Longest sequence the model takes (``seq_len``, ``max_position_embeddings``)."""
    fused_attention: bool = True
    """The blocks' attention is a fused op, which context parallelism runs over the K/V
    gathered from the cp ranks (``passes/context_parallel.py``)."""
    attention_core_hook: bool = True
    """Some module of the model takes the ``selective`` policy's attention-core runner
    (``models.family.ATTENTION_CORE_HOOK``); without one an unfused attention core (as
    transformers' eager attention) runs whole under ``selective``, which the planner prices
    so (``search.planner.strategies_of``). True where only a traced graph is known."""
    context_attention: bool = True
    """The model's family gives its attention a context-parallel hook
    (``models.family.Family.context_attention``; ``passes/context_parallel.py``); False for a
    model no family describes."""
    context_refused: str | None = None
    """Why the passes cannot run this model's attention context-parallel although its family
    names hooked modules (``models.family.Family.context_problem``: a generic model's
    hand-written masked attention, positions its description cannot find); ``None``: they
    can, or only a traced graph is known."""
    token_routing: bool = False
    """Its experts' routers route every token on its own (``Family.token_routing``: dropless,
    no load-balancing loss in the loss), so context parallelism leaves the routing unchanged."""
    unsplittable: str | None = None
    """Why the execution passes cannot cut the model into pipeline stages (no registered
    family describes its embedding, blocks, final norm and head: ``models.family_of``; or
    other layers follow its repeated blocks in their container: ``models.blocks.BlockSpan``);
    ``None`` where they can, or where only a traced graph is known."""
    layers: Mapping[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    """Module name -> (``linear`` | ``embedding``, weight shape) of every layer a
    tensor-parallel style could split."""
    unsplittable_tp: str | None = None
    """Why the passes cannot split this model by tensor parallelism (its family's
    ``Family.tensor_parallel``, or no family describing it); ``None`` where they can, or where
    only a traced graph is known."""
    tensor_layout: Any = None
    """How the model's blocks split under tensor parallelism where its family reads that off
    its code (``Family.tensor_layout``: a generic decoder's ``ModelLayout``), whose
    ``problem(styles, tp)`` ``plan_problems`` asks; ``None``: the plan's styles apply as
    they are."""
    experts_refused: str | None = None
    """Why the passes cannot run this model's experts expert-parallel although it has experts
    (no family describes its mixture-of-experts layers: ``Family.expert_layers`` finds none);
    ``None``: they can, it has none, or only a traced graph is known."""
    split_calls: bool = False
    """Its MoE layers decide their capacity slots and load-balancing loss over a call whose
    tokens several ranks hold (``ExpertLayer.split_tokens``: the zoo's ``MoELayer``), so context
    parallelism and the experts' fold leave the routing as one process's."""
    fold_refused: str | None = None
    """Why the passes cannot run this model's MoE layers on each tp rank's own tokens (the
    experts' fold under sequence parallelism, ``ParallelConfig.experts_fold_tp``); ``None``:
    they can, it has none, or only a traced graph is known."""
    moe_modules_refused: str | None = None
    """Why the ``moe`` checkpoint policy cannot run this model's MoE layers although it has
    experts (its family gives no MoE module to checkpoint, ``ExpertLayer.module``); ``None``:
    it can, it has none, or only a traced graph is known."""
    etp_refused: str | None = None
    """Why the passes cannot split this model's experts over etp ranks (a family that does not
    say which dim of an expert's weights to split: ``ExpertLayer.etp_dims``); ``None``: they
    can, it has none, or only a traced graph is known."""
    expert_ffn: int | None = None
    """The experts' hidden width (the smallest over its MoE layers), which etp divides."""
    cross_stage_loss: str | None = None
    """Why the model's loss needs every block of a forward before its backward, so that it
    runs in one pipeline stage: transformers' load-balancing loss over all routers
    (``output_router_logits``, ``models/hf_moe/load_balancing.py``); ``None``: it does not."""


@dataclass(frozen=True)
class Problem:
    """One reason a configuration cannot run."""

    what: str
    where: str
    fix: str

    def error(self) -> AutoparError:
        return AutoparError(self.what, where=self.where, fix=self.fix)


def facts_of(model: object) -> ModelFacts:
    """The facts of ``model`` (an ``nn.Module``, built on any device, meta included) from its
    ``config`` and module tree: the blocks are the repeated-block group the tracer finds
    (``models.blocks.find_block_group``); ``fused_attention`` stays unknown (True) until the
    planner has traced the model."""
    from torch import nn

    from autopar.models.family import ATTENTION_CORE_HOOK
    from autopar.models.blocks import find_block_group
    from autopar.models.routing import router_loss_reason
    from autopar.models.shape import CONFIG_FIELDS, config_value, vocab_of

    config = getattr(model, "config", None)
    found = {key: config_value(config, key) for key in CONFIG_FIELDS}
    if found["num_experts"] is not None and found["num_experts"] < 2:
        found["num_experts"] = None
    if not isinstance(model, nn.Module):
        return ModelFacts(num_blocks=0, **found)
    group = find_block_group(model)
    found["vocab_size"] = vocab_of(model)
    (found["context_attention"], found["context_refused"], found["token_routing"],
     found["unsplittable"], found["unsplittable_tp"], layout) = _family_facts(model)
    found["unsplittable"] = found["unsplittable"] or _span_problem(model)
    if layout is not None and layout.heads is not None and found["num_heads"] is None:
        found["num_heads"], found["num_kv_heads"] = layout.heads
    expert_layers = _expert_layers(model)
    if found["num_experts"] is None and expert_layers:
        found["num_experts"] = expert_layers[0].num_experts
    if found["num_experts"] is not None and not expert_layers:
        found["experts_refused"] = _experts_refused(model)
    found["attention_core_hook"] = any(hasattr(m, ATTENTION_CORE_HOOK) for m in model.modules())
    found["cross_stage_loss"] = router_loss_reason(config)
    found["split_calls"] = bool(expert_layers) and all(
        layer.split_tokens is not None for layer in expert_layers)
    found["fold_refused"] = _fold_refused(expert_layers, found)
    if found["num_experts"] is not None and (
            not expert_layers or any(layer.module is None for layer in expert_layers)):
        found["moe_modules_refused"] = found.get("experts_refused") or _NO_MODULE
    if found["num_experts"] is not None and (
            not expert_layers or any(layer.etp_dims is None for layer in expert_layers)):
        found["etp_refused"] = found.get("experts_refused") or (
            "its family does not say which dim of an expert's weights to split "
            "(ExpertLayer.etp_dims: transformers' fused gate_up experts, a generic decoder's "
            "expert modules)")
    if expert_layers and all(layer.ffn_size for layer in expert_layers):
        found["expert_ffn"] = min(layer.ffn_size for layer in expert_layers)
    return ModelFacts(num_blocks=group.count if group is not None else 0,
                      layers=layers_of(model), tensor_layout=layout, **found)


def _span_problem(model: object) -> str | None:
    """Why pipeline stages cannot cut ``model``'s repeated blocks out of the container its
    family names (layers after them: ``models.blocks.BlockSpan.problem``); ``None`` where they
    can, or where no family describes it."""
    from autopar.models.blocks import block_span
    from autopar.models.family import family_of

    try:
        parts = family_of(model).parts_of(model)  # type: ignore[arg-type]
    except AutoparError:
        return None
    return block_span(model, parts.blocks).problem()  # type: ignore[arg-type]


def _expert_layers(model: object) -> list:
    """The model's mixture-of-experts layers as its family describes them
    (``Family.expert_layers``: the zoo's, transformers' stacked experts, a generic decoder's
    hand-written list); none for a dense model or a model no family describes."""
    from autopar.models.family import family_of

    try:
        return family_of(model).expert_layers(model)  # type: ignore[arg-type]
    except AutoparError:
        return []


_NO_MODULE = ("its family gives no MoE module taking the block's hidden states (a generic "
              "decoder's experts are read off its graph: models/generic/experts.py)")


def _fold_refused(expert_layers: list, found: dict) -> str | None:
    """Why the MoE layers ``expert_layers`` cannot run on each tp rank's own tokens."""
    if not expert_layers:
        return None
    if any(layer.module is None for layer in expert_layers):
        return _NO_MODULE + ", to run on a rank's sequence shard"
    if found["cross_stage_loss"] is not None:
        return found["cross_stage_loss"] + ", which the fold splits over the tp ranks"
    if not (found["token_routing"] or found["split_calls"]):
        return ("its routers decide over the tokens of a call (capacity, a load-balancing "
                "loss), and its family does not take the ranks holding them "
                "(ExpertLayer.split_tokens)")
    return None


def _experts_refused(model: object) -> str:
    """Why the experts of ``model``, whose config names them, cannot be split by ep."""
    from autopar.models.family import family_of

    try:
        family = family_of(model)  # type: ignore[arg-type]
    except AutoparError as err:
        return err.what
    return (f"its config names experts, but the {family.name} family finds no mixture-of-"
            "experts layer it can split in it (a router and stacked or listed experts of a "
            "layout autopar knows: models/*/ expert_layers)")


def _family_facts(model: object
                  ) -> tuple[bool, str | None, bool, str | None, str | None, Any]:
    """(whether the passes can run ``model`` context-parallel: its family names attention
    modules of it that take the hook; why they cannot although it does: the family's
    ``context_problem``; whether its routers route each token on its own: the family's
    ``token_routing``; why the passes cannot cut it into pipeline stages: ``None`` for a model
    of a registered family, else each family's reason; why they cannot split it by tensor
    parallelism: its family's ``tensor_parallel`` or the reason its ``tensor_layout`` gives, or
    the first reason for a model of no family; the layout its ``tensor_layout`` reads, or
    ``None``)."""
    from autopar.models.family import family_of

    try:
        family = family_of(model)  # type: ignore[arg-type]
    except AutoparError as err:
        return False, None, False, err.what, ("no model family describes where its attention "
                                              f"and MLP are ({err.what})"), None
    attention = any(family.context_attention(m)
                    for m in model.modules())  # type: ignore[attr-defined]
    refused = family.context_problem(model) if attention else None  # type: ignore[arg-type]
    tp_refused, layout = family.tensor_parallel, None
    if family.tensor_layout is not None:
        layout = family.tensor_layout(model)  # type: ignore[arg-type]
        if isinstance(layout, str):
            tp_refused, layout = layout, None
    return attention, refused, family.token_routing, None, tp_refused, layout



def layers_of(model: object) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Module name -> (``linear`` | ``embedding``, weight shape) of every ``nn.Linear`` and
    ``nn.Embedding`` of ``model``: the layers the engine's tensor-parallel styles split."""
    from torch import nn

    layers: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, module in model.named_modules():  # type: ignore[attr-defined]
        if isinstance(module, nn.Linear):
            layers[name] = ("linear", tuple(module.weight.shape))
        elif isinstance(module, nn.Embedding):
            layers[name] = ("embedding", tuple(module.weight.shape))
    return layers


# ----- the rules, one function each; ``problems`` runs them all -----
def heads_problem(facts: ModelFacts, tp: int) -> Problem | None:
    for heads, name in ((facts.num_heads, "attention heads"),
                        (facts.num_kv_heads, "key/value heads")):
        if tp > 1 and heads and heads % tp:
            return Problem(f"tp={tp} does not divide the {heads} {name}: a tensor-parallel "
                           "rank holds whole heads", "tp",
                           f"choose tp among the divisors of {heads}")
    return None


def tensor_parallel_problem(facts: ModelFacts, tp: int) -> Problem | None:
    if tp > 1 and facts.unsplittable_tp is not None:
        return Problem(f"tp={tp}: the passes cannot split this model by tensor parallelism "
                       f"({facts.unsplittable_tp})", "tp",
                       "use tp=1 for this model (dp, ZeRO, checkpointing and, where it has a "
                       "chain of blocks, pp run), or register a Family describing its layout "
                       "(a folder under autopar/models/)")
    return None


def stages_problem(facts: ModelFacts, pp: int, chunks: int) -> Problem | None:
    """``chunks``: model chunks (pp, or pp x virtual stages under the interleaved schedule)."""
    if pp == 1 and chunks > 1:
        return Problem(f"virtual_stages={chunks} with pp=1: the interleaved schedule deals "
                       "model chunks out to the pipeline ranks, and one rank has no other "
                       "rank to interleave with (its chunks would run one after another as "
                       "one stage)", "virtual_stages",
                       "use virtual_stages=1 at pp=1, or pp >= 2 with the interleaved schedule")
    if pp > 1 and facts.unsplittable is not None:
        return Problem(f"pp={pp}: the passes cannot cut this model into pipeline stages "
                       f"({facts.unsplittable})", "pp",
                       "use pp=1 for this model, or register a Family describing its layout "
                       "(a folder under autopar/models/)")
    if pp > 1 and facts.cross_stage_loss is not None:
        return Problem(f"pp={pp}: the model's loss spans every pipeline stage "
                       f"({facts.cross_stage_loss})", "pp",
                       "use pp=1 for this model (dp, ZeRO, tp, ep and checkpointing run), or "
                       "set output_router_logits to false (--model-arg "
                       "output_router_logits=false) to train on the cross-entropy alone")
    if pp > 1 and facts.num_blocks < 2:
        return Problem(f"pp={pp}: the model has {facts.num_blocks} repeated block(s) to cut "
                       "into pipeline stages", "pp", "use pp=1 for this model")
    # model chunks of the interleaved schedule may hold the embedding or the loss alone
    # (core.stages.chunk_sizes); a pipeline stage of the others holds a block at least
    most = max(facts.num_blocks, 1) + (ENDS_AS_CHUNKS if chunks > pp else 0)
    if chunks > most:
        what = (f"pp={pp}" if chunks == pp else f"pp={pp} x virtual_stages={chunks // pp} = "
                f"{chunks} model chunks")
        need = ("every stage needs a block" if chunks == pp else
                "every chunk needs a block, but the first may hold the embedding alone and "
                "the last the loss alone")
        return Problem(f"{what} for a model of {facts.num_blocks} blocks: {need}",
                       "pp" if chunks == pp else "virtual_stages",
                       f"use at most {most} {'stages' if chunks == pp else 'chunks'}")
    return None


def sequence_parallel_problem(seq_len: int, tp: int, cp: int = 1) -> Problem | None:
    """``seq_len``: the whole sequence; a cp rank's share of it (``seq_len / cp``) is what
    sequence parallelism splits."""
    held = seq_len // cp
    if tp > 1 and held % tp:
        share = f" (this cp rank's {held} of {seq_len})" if cp > 1 else ""
        return Problem(f"sequence parallelism over tp={tp} splits the sequence of {held} "
                       f"tokens{share} into equal shards, and {tp} does not divide {held}",
                       "sequence_parallel",
                       f"plan without sequence parallelism (the planner does so when it is "
                       f"free to), or use a sequence length that is a multiple of {tp * cp}")
    return None


def context_parallel_problem(facts: ModelFacts, seq_len: int, cp: int) -> Problem | None:
    if cp == 1:
        return None
    if seq_len % (2 * cp):
        return Problem(f"context parallelism over cp={cp} cuts the sequence into 2*cp = "
                       f"{2 * cp} load-balanced chunks, and {2 * cp} does not divide "
                       f"{seq_len}", "cp", f"use a sequence length that is a multiple of "
                       f"{2 * cp}, or another cp")
    if not facts.fused_attention:
        return Problem("context parallelism needs a fused attention op (scaled_dot_product_"
                       "attention) to attend over the K/V gathered from the cp ranks; this "
                       "model's attention is eager",
                       "cp", "use cp=1, or write the attention with "
                       "F.scaled_dot_product_attention")
    if not facts.context_attention:
        return Problem("the passes run context parallelism through a hook of the model "
                       "family's fused attention modules, and none of this model's takes one "
                       "(an eager attention, or a family without the hook: models.family."
                       "Family.context_attention)", "cp",
                       "use cp=1, or SDPA attention of a family with the hook")
    if facts.context_refused is not None:
        return Problem(f"cp={cp}: the passes cannot run this model context-parallel "
                       f"({facts.context_refused})", "cp",
                       "use cp=1 for this model, or change what the reason names (a FILE.py "
                       "model: its attention as causal F.scaled_dot_product_attention(q, k, v, "
                       "is_causal=True) with no mask, its positions as torch.arange(sequence "
                       "length))")
    if facts.num_experts and not (facts.token_routing or facts.split_calls):
        return Problem(f"cp={cp} with a mixture of experts: its routing capacity and its "
                       "load-balancing loss are computed over the tokens of a call, which "
                       "context parallelism splits over the cp ranks, and its family does not "
                       "take the ranks holding a call's tokens (ExpertLayer.split_tokens), so "
                       "the program would not compute the model's function", "cp",
                       "use cp=1 for this model")
    return None


def positions_problem(facts: ModelFacts, seq_len: int) -> Problem | None:
    if facts.max_positions is not None and seq_len > facts.max_positions:
        return Problem(f"the sequence of {seq_len} tokens is longer than the model's "
                       f"{facts.max_positions} positions", "seq_len",
                       f"use --seq-len {facts.max_positions} or less, or build the model for "
                       f"longer sequences (--model-arg seq_len=... or max_position_embeddings)")
    return None


def experts_problem(facts: ModelFacts, ep: int) -> Problem | None:
    if ep == 1:
        return None
    if not facts.num_experts:
        return Problem(f"ep={ep} for a model without experts", "ep", "use ep=1")
    if facts.experts_refused is not None:
        return Problem(f"ep={ep}: the passes cannot split this model's experts over expert-"
                       f"parallel ranks ({facts.experts_refused})", "ep",
                       "use ep=1 for this model (its experts then run whole on every rank: "
                       "dp, ZeRO and checkpointing split the rest), or register a Family "
                       "describing its MoE layers (a folder under autopar/models/)")
    if facts.num_experts % ep:
        return Problem(f"ep={ep} does not divide the {facts.num_experts} experts", "ep",
                       f"choose ep among the divisors of {facts.num_experts}")
    return None


def fold_problem(facts: ModelFacts, config: ParallelConfig) -> Problem | None:
    """Under sequence parallelism with tp > 1 the experts' mesh folds over the tp ranks
    (``ParallelConfig.experts_fold_tp``): every MoE layer runs on the rank's own tokens."""
    if not (config.experts_fold_tp and facts.num_experts and facts.fold_refused):
        return None
    return Problem(f"tp={config.tp} with sequence parallelism runs each MoE layer on the tp "
                   "rank's own tokens (the experts' mesh folded over the tp ranks), and the "
                   f"passes cannot run this model's so: {facts.fold_refused}",
                   "sequence_parallel",
                   "plan sequence_parallel=False (the tp ranks then run the experts whole on "
                   "the same tokens, ep carved from dp x cp)")


def etp_problem(facts: ModelFacts, config: ParallelConfig) -> Problem | None:
    """Expert tensor parallelism splits each expert's hidden width over etp ranks: the
    model's family says which dims (``ExpertLayer.etp_dims``), and etp divides the width."""
    if config.etp == 1 or not facts.num_experts:
        return None
    fix = "plan etp=1 (each expert whole on its ep rank)"
    if facts.etp_refused is not None:
        return Problem(f"etp={config.etp} splits each expert over {config.etp} ranks, and the "
                       f"passes cannot split this model's: {facts.etp_refused}", "etp", fix)
    if facts.expert_ffn is not None and facts.expert_ffn % config.etp:
        return Problem(f"etp={config.etp} does not divide the experts' hidden width "
                       f"{facts.expert_ffn}", "etp",
                       f"choose etp among the divisors of {facts.expert_ffn}, or {fix}")
    return None


def moe_problem(facts: ModelFacts, config: ParallelConfig) -> Problem | None:
    """The ``moe`` checkpoint policy runs each MoE layer's module under checkpoint
    (``passes/checkpointing.py``): the model needs MoE layers its family gives as modules."""
    policies = config.checkpoint if isinstance(config.checkpoint, tuple) else (config.checkpoint,)
    if Checkpoint.MOE not in policies:
        return None
    fix = ("use checkpoint='selective', 'matmuls' or 'full' (or 'none') for this model, or "
           "leave the policy to the search")
    if not facts.num_experts:
        return Problem("checkpoint='moe' recomputes the mixture-of-experts layers, and this "
                       "model has none", "checkpoint", fix)
    if facts.moe_modules_refused is not None:
        return Problem("checkpoint='moe' checkpoints each mixture-of-experts layer's module, and "
                       f"the passes cannot find this model's: {facts.moe_modules_refused}",
                       "checkpoint", fix)
    return None


def matmuls_runs(facts: ModelFacts, config: ParallelConfig) -> bool:
    """Whether the engine runs the ``matmuls`` policy for the model of ``facts`` in the layout
    of ``config``, whatever its policies (``matmuls_problem``)."""
    return (not facts.num_experts or not config.experts_fold_tp or config.pp == 1
            or config.schedule is Schedule.ONE_F_ONE_B)


def matmuls_problem(facts: ModelFacts, config: ParallelConfig) -> Problem | None:
    """The ``matmuls`` policy (a selective checkpoint, ``passes/checkpointing.py``) of a block
    holding mixture-of-experts layers under the experts' fold over tp, pipelined by the GPipe
    or the interleaved schedule: the experts are an FSDP unit of their own inside the block,
    and under those schedules (two micro-batches' forwards before a backward) the block's
    recomputation gathers their weights where its forward did not -- torch's selective
    checkpoint stops at the op it did not record ("aten.copy_.default encountered during
    backward but not found in storage"; ``autopar verify --model tiny-moe --tp 2 --pp 2
    --schedule gpipe --sequence-parallel --checkpoint matmuls``, 2026-11-29). 1F1B runs it."""
    policies = config.checkpoint if isinstance(config.checkpoint, tuple) else (config.checkpoint,)
    if Checkpoint.MATMULS not in policies or matmuls_runs(facts, config):
        return None
    return Problem(
        f"checkpoint='matmuls' with the {config.schedule.value} schedule and the experts' mesh "
        "folded over tp (sequence parallelism): the engine's recomputation of a block gathers "
        "its experts' weights where the forward did not, and torch's selective checkpoint "
        "refuses it", "checkpoint",
        "use schedule='1f1b', or checkpoint 'selective', 'moe' or 'full', or leave the policy "
        "to the search")


def batch_problem(global_batch: int, dp: int) -> Problem | None:
    """Each data-parallel replica reads an equal share of the global batch."""
    if global_batch % dp:
        return Problem(f"global batch {global_batch} is not a multiple of dp={dp}", "dp",
                       "choose dp among the divisors of the global batch")
    return None


def microbatch_problem(config: ParallelConfig, train: TrainSpec) -> Problem | None:
    try:
        m = config.microbatches(train)
    except AutoparError as err:
        return Problem(err.what, err.where, err.fix)
    if config.pp > 1 and config.schedule is Schedule.ONE_F_ONE_B and m < config.pp:
        return Problem(f"the 1F1B schedule of torch.distributed.pipelining needs at least one "
                       f"micro-batch per stage; the plan has {m} for {config.pp} stages",
                       "schedule", "use the gpipe schedule (the same memory and time with so "
                       "few micro-batches), or more micro-batches")
    rounds = max(1, m // config.pp)
    if config.pp > 1 and config.schedule is Schedule.INTERLEAVED and m % rounds:
        return Problem(f"torch.distributed.pipelining's interleaved 1F1B runs the {m} "
                       f"micro-batches in rounds of pp={config.pp} and needs them to be a "
                       f"multiple of its {rounds} rounds", "num_microbatches",
                       f"use a multiple of {config.pp} micro-batches")
    return None


def problems(facts: ModelFacts, config: ParallelConfig, train: TrainSpec) -> list[Problem]:
    """Every reason ``config`` cannot run for the model of ``facts`` on batch ``train``."""
    chunks = config.pp * (config.virtual_stages
                          if config.schedule is Schedule.INTERLEAVED else 1)
    found = [heads_problem(facts, config.tp), tensor_parallel_problem(facts, config.tp),
             stages_problem(facts, config.pp, chunks),
             microbatch_problem(config, train), positions_problem(facts, train.seq_len),
             experts_problem(facts, config.ep), fold_problem(facts, config),
             etp_problem(facts, config), moe_problem(facts, config),
             matmuls_problem(facts, config),
             context_parallel_problem(facts, train.seq_len, config.cp)]
    if config.sequence_parallel:
        found.append(sequence_parallel_problem(train.seq_len, config.tp, config.cp))
    return [p for p in found if p is not None]


def check(facts: ModelFacts, config: ParallelConfig, train: TrainSpec) -> None:
    """Raise the first of ``problems`` as an ``AutoparError``."""
    found = problems(facts, config, train)
    if found:
        raise found[0].error()


# ----- a solved plan's layers (the styles and splits: ``autopar.core.layout``) -----
@lru_cache(maxsize=4096)
def _pattern(pattern: str) -> re.Pattern[str]:
    """A module-strategy pattern (``layers.*.attn.qkv``: ``*`` a block index) as a regex."""
    return re.compile(re.escape(pattern).replace(r"\*", r"\d+"))


def _matches(pattern: str, name: str) -> bool:
    return _pattern(pattern).fullmatch(name) is not None


def _parent(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in name else ""


def layer_problems(facts: ModelFacts, module_strategies: tuple[tuple[str, str], ...],
                   tp: int) -> list[Problem]:
    """Modules the plan names that the model lacks, and layouts the engine cannot run: a
    style it has no parallel style for, a split of a layer it cannot split or that tp does not
    divide, and a column split inside a module (attention, MLP) not closed by a later row split
    there, or a row split not fed by an earlier column split there (a row split of the head
    included) -- the engine runs the ops between them on local shards, and has no resharding
    anywhere else. ``module_strategies`` lists modules in execution order."""
    styles = {p: s for p, s in module_strategies if not p.startswith("<")}  # not the loss
    out = [] if styles or tp == 1 else [Problem(
        f"the plan has tp={tp} but no module strategies", "plan.module_strategies",
        "make the plan with this version (autopar plan / plan_for)")]
    for pattern, style in styles.items():
        where = f"plan.module_strategies[{pattern!r}]"
        if style not in ENGINE_STYLES:
            out.append(Problem(f"the plan runs module {pattern} as {style!r}, a layout the "
                               "engine's tensor-parallel styles cannot express", where,
                               "re-plan (autopar plan), or plan with split weights "
                               "(autopar.plan_for)"))
            continue
        names = [n for n in facts.layers if _matches(pattern, n)]
        if not names and style in SPLITS:
            out.append(Problem(f"the plan splits module {pattern}, which this model does not "
                               "have or which is not an nn.Linear/nn.Embedding", where,
                               "verify or export with the model the plan was made for, or "
                               "re-plan this model"))
            continue
        if tp == 1 or style not in SPLITS:
            continue
        kind, shape = facts.layers[names[0]]
        want, dim = SPLITS[style]
        if not splittable(kind, shape, style, tp):
            size = shape[dim] if kind == want and len(shape) > dim else None
            out.append(Problem(
                f"module {pattern} ({kind}, weight {list(shape)}) cannot be split by {style} "
                + (f"over tp={tp}: {tp} does not divide its dimension {dim} ({size})"
                   if size is not None else f"(the {style} style applies to an nn.{want})"),
                where, "re-plan: the planner keeps such a layer whole"))
            continue
        parent = _parent(pattern)
        order = list(styles)
        siblings = [p for p in order if _parent(p) == parent and p != pattern]
        if style == Style.COLUMN and parent:
            closed = any(styles[p] == Style.ROW and order.index(p) > order.index(pattern)
                         for p in siblings)
        elif style == Style.ROW:
            closed = bool(parent) and any(styles[p] == Style.COLUMN and
                                          order.index(p) < order.index(pattern)
                                          for p in siblings)
        else:
            closed = True
        if not closed:
            out.append(Problem(
                f"{pattern} is split by {style}s without a "
                f"{'row split after it' if style == Style.COLUMN else 'column split before it'} "
                f"in {parent or 'the model root'}: the engine runs a tensor-parallel region "
                "from column splits to row splits inside one module (attention, MLP), and "
                "splits nothing else but an embedding by vocabulary and the head by columns",
                where, "re-plan (autopar plan / plan_for)"))
    return out


def styles_problems(facts: ModelFacts, module_strategies: tuple[tuple[str, str], ...],
                    tp: int) -> list[Problem]:
    """Why the engine cannot run a plan's module styles: ``layer_problems``, and where the
    model's family reads its blocks' code (``ModelFacts.tensor_layout``), what that code cannot
    run on a rank's shards. The search drops a candidate whose solved styles have any
    (``search.planner.Strategies``), and ``plan_problems`` refuses a plan that has."""
    found = layer_problems(facts, module_strategies, tp)
    if facts.tensor_layout is not None and tp > 1 and not found:
        why = facts.tensor_layout.problem(block_styles(module_strategies,
                                                       facts.tensor_layout.blocks), tp)
        if why is not None:
            found.append(Problem(f"the plan's tensor-parallel splits cannot run in this "
                                 f"model's blocks ({why})", "plan.module_strategies",
                                 "re-plan this model (autopar plan / plan_for), or use tp=1"))
    return found


def plan_problems(facts: ModelFacts, plan: Plan) -> list[Problem]:
    """``problems`` plus what a solved plan decides (see the module docstring)."""
    found = problems(facts, plan.config, plan.train)
    if sum(plan.stage_blocks) != facts.num_blocks:
        found.insert(0, Problem(
            f"the plan places {sum(plan.stage_blocks)} blocks in its pipeline stages, the model "
            f"has {facts.num_blocks}", "plan.stage_blocks",
            "verify or export with the model the plan was made for, or re-plan this model"))
    return found + styles_problems(facts, plan.module_strategies, plan.config.tp)


def block_styles(module_strategies: tuple[tuple[str, str], ...], blocks: str
                 ) -> dict[str, str]:
    """The plan's style of each module of a block, by its path in the block (the plan names
    them ``<blocks>.*.<path>``)."""
    prefix = f"{blocks}.*."
    return {p[len(prefix):]: s for p, s in module_strategies if p.startswith(prefix)}


def check_plan(facts: ModelFacts, plan: Plan) -> None:
    """Raise the first of ``plan_problems`` as an ``AutoparError``."""
    found = plan_problems(facts, plan)
    if found:
        raise found[0].error()
