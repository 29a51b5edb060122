"""Pipeline parallelism with torch.distributed.pipelining, combined with data parallelism.

Ranks form a (dp, pp) mesh: each row of ``pp`` ranks is one pipeline holding the whole model in
``pp`` stages; the ``dp`` pipelines read different data and average their gradients.
"""

from __future__ import annotations

from typing import Any, List

import torch
import torch.distributed as dist
from torch import nn

from ..models import Layered, loss_fn


class StageModule(Layered):
    """A contiguous slice of a model: the stem on the first stage, the head on the last."""

    def __init__(self, model: Layered, first: int, last: int, is_first: bool, is_last: bool) -> None:
        super().__init__()
        self.stem = model.stem if is_first else nn.Identity()
        self.blocks = nn.ModuleList(model.blocks[first:last])
        self.head = model.head if is_last else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class PipelineModel(nn.Module):
    """This rank's stage plus the schedule that drives it; ``train_step`` replaces forward/backward."""

    def __init__(self, stage_module: StageModule, schedule: Any, stage_index: int, stages: int,
                 pp_group: Any, dp_group: Any, dp_size: int) -> None:
        super().__init__()
        self.stage_module = stage_module
        self.schedule, self.stage_index, self.stages = schedule, stage_index, stages
        self.pp_group, self.dp_group, self.dp_size = pp_group, dp_group, dp_size

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses: List[torch.Tensor] = []
        first, last = self.stage_index == 0, self.stage_index == self.stages - 1
        args = (x,) if first else ()
        kwargs = {"target": y, "losses": losses} if last else {}
        self.schedule.step(*args, **kwargs)  # gradients are averaged over microbatches (scale_grads)
        if self.dp_size > 1:  # average gradients across the pipelines, like DDP would
            for p in self.stage_module.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad, group=self.dp_group)
                    p.grad.div_(self.dp_size)
        loss = torch.stack(losses).mean().detach() if last else torch.zeros((), device=x.device)
        if self.stages > 1:  # every rank reports its pipeline's loss, so averaging across ranks stays right
            dist.broadcast(loss, group=self.pp_group, group_src=self.stages - 1)
        return loss


def stage_bounds(blocks: int, stages: int, index: int) -> tuple[int, int]:
    """Blocks [first, last) of stage ``index``; the first stages take one more when it does not divide."""
    base, extra = divmod(blocks, stages)
    first = index * base + min(index, extra)
    return first, first + base + (1 if index < extra else 0)


def parallelize_pipeline(model: Layered, device: torch.device, cfg: Any) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    world = dist.get_world_size()
    stages = cfg.trainer.pipeline.stages or world
    mesh = init_device_mesh(device.type, (world // stages, stages), mesh_dim_names=("dp", "pp"))
    index = mesh.get_local_rank("pp")
    first, last = stage_bounds(len(model.blocks), stages, index)
    module = StageModule(model, first, last, index == 0, index == stages - 1).to(device)
    pp_group = mesh.get_group("pp")
    stage = PipelineStage(module, index, stages, device, group=pp_group)
    schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[cfg.trainer.pipeline.schedule]
    schedule = schedule_cls(stage, n_microbatches=cfg.trainer.pipeline.microbatches, loss_fn=loss_fn)
    return PipelineModel(module, schedule, index, stages, pp_group, mesh.get_group("dp"), world // stages)


def pipeline_layout(cfg: Any, rank: int, world: int, layout: Any) -> Any:
    """Ranks of one pipeline read the same shard: the shard of their data-parallel index."""
    stages = cfg.trainer.pipeline.stages or world
    dp_index, dp_size = rank // stages, world // stages
    replicas = [[d * stages + s for d in range(dp_size)] for s in range(stages)]  # the same stage in every pipeline
    pipe = cfg.trainer.pipeline
    note = f"{stages} stages x {dp_size} data-parallel pipelines, {pipe.schedule}, {pipe.microbatches} microbatches"
    return layout(dp_index, dp_size, cfg.data.batch_size * stages, replicas, note)
