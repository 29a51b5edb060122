"""Rank 0's console: a live progress bar on a terminal, plain periodic lines otherwise (CI logs)."""

from __future__ import annotations

import sys
import time
from typing import Any, Dict, Optional, Tuple

from launcher.runtime import formatting


def use_bar(style: str) -> bool:
    """metrics.progress: 'bar', 'lines', or 'auto' (a bar only when stdout is a terminal)."""
    if style == "auto":
        return sys.stdout.isatty()
    return style == "bar"


class Pace:
    """The time left, at the pace of the steps themselves: from the first logged step on, not from the start (model
    building and a first step that imports, compiles or warms up would make a short job's first ETA minutes long)."""

    def __init__(self) -> None:
        self.first: Optional[Tuple[int, float]] = None  # (step, time.monotonic()) of the first logged step

    def eta(self, step: int, total: int, step_time_s: Optional[float] = None, now: Optional[float] = None) -> Optional[float]:
        now = time.monotonic() if now is None else now
        if self.first is None:
            self.first = (step, now)
        first_step, first_at = self.first
        if step > first_step and now > first_at:
            return max(0.0, (total - step) * (now - first_at) / (step - first_step))
        return max(0.0, (total - step) * step_time_s) if step_time_s else None


def format_eta(seconds: Optional[float]) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class ProgressBar:
    """A rich progress bar: step, loss, samples/s and ETA, redrawn at each logged step."""

    def __init__(self, total_steps: int) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.fields[stats]}"),
            TextColumn("ETA"), TimeRemainingColumn(), transient=False,
        )
        self._task = self._progress.add_task("train", total=total_steps, stats="")
        self._progress.start()

    def log(self, metrics: Dict[str, Any]) -> None:
        stats = f"loss {formatting.loss(metrics['loss'])} {formatting.rate(metrics['samples_per_s'])} samples/s"
        self._progress.update(self._task, completed=metrics["step"], stats=stats)

    def log_summary(self, summary: Dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        self._progress.stop()
