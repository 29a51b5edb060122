"""Model FLOPs utilisation: FLOPs counted by torch's FlopCounterMode over the device's peak.

Only on CUDA devices whose peak is in the table below; anywhere else MFU is left out and
``mfu_note`` says why, so a reported MFU is always a real percentage in 0-100.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

# Dense peak FLOP/s per device (vendor datasheets), by matmul precision; matched by substring of
# torch.cuda.get_device_name(), first match wins, so more specific names come first.
PEAK_FLOPS: Tuple[Tuple[str, Dict[str, float]], ...] = (
    ("H100 PCIe", {"fp32": 51e12, "tf32": 378e12, "bf16": 756e12}),
    ("H100", {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12}),  # SXM / HBM3
    ("H200", {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12}),
    ("A100", {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12}),
    ("L4", {"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12}),
    ("A10G", {"fp32": 31.2e12, "tf32": 62.5e12, "bf16": 125e12}),
    ("V100", {"fp32": 15.7e12, "tf32": 15.7e12, "bf16": 125e12}),  # no bf16: fp16 tensor cores
)


def peak_flops(device_name: str, precision: str) -> Optional[float]:
    for key, peaks in PEAK_FLOPS:
        if key in device_name:
            return peaks.get(precision)
    return None


def matmul_precision(dtype: torch.dtype) -> str:
    """Which peak applies: half precision, TF32 when torch allows it for fp32 matmuls, else fp32."""
    if dtype in (torch.bfloat16, torch.float16):
        return "bf16"
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"


def mfu_percent(flops_per_step: float, step_time_s: float, peak: float) -> Optional[float]:
    """Achieved / peak as a percentage, or None when the figures cannot be a utilisation."""
    if flops_per_step <= 0 or step_time_s <= 0 or peak <= 0:
        return None
    value = 100.0 * flops_per_step / step_time_s / peak
    return value if 0.0 <= value <= 100.0 else None


class FlopCount:
    """Counts one training step's forward+backward FLOPs on this rank, once (the first step)."""

    def __init__(self, enabled: bool, dtype: Optional[torch.dtype] = None) -> None:
        """dtype: the autocast dtype the step's matmuls run in (None: the parameters' fp32). Given,
        not read inside the step: the count closes after forward, outside the autocast region, so
        reading it there always said fp32 and set bf16 runs against the fp32 peak (seen on an H100)."""
        self.enabled = enabled
        self.flops: Optional[int] = None
        self.dtype = dtype or torch.float32
        self._mode: Any = None

    def begin(self) -> None:
        if self.enabled and self.flops is None and self._mode is None:
            from torch.utils.flop_counter import FlopCounterMode

            self._mode = FlopCounterMode(display=False)
            self._mode.__enter__()

    def finish(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self.flops = int(self._mode.get_total_flops())
            self._mode = None


def mfu_figures(count: FlopCount, step_time_s: float, device: torch.device) -> Dict[str, Any]:
    if device.type != "cuda":
        return {"mfu_note": "MFU is measured on CUDA devices only (no FLOP/s peak for CPUs)"}
    name = torch.cuda.get_device_name(device)
    precision = matmul_precision(count.dtype)
    peak = peak_flops(name, precision)
    if peak is None:
        return {"mfu_note": f"no known {precision} peak for '{name}': add it to trainers/metrics/mfu.py PEAK_FLOPS"}
    if not count.flops:
        return {"mfu_note": "no FLOPs counted (the model ran no ops FlopCounterMode knows)"}
    value = mfu_percent(count.flops, step_time_s, peak)
    if value is None:
        return {"mfu_note": f"counted FLOPs give a utilisation outside 0-100% of the {precision} peak of '{name}'"}
    return {"mfu_percent": value, "flops_per_step": count.flops, "peak_flops": peak}
