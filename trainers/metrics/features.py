"""Figures the training-loop features add to metrics and the summary: data-loading wait, gradient
norm, precision, accumulation, compile time and loader settings."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

import torch

from launcher.runtime import torch_private


class FeatureTimes:
    """Per-step figures from ``StepResult``s, for the metrics window and the run summary."""

    def __init__(self) -> None:
        self.data_wait_s: List[float] = []
        self.grad_norm_first: Optional[float] = None
        self._grad_norm_last: Any = None  # a device tensor, read only when reported
        self.output_dtype: Any = None

    def add(self, result: Any) -> None:
        self.data_wait_s.append(result.data_wait_s)
        if result.grad_norm is not None:
            if self.grad_norm_first is None:
                self.grad_norm_first = float(result.grad_norm)
            self._grad_norm_last = result.grad_norm
        self.output_dtype = result.output_dtype or self.output_dtype

    @property
    def grad_norm_last(self) -> Optional[float]:
        return float(self._grad_norm_last) if self._grad_norm_last is not None else None

    def window(self, steps: int, precision: Any) -> Dict[str, Any]:
        """Means over the steps since the last logged line."""
        waits = self.data_wait_s[-steps:]
        figures: Dict[str, Any] = {"data_wait_s": sum(waits) / len(waits), "grad_norm": self.grad_norm_last}
        if precision.loss_scale() is not None:
            figures["loss_scale"] = precision.loss_scale()
        return figures


def loader_settings(cfg: Any, device: torch.device, rank: int) -> Dict[str, Any]:
    """DataLoader processes and pinned memory for this device ("auto" resolved here, per device)."""
    pin = resolve_pin_memory(cfg.data.pin_memory, device.type)
    if cfg.data.pin_memory and not pin and rank == 0:
        print("data.pin_memory=true ignored: no CUDA device to copy to", flush=True)
    return {"num_workers": resolve_num_workers(cfg.data.num_workers, device.type), "pin_memory": pin}


def feature_summary(cfg: Any, layout: Any, precision: Any, times: FeatureTimes, step_times: List[float],
                    steady_median: Optional[float]) -> Dict[str, Any]:
    """Summary figures: what ran, the effective batch, compile time apart from the steady state."""
    accum = cfg.trainer.grad_accum_steps
    settings = loader_settings(cfg, torch.device(precision.device_type), rank=-1)
    first = step_times[0] if step_times else None
    waits = times.data_wait_s
    return {
        "precision": precision.name,
        "activation_dtype": str(times.output_dtype).replace("torch.", "") if times.output_dtype else None,
        "grad_accum_steps": accum,
        "micro_batch_size": layout.batch_size,
        "effective_global_batch_size": layout.batch_size * layout.shard_count * accum,
        "activation_checkpointing": cfg.trainer.activation_checkpointing,
        "compile": cfg.trainer.compile,
        "first_step_time_s": first,
        # the first step pays for compilation (and allocator warm-up); the steady median does not
        "compile_time_s": (max(0.0, first - steady_median)
                           if cfg.trainer.compile and first is not None and steady_median is not None else None),
        "compiled_graphs": _compiled_graphs() if cfg.trainer.compile else None,
        "max_grad_norm": cfg.trainer.max_grad_norm,
        "grad_norm_first": times.grad_norm_first,
        "grad_norm_last": times.grad_norm_last,
        "data_wait_s_median": statistics.median(waits) if waits else None,
        "data_wait_share": sum(waits) / sum(step_times) if step_times and sum(step_times) > 0 else None,
        "loader_num_workers": settings["num_workers"],
        "pin_memory": settings["pin_memory"],
        "loss_scale": precision.loss_scale(),
    }


def _compiled_graphs() -> int:
    """Graphs dynamo captured in this process: 0 would mean compile silently did nothing."""
    return int(torch_private.dynamo_counters()["stats"]["unique_graphs"])


def resolve_num_workers(asked: int, device_type: str) -> int:
    """-1 = auto: loader processes help overlap loading with GPU compute; on CPU they compete for the cores."""
    if asked >= 0:
        return asked
    return 2 if device_type == "cuda" else 0


def resolve_pin_memory(asked: Any, device_type: str) -> bool:
    """Pinned memory only helps host-to-GPU copies; without CUDA it is meaningless."""
    return device_type == "cuda" and asked is not False
