"""Parallelism strategies: each is ``parallelize(model, device, cfg) -> model``, readable side by side.

Every strategy trains the same model on the same global batch (``data.batch_size`` x workers);
``data_layout`` says which shard of the data each process reads so that the math stays the
same. The pipeline strategy lives in trainers/parallel/pipeline.py (it needs its own training step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ..models import CNN, GPT, MLP, Layered
from .pipeline import parallelize_pipeline, pipeline_layout


def parallelize_ddp(model: nn.Module, device: torch.device, cfg: Any) -> nn.Module:
    """Replicate the model; DDP averages gradients with an all-reduce during backward."""
    model = model.to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def parallelize_dp(model: nn.Module, device: torch.device, cfg: Any) -> nn.Module:
    """One process drives every GPU of its node: DataParallel scatters each batch and gathers outputs.

    Without CUDA there is nothing to scatter to: DataParallel just calls the module on the CPU.
    """
    device_ids = list(range(cfg.gpus)) if device.type == "cuda" else None
    return nn.DataParallel(model.to(device), device_ids=device_ids)


def parallelize_fsdp(model: Layered, device: torch.device, cfg: Any) -> nn.Module:
    """FSDP2: every block's parameters, gradients and optimizer state are sharded over the ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    model = model.to(device)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)  # the root: stem and head, and the one call that drives the rest
    return model


def parallelize_tensor(model: nn.Module, device: torch.device, cfg: Any) -> nn.Module:
    """Megatron-style tensor parallel: column-wise then row-wise linear pairs, one all-reduce per pair."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    return parallelize_module(model.to(device), mesh, tensor_plan(model))


def tensor_plan(model: nn.Module) -> Dict[str, Any]:
    """Which linear layers are split by output (column) or input (row); the rest stay replicated."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: Dict[str, Any] = {}
    if isinstance(model, GPT):
        for i in range(len(model.blocks)):
            for name in ("attn.q", "attn.k", "attn.v", "mlp.up"):  # heads and the FFN width are split
                plan[f"blocks.{i}.{name}"] = ColwiseParallel()
            plan[f"blocks.{i}.attn.out"] = RowwiseParallel()
            plan[f"blocks.{i}.mlp.down"] = RowwiseParallel()
    elif isinstance(model, MLP):
        for i in range(0, len(model.blocks) - 1, 2):  # ReLU is elementwise, so it runs on the shards
            plan[f"blocks.{i}.0"] = ColwiseParallel()
            plan[f"blocks.{i + 1}.0"] = RowwiseParallel()
    elif isinstance(model, CNN):
        plan["head.fc1"], plan["head.fc2"] = ColwiseParallel(), RowwiseParallel()
    return plan


class NaiveModelParallel(nn.Module):
    """The textbook split: consecutive layers on consecutive devices, activations copied between them.

    Only one device computes at a time; pipelining exists to fix that.
    """

    def __init__(self, model: Layered, devices: List[torch.device]) -> None:
        super().__init__()
        self.model, self.devices = model, devices
        self.placement = [devices[min(i * len(devices) // len(model.blocks), len(devices) - 1)]
                          for i in range(len(model.blocks))]
        model.stem.to(devices[0])
        for block, dev in zip(model.blocks, self.placement):
            block.to(dev)
        model.head.to(devices[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.model.stem(x.to(self.devices[0]))
        for block, dev in zip(self.model.blocks, self.placement):
            x = block(x.to(dev))
        return self.model.head(x.to(self.devices[-1]))


def parallelize_naive_mp(model: Layered, device: torch.device, cfg: Any) -> nn.Module:
    count = cfg.gpus if device.type == "cuda" else 1
    devices = [torch.device("cuda", i) for i in range(count)] if device.type == "cuda" else [device]
    return NaiveModelParallel(model, devices)


STRATEGIES: Dict[str, Callable[[Layered, torch.device, Any], nn.Module]] = {
    "dp": parallelize_dp,
    "ddp": parallelize_ddp,
    "fsdp": parallelize_fsdp,
    "pipeline": parallelize_pipeline,
    "tensor": parallelize_tensor,
    "naive_mp": parallelize_naive_mp,
}


@dataclass(frozen=True)
class DataLayout:
    """Which shard of the data this process reads, and how many samples per step."""

    shard_rank: int
    shard_count: int
    batch_size: int  # samples this process feeds per step
    replica_groups: List[List[int]]  # ranks that must end with identical parameters
    note: str = ""  # what a user should know about how this strategy ran here


def data_layout(cfg: Any, rank: int, world: int, device: torch.device) -> DataLayout:
    strategy, bs = cfg.trainer.strategy, cfg.data.batch_size
    everyone = [list(range(world))]
    if strategy in ("dp", "naive_mp"):
        # one process per node stands in for cfg.gpus workers: it takes their whole batch
        gpus = device.type == "cuda"
        what = {"dp": f"DataParallel over {cfg.gpus} GPUs" if gpus else "DataParallel on the CPU only (no GPU: nothing to scatter to)",
                "naive_mp": f"layers split over {cfg.gpus} GPUs" if gpus else "all layers on the one CPU device (no GPU to split over)"}
        return DataLayout(rank, world, bs * cfg.gpus, everyone, f"1 process per node; {what[strategy]}")
    if strategy == "tensor":  # every rank computes a slice of the same batch
        return DataLayout(0, 1, bs * world, everyone, f"tensor parallel over {world} ranks")
    if strategy == "pipeline":
        return pipeline_layout(cfg, rank, world, DataLayout)
    return DataLayout(rank, world, bs, everyone)


