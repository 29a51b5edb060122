"""What a rank holds in memory: its peak (process RSS on CPU, CUDA max allocated on GPU) and the
bytes of parameters, gradients and optimizer state it owns (the figures sharding shrinks)."""

from __future__ import annotations

import functools
import os
from typing import Any, Dict

import torch
from torch import nn


@functools.lru_cache(maxsize=4)
def _psutil_process(pid: int) -> Any:
    import psutil

    return psutil.Process(pid)  # building one reads /proc: made once (keyed by pid: forked workers get their own)


def this_process() -> Any:
    """psutil's handle on this process, made once per process."""
    return _psutil_process(os.getpid())


def rss_peak_bytes() -> int:
    """This process's peak resident memory since it started (or was forked).

    The kernel's own high-water mark (VmHWM in /proc/self/status) on Linux: exact, with nothing to
    sample each step. It starts again at fork and at exec, so a worker never inherits its agent's
    peak. Elsewhere, the current RSS from psutil (a lower bound of the peak).
    """
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return int(this_process().memory_info().rss)


class PeakMemory:
    """Peak memory of this rank: CUDA max allocated on GPU, peak process RSS on CPU. Nothing per step."""

    def __init__(self, device: torch.device) -> None:
        self._device = device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def peak_bytes(self) -> int:
        if self._device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self._device))
        return rss_peak_bytes()

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
