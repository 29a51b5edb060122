"""Metric loggers: one protocol, a null object for non-logging ranks, JSONL as the full record.

The logging rank is chosen once, in ``build_loggers``; the training loop calls ``log`` on every
rank without asking who it is.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol


class MetricsLogger(Protocol):
    def log(self, metrics: Dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class NullLogger:
    def log(self, metrics: Dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlLogger:
    """Appends one JSON object per logged step to metrics.jsonl, flushed line by line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")

    def log(self, metrics: Dict[str, Any]) -> None:
        self._file.write(json.dumps(metrics) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class ConsoleLogger:
    """Plain periodic lines, one per logged step."""

    def __init__(self, total_steps: int) -> None:
        self._total = total_steps

    def log(self, metrics: Dict[str, Any]) -> None:
        print(
            f"step {metrics['step']}/{self._total} loss {metrics['loss']:.4f} "
            f"{metrics['samples_per_s']:.0f} samples/s {metrics['step_time_s'] * 1000:.1f} ms/step",
            file=sys.stdout,
            flush=True,
        )

    def close(self) -> None:
        pass


class LoggerGroup:
    def __init__(self, loggers: List[MetricsLogger]) -> None:
        self._loggers = loggers

    def log(self, metrics: Dict[str, Any]) -> None:
        for logger in self._loggers:
            logger.log(metrics)

    def close(self) -> None:
        for logger in self._loggers:
            logger.close()


def build_loggers(rank: int, run_dir: Optional[str], total_steps: int) -> MetricsLogger:
    if rank != 0:
        return NullLogger()
    loggers: List[MetricsLogger] = [ConsoleLogger(total_steps)]
    if run_dir:
        loggers.append(JsonlLogger(Path(run_dir) / "metrics.jsonl"))
    return LoggerGroup(loggers)


def run_dir_from_env() -> Optional[str]:
    return os.environ.get("LAUNCHER_RUN_DIR") or None
