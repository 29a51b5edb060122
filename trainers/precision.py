"""Mixed precision: torch.autocast on the worker's device type, and a gradient scaler for fp16.

bf16 keeps fp32's exponent range, so it needs no loss scaling; fp16 does (small gradients
underflow), which is why fp16 comes with a GradScaler and is offered on CUDA only.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional

import torch

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
SHARDED = ("fsdp", "tensor")  # gradients are DTensor shards: the scaler must agree on inf/nan across ranks


def resolve_precision(asked: str, device: torch.device) -> str:
    """auto: bf16 on a GPU that supports it (Ampere or newer), else fp32 (CPU bf16 is slow without AMX)."""
    if asked != "auto":
        return asked
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "fp32"


class Precision:
    """What a training step needs from the precision setting: an autocast context and a scaler."""

    def __init__(self, name: str, device: torch.device, strategy: str) -> None:
        self.name = name
        self.device_type = device.type
        self.dtype: Optional[torch.dtype] = DTYPES[name]
        self.scaler: Any = None
        if name == "fp16":
            if device.type != "cuda":  # the plan rejects this first; a direct torchrun gets it here
                raise ValueError("trainer.precision=fp16 needs CUDA: use trainer.precision=bf16 or fp32")
            self.scaler = _make_scaler(strategy)

    def autocast(self) -> ContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Gradients back to their true size, before they are clipped or their norm is read."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The scaler skips the step when gradients overflowed, and adapts its scale."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def loss_scale(self) -> Optional[float]:
        return float(self.scaler.get_scale()) if self.scaler is not None else None


def _make_scaler(strategy: str) -> Any:
    if strategy in SHARDED:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler()
    return torch.amp.GradScaler("cuda")
