"""Parallelism strategies: each is ``parallelize(model, device, cfg) -> model``."""

from __future__ import annotations

from typing import Any, Callable, Dict

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def parallelize_ddp(model: nn.Module, device: torch.device, cfg: Any) -> nn.Module:
    """Replicate the model; DDP averages gradients with an all-reduce during backward."""
    model = model.to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


STRATEGIES: Dict[str, Callable[[nn.Module, torch.device, Any], nn.Module]] = {
    "ddp": parallelize_ddp,
}
