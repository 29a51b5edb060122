"""What a rank holds in memory: its peak (process RSS on CPU, CUDA max allocated on GPU) and the
bytes of parameters, gradients and optimizer state it owns (the figures sharding shrinks)."""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch import nn


class PeakMemory:
    """Peak memory of this rank, sampled once per step (a /proc read on CPU: microseconds)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._peak = 0
        self._process: Any = None
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        else:
            import psutil

            self._process = psutil.Process()

    def sample(self) -> None:
        if self._process is not None:
            self._peak = max(self._peak, self._process.memory_info().rss)

    def peak_bytes(self) -> int:
        if self._device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self._device))
        self.sample()
        return self._peak

    @property
    def kind(self) -> str:
        return "cuda_max_allocated" if self._device.type == "cuda" else "process_rss"


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> Dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank holds (local shards only)."""
    def size(t: Any) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    params = list(model.parameters())
    opt = sum(size(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    return {
        "param_bytes": sum(size(p) for p in params),
        "grad_bytes": sum(size(p.grad) for p in params if p.grad is not None),
        "optimizer_bytes": opt,
    }
