"""Where the workers' logs go: one file per global rank under <run_dir>/logs/ (torch's LogsSpecs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs, Std

from launcher.runtime.env import ATTEMPT


class RunDirLogsSpecs(LogsSpecs):
    """Where each rank's log goes: logs/rank-<global rank>.log (launcher.agent.streams writes it and the console).

    A later attempt writes logs/rank-<k>.attempt-<n>.log so the first failure stays readable; n is the
    launcher's attempt number (launcher.agent.elastic), torch's restart count where the agent gave none.
    """

    def __init__(self, log_dir: Path, on_placement: Optional[Callable[[Dict[str, Any]], None]] = None) -> None:
        """on_placement: called with each new placement, before the workers start (it must not raise)."""
        super().__init__(str(log_dir), Std.NONE, Std.NONE, None)
        self._log_dir = log_dir
        self._on_placement = on_placement
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
        if self._on_placement is not None:
            self._on_placement(self.placement)
        for local_rank, env in envs.items():
            rank, attempt = env["RANK"], int(env.get(ATTEMPT) or env.get("TORCHELASTIC_RESTART_COUNT") or 0)
            suffix = "" if attempt == 0 else f".attempt-{attempt}"
            stdouts[local_rank] = str(self._log_dir / f"rank-{rank}{suffix}.log")
            stderrs[local_rank] = ""  # the same file: both streams, in the order they came
            errors[local_rank] = str(self._log_dir / f"rank-{rank}{suffix}.error.json")
            env["TORCHELASTIC_ERROR_FILE"] = errors[local_rank]
            if os.path.exists(errors[local_rank]):
                os.unlink(errors[local_rank])
        return LogsDest(stdouts, stderrs, {}, {}, errors, os.devnull, os.devnull)  # no tee: launcher.agent.streams shows them
