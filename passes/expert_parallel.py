"""Expert parallelism: each MoE layer's experts split over the ep ranks, tokens sent to them.

``expert_mesh(plan, mesh)`` is the engine's view of the experts, folded over the attention's
ranks (Megatron-Core's MoE Parallel Folding, arXiv 2504.14960): the stage's
``ParallelConfig.expert_ranks`` -- (``dp_replicate``, ``dp_shard``, ``cp``), and ``tp`` under
the fold -- flattened in the world mesh's order (dp outer, tp inner) and unflattened into
(``edp_replicate``, ``edp_shard``, ``ep``, ``etp``), etp fastest: ``autopar.core.mesh.
expert_strides``, the ranks ``costmodel/topology.py`` prices the all-to-all and the experts'
gradient reduction over (torchtitan's ``dp_shard`` -> (``dp_shard_mod_ep``,
``dp_shard_in_ep``), with the tp ranks in it). It is one ``DeviceMesh`` with the world mesh as
its root (``DeviceMesh._flatten`` / ``_unflatten``), so FSDP2 can shard an ep DTensor over the
expert data-parallel ranks (its FSDP + EP layout, and FSDP + EP + TP under etp).

**Expert tensor parallelism** (etp > 1, of the tp ranks under the fold; Megatron-Core's
``--expert-tensor-parallel-size``): each expert's hidden width is split over the etp ranks --
the family says which dim of each stacked weight (``ExpertLayer.etp_dims``; the zoo's
``Experts``: gate and up by columns, down by rows, the output bias whole), the weights are
DTensors ``(Shard(0), Shard(dim))`` on the (ep, etp) mesh. After the dispatch every etp rank's
received rows are gathered (capacity: an all-gather of the equal slots; dropless: an
all-to-all of uneven splits, every rank's rows to each), each rank runs its part of the width
on all of them, and the parts are summed back to the rows' rank (a reduce-scatter, or the
reverse all-to-all and a sum); the backward of each is the other. Only the first etp rank adds
the output's bias (the others add it as zero, keeping its gradient: every etp rank computes
the same rows). The cost model prices the same gather and scatter (``costmodel/moe.py``).

**The fold** (``ParallelConfig.experts_fold_tp``: tp > 1 with sequence parallelism): every MoE
layer (``ExpertLayer.module``) runs on its tp rank's own tokens -- ``TokenShards`` takes the
rank's sequence shard (as it comes from a sequence-parallel norm; sliced, and its output
gathered back, where the plan keeps the residual stream whole), so no tp rank computes
another's tokens and none gathers before the layer. The layer's whole weights (a router, a
shared expert's gate) see different tokens on each tp rank: ``TokenReplicated`` sums their
gradients over tp. A shared expert inside the layer (Qwen2-MoE's) is split by tp as a dense
MLP over the rank's rows (``tensor_parallel._stream``); the deepseek family's sits beside the
layer and is the block's dense MLP. Without the fold the tp ranks hold the same tokens and each
runs its dp x cp rank's experts whole on them.

**The call's tokens over several ranks** (cp, and tp under the fold): the one-process model
routes each micro-batch as one call, whose capacity slots and load-balancing loss count all its
tokens. ``SplitCall`` (``apply_call_tokens``) gives a layer that decides over the call (the
zoo's ``MoELayer``, ``ExpertLayer.split_tokens``) the ranks holding them: one all-gather of the
top-k indices, put back in the one-process token order (cp's load-balanced chunks, then the tp
shard), gives every rank the call's slots and expert fractions; its kept assignments then go
through the dropless exchange (``models/moe``: ``MoELayer._kept``), and its share of the
load-balancing loss is computed with the call's fractions (times cp: each cp rank's loss is
the mean over its own chunks). Families whose routers route each token on its own
(``Family.token_routing``) need none.

``apply_expert_parallel(stage, plan, ep_mesh, layers)`` makes every MoE layer of the stage --
``layers``, the family's ``Family.expert_layers(stage)`` (``models/expert_layers.py``: the zoo's
``MoELayer``, transformers' stacked experts of ``models/hf_moe``; one dispatch for all) --

* hold ``E / ep`` experts: the stacked weights (``ExpertLayer.weights``) become DTensors
  ``Shard(0)`` on the ep mesh (rank ``r`` holds experts ``r * E/ep ..``), so ``materialize``
  draws, and ``torch.distributed.checkpoint`` saves and reloads under another plan, each
  rank's slice of the one-process weights; a list of expert modules (a generic decoder's,
  ``ExpertLayer.shard``) keeps rank ``r``'s experts under their own names and none of the
  others, whose checkpoint keys their owners save, as pipeline stages do theirs;
* dispatch with the autograd all-to-all (``_functional_collectives.all_to_all_single_autograd``;
  its backward is the reverse all-to-all). The routing, the drops and the load-balancing loss
  stay the layer's, on the rank's own tokens (``models/moe/model.py``; transformers' router,
  whose MoE models train without the aux loss: ``models/hf_moe``), so each rank computes
  what the one-process model computes on its micro-batch:

  - **capacity** (``capacity_factor`` set): the rank's (E, C, h) dispatch buffer, the model's
    own slots and drops, goes to the experts' owners in equal parts -- one all-to-all of
    ``E * C * h`` elements there and one back, static shapes (GShard); an owner runs its
    ``E / ep`` experts on the ``ep * C`` rows it received;
  - **dropless** (``capacity_factor=None``): the rank's assignments sorted by expert; one
    all-to-all of the per-expert counts (``ep * E/ep`` integers), then the rows with uneven
    splits, ``top_k * T`` rows sent in all; the owner regroups them by expert, runs each on its
    rows, and the reverse all-to-all brings them home (``exchange``, which a layer routing
    by its own code calls with its rows grouped by expert: ``models/generic/experts.py``).

Per layer and micro-batch that is 2 all-to-alls forward (dispatch, combine) and 2 backward in
capacity mode; dropless adds the count exchange (forward only: counts have no gradient).
The cost model prices these (``costmodel/step.py:ep_alltoalls``); ``tests/dist/
test_comm_counts.py`` holds the program to it.

Expert weights' gradients are summed over the ep ranks by the all-to-all's backward (every
rank's tokens reach the owner); FSDP2 then averages over the expert data-parallel ranks only
(``edp`` of them), while each rank's gradient is dp x cp times its share of the step's (each
replica's loss is its mean, each cp rank's its chunks' mean; tp ranks under the fold hold parts
of one replica's tokens). So the experts scale their weights' gradients by ``edp / (dp x cp)``
in the backward (``expert_grad_scale``, ``ExpertLayer.run``'s ``grad_scale``): 1 / ep without
the fold, tp / ep with it -- the mean over the dp ranks, as for the dense weights
(``passes/data_parallel.py``). (torchtitan sets FSDP2's ``gradient_divide_factor`` instead;
on gloo that needs sum reductions, and with a shard group of one -- ZeRO-0's HSDP, or
ep = dp -- torch 2.13 divides by the factor twice.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import (
    all_gather_tensor,
    all_gather_tensor_autograd,
    all_to_all_single,
    all_to_all_single_autograd,
    reduce_scatter_tensor_autograd,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from autopar.core.errors import AutoparError
from autopar.core.mesh import DATA_PARALLEL, MeshAxis
from autopar.core.plan import Plan
from autopar.models.expert_layers import ExpertLayer
from autopar.passes.context_parallel import chunk_positions
from autopar.passes.tensor_parallel import sequence_parallel
from autopar.models.routing import (
    capacity_slots,
    combine_capacity,
    combine_dropless,
    dispatch_capacity,
    dropless_order,
    dropless_rows,
    expert_capacity,
    is_symbolic,
)

EXPERT_DP = ("edp_replicate", "edp_shard")
"""The expert mesh's data-parallel dimensions (ZeRO-0 replicates over the first, 1-3 shard over
the second; the other has size 1, as ``core.mesh.DATA_PARALLEL``)."""
EP = "ep"
ETP = "etp"


def wants_expert_mesh(plan: Plan, has_experts: bool) -> bool:
    """Whether the program builds the experts' mesh: ep > 1, or the experts folded over the tp
    ranks (``ParallelConfig.experts_fold_tp``: with ep 1 too, the tp ranks then hold the same
    experts and route different tokens to them, so the experts' gradients reduce over them)."""
    c = plan.config
    return has_experts and (c.ep > 1 or c.experts_fold_tp)


def expert_mesh(plan: Plan, mesh: DeviceMesh) -> DeviceMesh:
    """(``edp_replicate``, ``edp_shard``, ``ep``, ``etp``) over this rank's ``expert_ranks``:
    its data- and context-parallel ranks, and its tp ranks under the fold, flattened in the
    attention mesh's order (dp outer, cp, tp inner) and cut with ``etp`` fastest, then ``ep``
    -- ``autopar.core.mesh.expert_strides``, the ranks the cost model places the all-to-all
    and the experts' gradient reduction on (``costmodel/topology.py``)."""
    c = plan.config
    if c.ep == 1 and not c.experts_fold_tp:
        raise AutoparError("expert_mesh of a plan without expert parallelism",
                           where="passes.expert_parallel.expert_mesh",
                           fix="call it for ep > 1, or tp > 1 with sequence parallelism")
    names = (*(a.value for a in DATA_PARALLEL), MeshAxis.CP.value,
             *((MeshAxis.TP.value,) if c.experts_fold_tp else ()))
    flat = mesh[names]._flatten("_".join(("experts", *names)))
    sizes = (c.edp, 1, c.ep, c.etp) if c.zero == 0 else (1, c.edp, c.ep, c.etp)
    return flat._unflatten(0, sizes, (*EXPERT_DP, EP, ETP))


def expert_dp_mesh(plan: Plan, experts_mesh: DeviceMesh | None) -> DeviceMesh | None:
    """The ranks FSDP2 shards (ZeRO 1-3) or replicates (ZeRO-0, as HSDP) the experts over."""
    if experts_mesh is None:
        return None
    return experts_mesh[EXPERT_DP] if plan.config.zero == 0 else experts_mesh[EXPERT_DP[1]]


def expert_grad_scale(plan: Plan) -> float:
    """What the experts scale their weights' gradients by (module docstring): every rank's
    gradient is dp x cp times its share of the step's (the loss is each replica's mean, each
    cp rank's over its chunks; tp ranks under the fold hold parts of one replica's tokens), an
    expert's owner receives those of its ep group, and FSDP2 averages over the edp ranks
    holding the same experts: ``edp / (dp x cp)`` -- 1 / ep without the fold, tp / ep with it."""
    c = plan.config
    return c.edp / (c.dp * c.cp)


def apply_expert_parallel(stage: nn.Module, plan: Plan, ep_mesh: DeviceMesh,
                          layers: list[ExpertLayer]) -> list[nn.Module]:
    """Shard the experts of every MoE layer of ``stage`` (``layers``: the family's
    ``expert_layers(stage)``) over ``ep_mesh[EP]`` and route each through the all-to-all
    dispatch; returns the layers' experts modules (for FSDP over the expert data-parallel
    ranks)."""
    ep = ep_mesh[EP]
    etp = plan.config.etp
    out = []
    for layer in layers:
        if layer.num_experts % ep.size():
            raise AutoparError(f"ep={ep.size()} does not divide the {layer.num_experts} experts",
                               where="plan.config.ep",
                               fix=f"choose ep among the divisors of {layer.num_experts}")
        experts = layer.experts
        if etp > 1:
            out.append(_split_experts_etp(layer, ep_mesh))
        elif layer.shard is not None:
            out.extend(layer.shard(ep))
        else:
            for name in layer.weights if ep.size() > 1 else ():
                param = getattr(experts, name)
                sharded = distribute_tensor(param.data, ep, [Shard(0)], src_data_rank=None)
                setattr(experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
            out.append(experts)
        dispatch = ExpertDispatch(ep, layer, expert_grad_scale(plan),
                                  ep_mesh[ETP] if etp > 1 else None)
        layer.install(dispatch)
        if ep.size() > 1:
            experts.ep_dispatch = dispatch  # found again by ep_load
    return out


def _split_experts_etp(layer: ExpertLayer, ep_mesh: DeviceMesh) -> nn.Module:
    """The stacked weights of ``layer`` as DTensors on the (ep, etp) mesh: experts
    ``Shard(0)`` over ep, each weight's hidden width (``ExpertLayer.etp_dims``) over etp -- or
    ``Replicate`` for one every etp rank holds whole; returns the experts module (FSDP2's unit
    over the expert data-parallel ranks: its "EP + TP" layout). Admissibility's
    ``etp_problem`` (``check_executable``) has refused a family without ``etp_dims`` and a
    width etp does not divide."""
    assert layer.etp_dims is not None
    mesh = ep_mesh[(EP, ETP)]
    experts = layer.experts
    for name in layer.weights:
        param = getattr(experts, name)
        dim = layer.etp_dims[name]
        placements = [Shard(0), Replicate() if dim is None else Shard(dim)]
        sharded = distribute_tensor(param.data, mesh, placements, src_data_rank=None)
        setattr(experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))
    return experts


def call_tokens_mesh(plan: Plan, mesh: DeviceMesh) -> DeviceMesh | None:
    """The ranks holding one call's tokens -- one micro-batch of one data-parallel replica:
    its cp ranks, and its tp ranks under the fold -- flattened (cp outer, tp inner); ``None``
    where one rank holds them all."""
    c = plan.config
    names = (MeshAxis.CP.value, *((MeshAxis.TP.value,) if c.experts_fold_tp else ()))
    if c.cp * (c.tp if c.experts_fold_tp else 1) == 1:
        return None
    return mesh[names]._flatten("call_" + "_".join(names)) if len(names) > 1 else mesh[names[0]]


class SplitCall:
    """``models.expert_layers.CallTokens`` over the cp (and, under the fold, tp) ranks of one
    call: member ``g`` of ``group`` is cp rank ``g // tp``'s tp rank ``g % tp``, which holds
    the tp-th part ``g % tp`` (sequence parallelism's shard) of cp rank ``g // tp``'s chunks
    (``context_parallel.chunk_positions``)."""

    def __init__(self, group: DeviceMesh, cp: int, tp: int) -> None:
        self.group = group
        self.cp, self.tp = cp, tp
        self.grad_share = float(cp)

    def _positions(self, member: int, s_local: int, device: torch.device) -> torch.Tensor:
        seq = s_local * self.cp * self.tp
        chunks = chunk_positions(seq, self.cp, member // self.tp, device)
        return chunks.narrow(0, (member % self.tp) * s_local, s_local)

    def gather(self, local: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.group.size()
        b, s_local = local.shape[:2]
        parts = local.new_empty((n * b, *local.shape[1:]))
        dist.all_gather_into_tensor(parts, local.contiguous(), group=self.group.get_group())
        parts = parts.view(n, *local.shape)
        positions = torch.cat([self._positions(g, s_local, local.device) for g in range(n)])
        whole = local.new_empty((b, n * s_local, *local.shape[2:]))
        whole.index_copy_(1, positions, parts.transpose(0, 1).reshape(b, n * s_local,
                                                                      *local.shape[2:]))
        mine = self._positions(self.group.get_local_rank(), s_local, local.device)
        flat = torch.arange(b, device=local.device).unsqueeze(1) * (n * s_local) + mine
        return whole, flat.reshape(-1)


def apply_call_tokens(plan: Plan, group: DeviceMesh | None, layers: list[ExpertLayer]) -> None:
    """Give every MoE layer whose routing or loss spans the call's tokens the ranks that hold
    them (``SplitCall`` over ``group``, ``call_tokens_mesh``): under context parallelism, and
    under the fold."""
    if group is None:
        return
    c = plan.config
    call = SplitCall(group, c.cp, c.tp if c.experts_fold_tp else 1)
    for layer in layers:
        if layer.split_tokens is not None:
            layer.split_tokens(call)


class TokenShards(ParallelStyle):
    """A MoE layer run on the rank's own tokens under the experts' fold: its input, the
    block's (b, s, h) hidden states, taken as the rank's sequence shard -- the local tensor of
    a sequence-sharded DTensor, or a local shard as is, or (where the blocks' residual stream
    is whole, ``residual`` ``Replicate``) sliced from the whole sequence, whose backward
    all-gathers; its output the local shard again, or all-gathered back to the whole
    sequence (backward: the rank's slice). No collective before the layer under sequence
    parallelism, and no tp rank computes another's tokens."""

    def __init__(self, residual: Shard | Replicate) -> None:
        super().__init__()
        self.residual = residual

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        whole = isinstance(self.residual, Replicate)

        def to_shard(x):
            if isinstance(x, DTensor):
                return x.redistribute(device_mesh, [Shard(1)]).to_local()
            if whole:
                return DTensor.from_local(x, device_mesh, [Replicate()], run_check=False
                                          ).redistribute(device_mesh, [Shard(1)]).to_local()
            return x

        def before(mod, args, kwargs):
            if args:
                return (to_shard(args[0]), *args[1:]), kwargs
            if "hidden_states" in kwargs:
                return args, {**kwargs, "hidden_states": to_shard(kwargs["hidden_states"])}
            return args, kwargs

        def after(mod, args, output):
            if not whole:
                return output
            return DTensor.from_local(output, device_mesh, [Shard(1)], run_check=False
                                      ).redistribute(device_mesh, [Replicate()]).to_local()

        module.register_forward_pre_hook(before, with_kwargs=True)
        module.register_forward_hook(after)
        return module


class _SumGrad(torch.autograd.Function):
    """Identity whose backward sums the gradient over ``group``."""

    @staticmethod
    def forward(ctx, w: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return w.view_as(w)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class TokenReplicated(ParallelStyle):
    """A module of a MoE layer whose weights every tp rank holds whole and runs on its own
    tokens under the fold (a router; a gate of a shared expert, or a shared expert kept whole):
    each rank's gradient is its tokens' part, so the module uses its weights through an
    identity whose backward sums the gradient over the tp ranks (Megatron-LM's all-reduce of
    sequence-parallel weights' gradients). The weights stay plain tensors, FSDP2's over the
    dp ranks as a replicated module's are; the forward sees the identity's output under the
    weight's name for the duration of the call (the instance's ``__dict__`` is looked up
    before the module's parameters), so any code the module runs reads it."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        group = device_mesh.get_group()
        names = [n for n, p in module.named_parameters(recurse=False)
                 if not isinstance(p, DTensor)]

        def before(mod, args):
            for n in names:
                mod.__dict__[n] = _SumGrad.apply(mod._parameters[n], group)

        def after(mod, args, output):
            for n in names:
                mod.__dict__.pop(n, None)

        module.register_forward_pre_hook(before)
        module.register_forward_hook(after)
        return module


def apply_token_shards(plan: Plan, tp_mesh: DeviceMesh, layers: list[ExpertLayer]) -> None:
    """Under the experts' fold, run every MoE layer of ``layers`` on the rank's own tokens
    (``TokenShards``) with its whole weights' gradients summed over the tp ranks
    (``TokenReplicated``; the experts' own are reduced over the expert data-parallel ranks,
    which include the tp ranks). After tensor parallelism, which has split any shared expert
    inside the layer over the rank's rows (``tensor_parallel._stream``)."""
    if not plan.config.experts_fold_tp:
        return
    residual = Shard(1) if sequence_parallel(plan) else Replicate()
    for layer in layers:
        if layer.module is None:  # admissibility refuses the fold for such a family first
            raise AutoparError("the experts' fold for a MoE layer its family cannot run on a "
                               "rank's own tokens", where="plan.config.sequence_parallel",
                               fix="plan sequence_parallel=False")
        inner = {id(m) for m in layer.experts.modules()}
        for sub in layer.module.modules():
            if id(sub) not in inner and any(not isinstance(p, DTensor) for p in
                                            sub.parameters(recurse=False)):
                parallelize_module(sub, tp_mesh, TokenReplicated())
        parallelize_module(layer.module, tp_mesh, TokenShards(residual))


class ExpertDispatch:
    """The all-to-all dispatch and combine of one MoE layer over the ep group (see the
    module docstring); the layer calls it with its routing in place of its local experts."""

    def __init__(self, ep_mesh: DeviceMesh, layer: ExpertLayer, grad_scale: float,
                 etp_mesh: DeviceMesh | None = None) -> None:
        self.mesh = ep_mesh
        self.ep = ep_mesh.size()
        self.layer = layer
        self.grad_scale = grad_scale
        """``expert_grad_scale``: the experts' weights' gradients are scaled by it."""
        self.etp_mesh = etp_mesh
        """The ranks splitting each local expert's hidden width (``None``: etp 1)."""
        self.rows_sent: torch.Tensor | None = None
        """Assignments this rank sent to each ep rank's experts (ep,), summed over the calls
        (kept ones only in capacity mode): ``ep_load`` adds them up over the group."""

    def _count(self, per_owner: torch.Tensor) -> None:
        per_owner = per_owner.detach().to("cpu", torch.int64)
        self.rows_sent = per_owner if self.rows_sent is None else self.rows_sent + per_owner

    def __call__(self, tokens: torch.Tensor, top_experts: torch.Tensor,
                 weights: torch.Tensor) -> torch.Tensor:
        if self.layer.capacity_factor is None and not is_symbolic(tokens):
            return self._dropless(tokens, top_experts, weights)
        return self._capacity(tokens, top_experts, weights)

    def _capacity(self, tokens, top_experts, weights) -> torch.Tensor:
        layer = self.layer
        e, ep = layer.num_experts, self.ep
        if layer.capacity_factor is None:  # a dropless layer on fake tensors: the mean load
            capacity = dropless_rows(tokens.size(0), e, layer.top_k)
        else:
            capacity = expert_capacity(tokens.size(0), e, layer.top_k, layer.capacity_factor)
        slot = capacity_slots(top_experts, e, capacity)
        if not is_symbolic(tokens):  # the kept assignments per owner (data-dependent)
            kept_expert = torch.div(slot[slot < e * capacity], capacity, rounding_mode="floor")
            self._count(torch.bincount(kept_expert, minlength=e).view(ep, -1).sum(dim=1))
        buf = dispatch_capacity(tokens, slot, e, capacity)  # (E, C, h), experts by owner
        return combine_capacity(self.exchange_slots(buf), slot, weights)

    def exchange_slots(self, buf: torch.Tensor) -> torch.Tensor:
        """(E, C, h) rows in each expert's C slots -> the experts' outputs in the same slots:
        one all-to-all of equal parts to the owners, which run their ``E / ep`` experts on the
        ``ep * C`` rows each received, and one back."""
        ep = self.ep
        e, capacity, h = buf.shape
        if ep == 1:
            return self._run_slots(buf)
        recv = all_to_all_single_autograd(buf.reshape(-1, h), None, None, self.mesh)
        local = e // ep  # recv: (source rank, local expert, slot, h)
        x = recv.view(ep, local, capacity, h).transpose(0, 1).reshape(local, ep * capacity, h)
        y = self._run_slots(x)
        y = y.view(local, ep, capacity, h).transpose(0, 1).reshape(-1, h)
        return all_to_all_single_autograd(y, None, None, self.mesh).view(e, capacity, h)

    def _dropless(self, tokens, top_experts, weights) -> torch.Tensor:
        order, counts = dropless_order(top_experts, self.layer.num_experts)
        rows = tokens.repeat(self.layer.top_k, 1)[order]
        return combine_dropless(self.exchange(rows, counts), order, weights)

    def exchange(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows grouped by expert (``counts``: (E,) int64 on the CPU or the rows' device,
        experts by owner) -> the experts' outputs in the same order: one all-to-all of the
        per-expert counts, then the rows with uneven splits to their owners, which regroup them
        by expert and run each on its rows; the reverse all-to-all brings them home."""
        e, ep = self.layer.num_experts, self.ep
        local = e // ep
        if ep == 1:
            return self._run_rows(rows, counts.to("cpu").tolist())
        counts = counts.to(rows.device)
        # counts[j] of every source for this rank's experts: (ep sources x local experts)
        got = all_to_all_single(counts, None, None, self.mesh).view(ep, local)
        self._count(counts.view(ep, local).sum(dim=1))
        send_splits = counts.view(ep, local).sum(dim=1).tolist()
        recv_splits = got.sum(dim=1).tolist()
        recv = all_to_all_single_autograd(rows, recv_splits, send_splits, self.mesh)
        # regroup (source, expert) blocks as (expert, source): each expert's rows together
        blocks = list(torch.split(recv, got.reshape(-1).tolist()))
        by_expert = [blocks[s * local + j] for j in range(local) for s in range(ep)]
        y = self._run_rows(torch.cat(by_expert), got.sum(dim=0).tolist())
        out_blocks = list(torch.split(y, [int(got[s, j]) for j in range(local)
                                          for s in range(ep)]))
        by_source = [out_blocks[j * ep + s] for s in range(ep) for j in range(local)]
        return all_to_all_single_autograd(torch.cat(by_source), send_splits, recv_splits,
                                          self.mesh)


    def _run_slots(self, x: torch.Tensor) -> torch.Tensor:
        """(E_local, slots, h) through the local experts; under etp every etp rank's slots
        all-gathered (its backward sums the rows' gradients back to their rank), this rank's
        part of each expert's hidden width run on all of them, and the parts summed back to
        the rows' rank (reduce-scatter; its backward all-gathers)."""
        if self.etp_mesh is None:
            return self.layer.run(x, None, self.grad_scale)
        group = self.etp_mesh.get_group()
        whole = all_gather_tensor_autograd(x.contiguous(), 1, group)
        y = self.layer.run(whole, None, self.grad_scale, self.etp_mesh.get_local_rank() == 0)
        return reduce_scatter_tensor_autograd(y.contiguous(), "sum", 1, group)

    def _run_rows(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Rows grouped by local expert (``counts``) through the local experts; under etp as
        ``_run_slots``, with each etp rank's uneven rows exchanged by all-to-alls (every rank
        sends its rows to each, and receives its rows' parts from each)."""
        if self.etp_mesh is None:
            return self.layer.run(rows, counts, self.grad_scale)
        n = self.etp_mesh.size()
        local = len(counts)
        mine = torch.tensor(counts, dtype=torch.int64, device=rows.device)
        every = all_gather_tensor(mine, 0, self.etp_mesh.get_group()).view(n, local)
        sizes = every.sum(dim=1).tolist()
        got = all_to_all_single_autograd(rows.repeat(n, 1), sizes, [rows.size(0)] * n,
                                         self.etp_mesh)
        # regroup (member, expert) blocks as (expert, member): each expert's rows together
        blocks = list(torch.split(got, every.reshape(-1).tolist()))
        by_expert = [blocks[m * local + j] for j in range(local) for m in range(n)]
        y = self.layer.run(torch.cat(by_expert), every.sum(dim=0).tolist(), self.grad_scale,
                           self.etp_mesh.get_local_rank() == 0)
        parts = list(torch.split(y, [int(every[m, j]) for j in range(local) for m in range(n)]))
        by_member = [parts[j * n + m] for m in range(n) for j in range(local)]
        back = all_to_all_single_autograd(torch.cat(by_member), [rows.size(0)] * n, sizes,
                                          self.etp_mesh)
        return back.view(n, rows.size(0), -1).sum(dim=0)


def ep_load(modules: list[nn.Module]) -> float | None:
    """The busiest ep rank's share of the assignments its ep group routed in the calls so far
    (1/ep is a perfect balance), over every MoE layer of ``modules``; ``None`` without expert
    parallelism. One all-reduce over the ep group (every rank of it calls this)."""
    dispatches = [d for m in modules for sub in m.modules()
                  if isinstance(d := getattr(sub, "ep_dispatch", None), ExpertDispatch)]
    if not dispatches:
        return None
    load = sum(d.rows_sent for d in dispatches if d.rows_sent is not None)
    if not isinstance(load, torch.Tensor):
        return None
    load = load.clone()
    dist.all_reduce(load, group=dispatches[0].mesh.get_group())
    return float(load.max()) / max(1.0, float(load.sum()))
