"""Where logs go: one file per global rank under <run_dir>/logs/, and the launcher's own log."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Dict

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std

class RunDirLogsSpecs(LogsSpecs):
    """Where each rank's log goes: logs/rank-<global rank>.log (launcher.streams writes it and the console).

    A restarted attempt writes logs/rank-<k>.attempt-<n>.log so the first failure stays readable.
    """

    def __init__(self, log_dir: Path) -> None:
        super().__init__(str(log_dir), Std.NONE, Std.NONE, None)
        self._log_dir = log_dir
        # where this node's workers ran, as the agent assigned it: group_rank, ranks, world_size
        self.placement: Dict[str, Any] = {}

    @property
    def root_log_dir(self) -> str:
        return str(self._log_dir)

    def reify(self, envs: Dict[int, Dict[str, str]]) -> LogsDest:
        stdouts, stderrs, errors = {}, {}, {}
        first = next(iter(envs.values()), {})
        self.placement = {"group_rank": int(first.get("GROUP_RANK", 0)), "world_size": int(first.get("WORLD_SIZE", 0)),
                          "ranks": sorted(int(env["RANK"]) for env in envs.values())}
        for local_rank, env in envs.items():
            rank, attempt = env["RANK"], int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
            suffix = "" if attempt == 0 else f".attempt-{attempt}"
            stdouts[local_rank] = str(self._log_dir / f"rank-{rank}{suffix}.log")
            stderrs[local_rank] = ""  # the same file: both streams, in the order they came
            errors[local_rank] = str(self._log_dir / f"rank-{rank}{suffix}.error.json")
            env["TORCHELASTIC_ERROR_FILE"] = errors[local_rank]
            if os.path.exists(errors[local_rank]):
                os.unlink(errors[local_rank])
        return LogsDest(stdouts, stderrs, {}, {}, errors, os.devnull, os.devnull)  # no tee: launcher.streams shows them


def setup_launcher_logging(log_file: Path | None, verbose: bool = False) -> logging.Logger:
    """Our messages to the console; torch elastic's chatter only to the launcher's log file."""
    log = logging.getLogger("launcher")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    for handler in list(log.handlers):
        log.removeHandler(handler)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("[launcher] %(message)s"))
    console.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.addHandler(console)
    torch_loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    for torch_log in torch_loggers:
        torch_log.propagate = False
        torch_log.setLevel(logging.INFO)
        for handler in list(torch_log.handlers):
            torch_log.removeHandler(handler)
    if log_file is not None:
        file_handler = logging.FileHandler(log_file)
        file_handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
        log.addHandler(file_handler)
        for torch_log in torch_loggers:
            torch_log.addHandler(file_handler)
    return log
