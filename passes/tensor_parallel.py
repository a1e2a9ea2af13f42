"""Tensor and sequence parallelism from the plan's module styles, on DTensor.

``plan.module_strategies`` (folded from the per-op solve) names a style per module; this pass
turns each into the engine's parallel style and calls ``parallelize_module`` once per stage:

==============  ==================================================================
``column``      ``ColwiseParallel``: weight (and bias) split by output features; the input
                is all-gathered from sequence shards under sequence parallelism; the output
                stays a local shard (attention and the MLP run on local heads/features).
                The head feeding a ``vocab`` loss keeps vocabulary-sharded logits.
``row``         ``RowwiseParallel``: weight split by input features; output all-reduced, or
                reduce-scattered to sequence shards under sequence parallelism.
``vocab``       ``RowwiseParallel`` on an embedding: table split by vocabulary rows, output
                all-reduced (or reduce-scattered to sequence shards).
``sequence``    ``SequenceParallel``: the norm runs on sequence shards.
``width``       ``WidthParallel``: a module between a column and a row split (a per-head
                norm) runs on the rank's heads, its weights whole, their gradients summed
                over the tp ranks.
``replicated``  nothing: every tp rank holds the module whole (under sequence parallelism a
                whole head first gathers its input from the sequence shards). Inside a
                module with column splits (MLA's low-rank projections and their norms
                before its column splits): ``RegionReplicated``, its weights replicated
                DTensors, as the region's input is.
==============  ==================================================================

``parallelize`` checks the styles against the model before this pass runs
(``autopar.analysis.admissibility.layer_problems``): each split applies to its kind of layer and tp
divides the dimension it splits, and column splits are closed by row splits inside one module.

The modules holding column splits (attention, MLP) get ``PrepareBlockInput``: their activation
input becomes one replicated DTensor (all-gathered once from sequence shards), so q, k and v
(or gate and up) read it together and their input gradients, partial sums, are added before a
single all-reduce or reduce-scatter -- the solve's ``fork``, where one ``ColwiseParallel`` per
projection would communicate once per projection. Attention runs on the local heads
(``use_local_output=True``): DTensor has no sharding rule for
the CPU fused-attention op (../shared/design/FINDINGS.md). A vocabulary-sharded loss runs under
``loss_parallel``; see ``vocab_parallel_logits``. An attention module's per-head parameters
(``models.family.HEAD_PARAMS``: GPT-OSS's sinks) are split by heads with its projections. A tied embedding and head are re-tied after
``parallelize_module``, which replaces each module's parameter with its own DTensor.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autopar.analysis.admissibility import block_styles
from autopar.core.layout import Style
from autopar.core.plan import Plan
from autopar.models.family import HEAD_PARAMS
from autopar.models.parts import stage_info
from autopar.analysis.module_strategies import LOSS
from autopar.passes.model_parts import ModelParts


class PrepareBlockInput(PrepareModuleInput):
    """The activation input of an attention or MLP module -- its first positional argument, or
    ``hidden_states`` by keyword (transformers) -- as a replicated DTensor (or as ``desired``:
    the first block's whole input sliced to the rank's sequence shard, for a family whose
    embedding step runs whole, ``ModelParts.embedding_in_shards``); other arguments (rotary
    tables, masks) pass through."""

    def __init__(self, layout: Shard | Replicate, desired: Shard | Replicate = Replicate(),
                 use_local_output: bool = False) -> None:
        super().__init__(input_layouts=(layout,), desired_input_layouts=(desired,),
                         input_kwarg_layouts={"hidden_states": layout},
                         desired_input_kwarg_layouts={"hidden_states": desired},
                         use_local_output=use_local_output)

    def _prepare_input_fn(self, inputs, device_mesh):  # type: ignore[override]
        if not isinstance(inputs, tuple) or not inputs:
            return inputs
        first = self._prepare_input_arg(inputs[0], device_mesh, self.input_layouts[0],
                                        self.desired_input_layouts[0])
        return (first, *inputs[1:])


class SectionedColwiseParallel(ColwiseParallel):
    """``ColwiseParallel`` for a linear whose output the model cuts into ``sections`` equal
    parts (q, k and v of one fused projection): each rank holds its share of every section
    (``_StridedShard``: the weight's rows cut into the sections first, each section then split
    over the ranks), so its local output is its q, k and v side by side, and the global
    weight stays the model's (checkpoints are the same under every plan)."""

    def __init__(self, sections: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sections = sections

    def _partition_linear_fn(self, name, module, device_mesh):  # type: ignore[override]
        from torch.distributed.tensor import distribute_tensor
        from torch.distributed.tensor.placement_types import _StridedShard

        for pname, param in module.named_parameters():
            # the bias stays whole on every tp rank: DTensor slices it to the output's
            # sections locally, and FSDP2 then shards it along dp with a layout DTensor reads
            # back right (a strided tp shard of a 1-D bias under FSDP2's strided dp shard is
            # not: its full_tensor, and so a checkpoint, would be permuted)
            placement = (_StridedShard(0, split_factor=self.sections) if param.ndim == 2
                         else Replicate())
            placed = distribute_tensor(param, device_mesh, [placement],
                                       src_data_rank=self.src_data_rank)
            module.register_parameter(pname, nn.Parameter(placed,
                                                          requires_grad=param.requires_grad))

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        # the output is strided as the weight is: each rank's q, k and v side by side, as the
        # rewritten code reads it (``ColwiseParallel`` would redistribute it to Shard(-1))
        return outputs.to_local() if use_local_output else outputs


class WidthParallel(SequenceParallel):
    """A module of the plan's ``width`` style: inside a column -> row region it reads the
    rank's width shard (a per-head norm such as Qwen3's ``q_norm`` over each head's features)
    with every weight whole on every rank. Its local compute is the one-process computation on
    those heads; what tensor parallelism adds is the weight gradient, which each rank computes
    from its heads only and which must be summed over the tp ranks. DTensor does that sum: the
    weights become replicated DTensors (``SequenceParallel``'s), the input a DTensor sharded
    along dim 0, the output the local tensor again. Dim 0 is not the dim the width shard lies
    on, and need not be: the module's ops mix along the last dim only and keep every other
    (``module_strategies._keeps_shape``), so any dim but the last gives the same local
    computation, and the weight's gradient, reduced over the sharded dim, comes back partial
    and is all-reduced to the replicated weight."""

    def __init__(self) -> None:
        super().__init__(sequence_dim=0, use_local_output=True)


class RegionReplicated(ParallelStyle):
    """A module of the plan's ``replicated`` style inside a module with column splits (MLA's
    ``q_a_proj``, ``q_a_layernorm``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``): it reads the
    region's input, a replicated DTensor (``PrepareBlockInput``), so its weights become
    replicated DTensors too and its output stays one, for the column split that reads it (or
    the model's own hand-off to its heads, ``models/deepseek/attention.heads_share``). Every
    rank computes it whole; its weights' gradients, which each rank's heads contribute a part
    of, come back as partial sums and DTensor reduces them over the tp ranks."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        from torch.distributed.tensor import distribute_module, distribute_tensor

        def replicate(name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
            for pname, param in list(mod.named_parameters(recurse=False)):
                placed = distribute_tensor(param, mesh, [Replicate()])
                mod.register_parameter(pname, nn.Parameter(placed,
                                                           requires_grad=param.requires_grad))

        return distribute_module(module, device_mesh, replicate)


class GatherBlockOutput(ParallelStyle):
    """The last block's output (a tensor, or a tuple whose item 0 is the hidden state) from the
    rank's sequence shard to the whole sequence: under sequence parallelism a family whose
    finish step autopar reads off a graph (``ModelParts.embedding_in_shards`` false: the
    generic decoder) runs it whole on every tp rank, as it runs the embedding step -- a norm
    written inline in the forward holds a bare parameter no style reaches, whose gradient
    computed on a sequence shard would be that shard's part only. The gather's backward hands
    each rank its shard of the (replicated) gradient."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def gather(mod, inputs, output):
            hidden = output[0] if isinstance(output, tuple) else output
            whole = DTensor.from_local(hidden, device_mesh, [Shard(1)], run_check=False
                                       ).redistribute(device_mesh, [Replicate()]).to_local()
            return (whole, *output[1:]) if isinstance(output, tuple) else whole

        module.register_forward_hook(gather)
        return module


def is_sectioned(tensor: object) -> bool:
    """A DTensor laid out by ``SectionedColwiseParallel``: its tp placement (the last mesh
    dimension) a ``_StridedShard``, so a rank's rows are one block of each section, not one
    block of the tensor."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    return isinstance(tensor, DTensor) and isinstance(tensor.placements[-1], _StridedShard)


def sequence_parallel(plan: Plan) -> bool:
    """Whether the residual stream runs in sequence shards: the plan enables it and some module
    runs over the sequence (a solve may enable it and still keep every op whole)."""
    return plan.config.sequence_parallel and any(
        style == Style.SEQUENCE for _, style in plan.module_strategies)


def loss_is_vocab_parallel(plan: Plan) -> bool:
    return plan.config.tp > 1 and dict(plan.module_strategies).get(LOSS) == Style.VOCAB


def _pattern(name: str, parts: ModelParts, blocks: frozenset[str]) -> str:
    """The plan's name of module ``name``: ``<blocks>.*.<path>`` inside a block (``blocks``:
    the stage's block keys); its own name elsewhere, in the container's modules before or
    after the blocks included (the plan names them so: ``module_strategies``)."""
    match = re.match(rf"^{re.escape(parts.blocks)}\.(\d+)(?=\.|$)", name)
    if match is None or match.group(1) not in blocks:
        return name
    return f"{parts.blocks}.*{name[match.end():]}"


def _style(name: str, style: Style, plan: Plan, parts: ModelParts, sections: int = 1,
           whole_ends: bool = False, seq: Shard | Replicate = Replicate()
           ) -> ParallelStyle | None:
    """The engine's style for one module: the one translation of the plan's ``Style`` to
    DTensor. ``parallelize`` has checked the plan's styles against the model first
    (``autopar.analysis.admissibility.layer_problems``: module kinds, divisible dimensions, column
    splits closed by row splits). ``whole_ends``: the finish step reads the whole sequence
    (``GatherBlockOutput``), so the head's input is replicated. ``seq``: the layout of the
    activations around the module (``_stream``)."""
    if style == Style.REPLICATED:
        return None
    if style == Style.SEQUENCE:
        return SequenceParallel()
    if style == Style.WIDTH:
        return WidthParallel()
    if style == Style.VOCAB:
        whole = name == parts.embedding and not parts.embedding_in_shards
        return RowwiseParallel(input_layouts=Replicate(),
                               output_layouts=Replicate() if whole else seq)
    if style == Style.ROW:
        return RowwiseParallel(output_layouts=seq)
    if name == parts.head:
        # the logits stay vocabulary shards for loss_parallel, or are gathered whole
        out = Shard(-1) if loss_is_vocab_parallel(plan) else Replicate()
        return ColwiseParallel(input_layouts=Replicate() if whole_ends else seq,
                               output_layouts=out)
    # inside a block the parent's PrepareBlockInput has made the input a replicated DTensor
    if sections > 1:
        return SectionedColwiseParallel(sections, input_layouts=Replicate())
    return ColwiseParallel(input_layouts=Replicate())


def _inside(name: str, modules: Collection[str]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def _stream(name: str, plan: Plan, token_modules: frozenset[str],
            whole: tuple[str, ...] = ()) -> Shard | Replicate:
    """The layout of the activations a module of ``name`` reads and writes: the rank's
    sequence shard (dim 1 of (b, s, h)) under sequence parallelism, else the whole sequence --
    also inside the modules of ``whole``, the embedding and finish steps of a family that runs
    them whole (DeepSeek's dense first layers: ``ModelParts.embedding_in_shards``); inside a
    MoE layer that runs on the rank's own tokens under the experts' fold (``token_modules``),
    the rank's rows of the (b * s, h) tokens its family flattens them to (dim 0), whether the
    blocks run sequence-parallel or not (``passes/expert_parallel.py``: ``TokenShards``)."""
    if _inside(name, token_modules):
        return Shard(0)
    if _inside(name, whole):
        return Replicate()
    return Shard(1) if sequence_parallel(plan) else Replicate()


def apply_tensor_parallel(stage: nn.Module, plan: Plan, tp_mesh: DeviceMesh,
                          parts: ModelParts, token_modules: frozenset[str] = frozenset()
                          ) -> None:
    """Shard ``stage`` over ``tp_mesh`` as the plan says (in place). ``token_modules``: the
    stage's MoE layers that run on the rank's own tokens under the experts' fold; the plan's
    styles of the modules inside them apply to those tokens (a shared expert split by columns
    and rows gathers the rank's rows, and reduce-scatters back to them), and their routers and
    experts keep no style of their own (``passes/expert_parallel.apply_token_shards``)."""
    if tp_mesh.size() == 1:
        return
    styles = {k: v for k, v in plan.module_strategies if k != LOSS}
    # a family whose embedding and finish steps run whole under sequence parallelism: the
    # modules of those steps keep no sequence style (their input is the whole sequence)
    whole_ends = sequence_parallel(plan) and not parts.embedding_in_shards
    ends = (*parts.first, *parts.last) if whole_ends else ()
    if whole_ends:
        styles = {k: v for k, v in styles.items() if not (
            v == Style.SEQUENCE and any(k == e or k.startswith(e + ".") for e in ends))}
    tied = _tied_pairs(stage)
    in_block = block_styles(plan.module_strategies, parts.blocks)
    info = stage_info(stage)
    keys = frozenset(str(info.lead + b) for b in info.block_ids) if info is not None else \
        frozenset(k for k, _ in stage.get_submodule(parts.blocks).named_children())
    sections: dict[str, int] = {}
    for key, block in stage.get_submodule(parts.blocks).named_children():
        if key in keys:
            found = parts.shard_block(block, in_block, tp_mesh.size())
            sections.update({f"{parts.blocks}.{key}.{path}": n for path, n in found.items()})
    layout: dict[str, ParallelStyle] = {}
    gathered = None
    for name, _ in stage.named_modules():
        style = styles.get(_pattern(name, parts, keys))
        if style in (Style.SEQUENCE, Style.WIDTH) and _inside(name, token_modules):
            style = None  # already on the rank's tokens, its weights' gradients summed there
        if style is not None:
            seq = _stream(name, plan, token_modules, ends)
            chosen = _style(name, style, plan, parts, sections.get(name, 1), whole_ends, seq)
            if chosen is not None:
                layout[name] = chosen
            if style == Style.COLUMN and name != parts.head:
                layout[name.rsplit(".", 1)[0]] = PrepareBlockInput(seq)
    regions = {k for k, v in layout.items() if isinstance(v, PrepareBlockInput)}
    for name, _ in stage.named_modules():
        if name.rsplit(".", 1)[0] in regions and name not in layout and \
                styles.get(_pattern(name, parts, keys)) == Style.REPLICATED:
            layout[name] = RegionReplicated()
    if sequence_parallel(plan):
        extra = parts.sequence_parallel_styles()
        if not parts.embedding_in_shards:
            # the embedding step runs whole; the first block's input is sliced to the shards
            held = [int(k) for k, _ in stage.get_submodule(parts.blocks).named_children()]
            if info is not None and 0 in info.block_ids:
                # whole on every tp rank -> the rank's sequence shard: a slice, no collective
                # (at block 0: the container's modules before it run whole, as priced; on the
                # stage that holds it, which under the interleaved schedule need not be the
                # embedding's: a first chunk may hold the embedding step alone)
                extra[f"{parts.blocks}.{info.lead}"] = PrepareBlockInput(
                    Replicate(), desired=Shard(1), use_local_output=True)
            last_block = info.lead + sum(plan.stage_blocks) - 1 if info is not None else None
            if info is not None and held and (info.last or last_block in held):
                # and back after the container's last module: the finish runs on the whole
                # sequence (a one-block stage's block takes both, so this one is applied on
                # its own below) -- after the last block where another chunk runs the finish
                gathered = f"{parts.blocks}.{max(held) if info.last else last_block}"
        elif styles.get(parts.embedding, Style.REPLICATED) == Style.REPLICATED:
            # a whole table's output is sliced to the blocks' sequence shards (no collective)
            extra[parts.embedding] = PrepareModuleOutput(output_layouts=Replicate(),
                                                         desired_output_layouts=Shard(1))
        if styles.get(parts.head, Style.REPLICATED) == Style.REPLICATED and not whole_ends:
            # a whole head reads the whole sequence: its input is all-gathered from the shards
            extra[parts.head] = PrepareModuleInput(input_layouts=(Shard(1),),
                                                   desired_input_layouts=(Replicate(),),
                                                   use_local_output=True)
        present = {n for n, _ in stage.named_modules()}
        layout.update({k: v for k, v in extra.items() if k in present})
    parallelize_module(stage, tp_mesh, layout)
    _split_head_params(stage, regions, tp_mesh)
    if gathered is not None:
        parallelize_module(stage.get_submodule(gathered), tp_mesh, GatherBlockOutput())
    for owner, user in tied:
        stage.get_submodule(user).weight = stage.get_submodule(owner).weight


def _split_head_params(stage: nn.Module, regions: set[str], tp_mesh: DeviceMesh) -> None:
    """The per-head parameters (``HEAD_PARAMS``: GPT-OSS's attention sinks) of each module
    whose projections are split by heads, split ``Shard(0)`` with them: a rank's heads read
    their own sink logits, and each shard's gradient is its heads' own."""
    from torch.distributed.tensor import distribute_tensor

    for name in regions:
        module = stage.get_submodule(name)
        for attr in getattr(module, HEAD_PARAMS, ()):
            param = getattr(module, attr)
            placed = distribute_tensor(param.data, tp_mesh, [Shard(0)])
            setattr(module, attr, nn.Parameter(placed, requires_grad=param.requires_grad))


def _tied_pairs(stage: nn.Module) -> list[tuple[str, str]]:
    """(first holder, other holder) of every weight two modules of ``stage`` share."""
    seen: dict[int, str] = {}
    pairs = []
    for name, module in stage.named_modules(remove_duplicate=False):
        w = getattr(module, "weight", None)
        if isinstance(w, nn.Parameter):
            if id(w) in seen and seen[id(w)] != name:
                pairs.append((seen[id(w)], name))
            else:
                seen.setdefault(id(w), name)
    return pairs


def vocab_parallel_logits(logits: torch.Tensor, tp_mesh: DeviceMesh) -> DTensor:
    """The head's local vocabulary shard as a DTensor for ``loss_parallel``."""
    if isinstance(logits, DTensor):
        return logits
    return DTensor.from_local(logits, tp_mesh, [Shard(logits.dim() - 1)], run_check=False)
