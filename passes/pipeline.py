"""Pipeline schedules from ``torch.distributed.pipelining`` for a rank's stages.

``ScheduleGPipe`` and ``Schedule1F1B`` run one stage per rank; ``ScheduleInterleaved1F1B`` runs
the rank's ``virtual_stages`` chunks. The loss function is the per-micro-batch mean; the
schedule divides the accumulated gradients by the number of micro-batches (its default
``scale_grads``), so a step's gradients are those of the mean over the rank's batch.
"""

from __future__ import annotations

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

from autopar.core.specs import Schedule
from autopar.core.plan import Plan
from autopar.core.mesh import MeshAxis

StageShapes = dict[int, tuple[torch.Tensor, torch.Tensor]]
"""Per stage index: an example input and output of one micro-batch (shape and dtype)."""

SCHEDULES = {Schedule.GPIPE: ScheduleGPipe, Schedule.ONE_F_ONE_B: Schedule1F1B,
             Schedule.INTERLEAVED: ScheduleInterleaved1F1B}


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
    pipe = [PipelineStage(module, index, num_stages, device, group=group,
                          input_args=shapes.get(index, (None, None))[0],
                          output_args=shapes.get(index, (None, None))[1])
            for index, module in stages]
    m = plan.config.microbatches(plan.train)
    cls = SCHEDULES[plan.config.schedule]
    if cls is ScheduleInterleaved1F1B:
        return cls(pipe, n_microbatches=m, loss_fn=loss_fn)
    return cls(pipe[0], n_microbatches=m, loss_fn=loss_fn)
