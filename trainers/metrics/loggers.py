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

from launcher.runtime import env, formatting, safefs
from launcher.runtime.config import config_record
from launcher.runtime.diskspace import disk_full, full_while_writing
from launcher.runtime.wandb_logger import WandbLogger, job_labels, wandb_enabled
from .progress import Pace, ProgressBar, format_eta, use_bar


class MetricsLogger(Protocol):
    def log(self, metrics: Dict[str, Any]) -> None: ...

    def log_summary(self, summary: Dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class NullLogger:
    def log(self, metrics: Dict[str, Any]) -> None:
        pass

    def log_summary(self, summary: Dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class JsonlLogger:
    """Appends one JSON object per logged step to metrics.jsonl, flushed line by line."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path, self._full = path, False
        self._file = safefs.open_file(str(path), "a", root=str(path.parent), encoding="utf-8")  # never through a link

    def log(self, metrics: Dict[str, Any]) -> None:
        try:
            self._file.write(json.dumps(metrics) + "\n")
            self._file.flush()
        except OSError as e:
            full = disk_full(e)
            if full is None:
                raise
            self._full = True
            raise full_while_writing("metrics to", self._path, full) from None

    def log_summary(self, summary: Dict[str, Any]) -> None:
        pass  # the launcher writes summary.json from rank 0's result

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            if not self._full:
                raise  # else: the line that did not fit is what log() reported


class ConsoleLogger:
    """Plain periodic lines, one per logged step."""

    def __init__(self, total_steps: int) -> None:
        self._total = total_steps
        self._pace = Pace()

    def log(self, metrics: Dict[str, Any]) -> None:
        eta = self._pace.eta(metrics["step"], self._total, metrics.get("step_time_s"))
        straggler = metrics.get("straggler_rank")
        print(
            f"step {metrics['step']}/{self._total} loss {formatting.loss(metrics['loss'])} "
            f"{formatting.rate(metrics['samples_per_s'])} samples/s {metrics['step_time_s'] * 1000:.1f} ms/step"
            + (f" comm {formatting.share(metrics['comm_share'])}" if "comm_share" in metrics else "")
            + (f" straggler: rank {straggler} ({metrics['slowest_rank_lag']:.0%} slower)" if straggler is not None else "")
            + f" ETA {format_eta(eta)}",
            file=sys.stdout,
            flush=True,
        )

    def log_summary(self, summary: Dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class LoggerGroup:
    def __init__(self, loggers: List[MetricsLogger]) -> None:
        self._loggers = loggers

    def log(self, metrics: Dict[str, Any]) -> None:
        for logger in self._loggers:
            logger.log(metrics)

    def log_summary(self, summary: Dict[str, Any]) -> None:
        for logger in self._loggers:
            logger.log_summary(summary)

    def close(self) -> None:
        for logger in self._loggers:
            logger.close()


def build_loggers(rank: int, run_dir: Optional[str], total_steps: int, cfg: Any = None) -> MetricsLogger:
    """Rank 0 gets the console (bar or lines), metrics.jsonl and W&B (unless disabled); others nothing."""
    if rank != 0:
        return NullLogger()
    style = cfg.metrics.progress if cfg is not None else "lines"
    loggers: List[MetricsLogger] = [ProgressBar(total_steps) if use_bar(style) else ConsoleLogger(total_steps)]
    if run_dir:
        loggers.append(JsonlLogger(Path(run_dir) / "metrics.jsonl"))
    if cfg is not None and wandb_enabled(cfg.wandb):
        loggers.append(WandbLogger(cfg.wandb, config_record(cfg), run_dir, job_labels(cfg, run_dir)))
    return LoggerGroup(loggers)


def run_dir_from_env() -> Optional[str]:
    return os.environ.get(env.RUN_DIR) or None
