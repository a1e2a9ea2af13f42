"""Pipeline schedules from ``torch.distributed.pipelining`` for a rank's stages.

``ScheduleGPipe`` and ``Schedule1F1B`` run one stage per rank; ``ScheduleInterleaved1F1B`` runs
the rank's ``virtual_stages`` chunks (``InterleavedSchedule``: under ZeRO 0-2 with every chunk's
parameters gathered through the step). The loss function is the per-micro-batch mean; the
schedule divides the accumulated gradients by the number of micro-batches (its default
``scale_grads``), so a step's gradients are those of the mean over the rank's batch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining.schedules import _PipelineSchedule
from torch.distributed.pipelining.stage import _make_tensor_from_meta, _RecvInfo

from autopar.core.specs import Schedule
from autopar.core.stages import gathered_stages
from autopar.core.plan import Plan
from autopar.core.mesh import MeshAxis

StageShapes = dict[int, tuple[torch.Tensor, torch.Tensor]]
"""Per stage index: an example input and output of one micro-batch (shape and dtype)."""


class InterleavedSchedule(ScheduleInterleaved1F1B):
    """torch's interleaved 1F1B, its order lowered with ``gathered_stages`` stages gathered.

    torch's lowering lets a stage's gathered parameters go whenever the stage is not among the
    next three to compute, and gathers them again at its next use: with more than three chunks
    a rank, a ZeRO-1 step all-gathers its parameters many times (gpt-175b on 1024 A100s, six
    chunks a rank and 48 micro-batches: 43 gathers a rank, not 6) and holds fewer of them than
    the plan prices (its dry run read 8-10 % under). The order, the sends and the gradient
    reductions are torch's own."""

    def __init__(self, stages: list[PipelineStage], n_microbatches: int,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 gathered: int) -> None:
        self._gathered = gathered
        super().__init__(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)

    def _prepare_schedule_with_comms(self, actions, format="compute_only"):  # noqa: A002
        from torch.distributed.pipelining import schedules

        torch_lowering = schedules._add_unshard_reshard
        schedules._add_unshard_reshard = functools.partial(
            torch_lowering, max_active_stages=self._gathered)
        try:
            super()._prepare_schedule_with_comms(actions, format)
        finally:
            schedules._add_unshard_reshard = torch_lowering


SCHEDULES = {Schedule.GPIPE: ScheduleGPipe, Schedule.ONE_F_ONE_B: Schedule1F1B,
             Schedule.INTERLEAVED: InterleavedSchedule}


class InFlightStage(PipelineStage):
    """A ``PipelineStage`` whose receive buffers exist only while their micro-batch is in flight.

    torch's stage allocates, when it first runs, one activation and one gradient receive buffer
    for *every* micro-batch of the step and keeps them all (``_setup_forward_recv_info`` /
    ``_create_grad_recv_info``): a middle stage of Megatron's 530B run (280 micro-batches) would
    hold 560 of them. Here the setup allocates none (it asks torch for one micro-batch's receive
    infos and copies them without their buffer); a buffer is made when its receive is posted
    and let go after the micro-batch's backward (after its forward when the stage has none), so
    a rank holds the buffers of the micro-batches in flight, as Megatron's schedules do. The activation buffer is
    the stage's input, which the forward keeps for the backward anyway. The last stage's losses,
    which the schedule keeps for the caller until the step ends, are detached after their
    backward, so their graphs do not keep every micro-batch's input alive that long."""

    def _setup_forward_recv_info(self, num_microbatches: int, has_backward: bool) -> None:
        # torch's infos for one micro-batch (one buffer, dropped), unallocated for every one
        super()._setup_forward_recv_info(1, has_backward)
        one = self.args_recv_info[0]
        for chunk in range(num_microbatches):
            self.args_recv_info[chunk] = _unallocated(one)

    def _setup_backward_recv_info(self, num_microbatches: int) -> None:
        super()._setup_backward_recv_info(1)
        one = self.grad_recv_info[0]
        self.chunks = num_microbatches  # what torch's setup records of the step
        for chunk in range(num_microbatches):
            self.grad_recv_info[chunk] = _unallocated(one)

    def _get_recv_ops(self, recv_infos: tuple[_RecvInfo, ...]) -> list:
        for info in recv_infos:
            if not info.is_root_arg and info.buffer is None and info.tensor_meta is not None:
                info.buffer = _make_tensor_from_meta(info.tensor_meta, self.device)
        return super()._get_recv_ops(recv_infos)

    def forward_one_chunk(self, fwd_chunk_id: int, *args, **kwargs):
        output = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        if not self.has_backward:
            _release(self.args_recv_info.get(fwd_chunk_id, ()))
        return output

    def backward_one_chunk(self, bwd_chunk_id: int, *args, loss=None, **kwargs) -> None:
        super().backward_one_chunk(bwd_chunk_id, *args, loss=loss, **kwargs)
        _release(self.args_recv_info.get(bwd_chunk_id, ()))
        _release(self.grad_recv_info.get(bwd_chunk_id, ()))
        if isinstance(loss, torch.Tensor) and not loss._is_view():
            # the schedule keeps every micro-batch's loss until the step ends, to hand them to
            # the caller; left attached, its graph (through the input's AccumulateGrad node)
            # would keep the micro-batch's received activation alive that long: one per
            # micro-batch of the step on the last stage
            loss.detach_()


def _unallocated(infos: tuple[_RecvInfo, ...]) -> tuple[_RecvInfo, ...]:
    """The same receives, each without a buffer (made when the receive is posted)."""
    return tuple(_RecvInfo(i.input_name, i.source, None, i.tensor_meta, is_root_arg=i.is_root_arg)
                 for i in infos)


def _release(infos: tuple[_RecvInfo, ...]) -> None:
    """Drop the stage's reference to each received tensor (autograd keeps what it still needs)."""
    for info in infos:
        if not info.is_root_arg:
            info.buffer = None


def build_schedule(stages: list[tuple[int, nn.Module]], num_stages: int, plan: Plan,
                   mesh: DeviceMesh, device: torch.device,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   shapes: StageShapes | None = None) -> _PipelineSchedule:
    """The plan's schedule over this rank's ``stages`` (index, module). With ``shapes`` (stage
    index -> example input and output of one micro-batch) the stages are built with their
    shapes given, so the schedule runs no forward to learn them (``PipelineStage``'s static
    mode); without, they learn them from the first micro-batch."""
    group = mesh[MeshAxis.PP.value].get_group()
    shapes = shapes or {}
    pipe = [InFlightStage(module, index, num_stages, device, group=group,
                          input_args=shapes.get(index, (None, None))[0],
                          output_args=shapes.get(index, (None, None))[1])
            for index, module in stages]
    m = plan.config.microbatches(plan.train)
    cls = SCHEDULES[plan.config.schedule]
    if cls is InterleavedSchedule:
        return cls(pipe, n_microbatches=m, loss_fn=loss_fn,
                   gathered=gathered_stages(plan.config.zero, len(pipe)))
    return cls(pipe[0], n_microbatches=m, loss_fn=loss_fn)
