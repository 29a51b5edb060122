"""Which rank failed first, and why: the launcher's account of worker failures, per attempt.

When one rank dies, its peers fail moments later in a collective ("connection closed"). torch's
agent reports the ranks it happens to see exit first, with whole-second timestamps; a user needs
the rank that started it. This module completes the agent's view and picks that rank.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Tuple

from launcher.plan import LaunchPlan

log = logging.getLogger("launcher")


class FailureWatch:
    """Hooks the elastic agent's monitor: logs each failed attempt's root cause before a restart."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.last: Optional[Dict[int, Any]] = None  # the latest failed attempt's failures, completed

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """elastic_launch builds its agent by name, so it gets a subclass for the launch's duration."""
        import torch.distributed.launcher.api as launcher_api

        base = launcher_api.LocalElasticAgent
        watch = self

        class ReportingAgent(base):  # type: ignore[misc, valid-type]
            def _monitor_workers(self, worker_group: Any) -> Any:
                result = super()._monitor_workers(worker_group)
                if result.is_failed():
                    attempt = worker_group.spec.max_restarts - self._remaining_restarts
                    watch.on_failure(result.failures, worker_group, self._pcontext, attempt, self._remaining_restarts)
                return result

        launcher_api.LocalElasticAgent = ReportingAgent
        try:
            yield
        finally:
            launcher_api.LocalElasticAgent = base

    def on_failure(self, failures: Dict[int, Any], worker_group: Any, pcontext: Any, attempt: int, left: int) -> None:
        found = with_signal_deaths(failures, worker_group, pcontext)
        self.last = found = with_recorded_errors(found, self.plan, attempt)
        if left > 0:
            rank, failure = root_cause(found)
            log.warning(f"attempt {attempt}: rank {rank} failed: {failure_reason(failure)}; "
                        f"restarting the workers ({left} restart(s) left), they resume from the latest checkpoint; "
                        f"see {rank_log(self.plan, rank, attempt)}")


def root_cause(failures: Dict[int, Any]) -> Tuple[int, Any]:
    """A rank killed by a signal caused the rest; otherwise the error file written first (to the ns) wins."""
    def order(item: Tuple[int, Any]) -> Tuple[int, float, int]:
        rank, failure = item
        killed = failure.exitcode is not None and failure.exitcode < 0
        try:
            written = os.stat(failure.error_file).st_mtime_ns
        except (OSError, TypeError, ValueError):
            written = failure.timestamp * 10**9
        return (0 if killed else 1, written, rank)

    return min(failures.items(), key=order)


def with_signal_deaths(failures: Dict[int, Any], worker_group: Any, pcontext: Any) -> Dict[int, Any]:
    """Add workers already dead by a signal that the agent's first-exit report left out."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    processes = getattr(getattr(pcontext, "_pc", None), "processes", None)  # fork/spawn contexts only
    found = dict(failures)
    if not processes:
        return found
    for worker in worker_group.workers:
        proc = processes[worker.local_rank] if worker.local_rank < len(processes) else None
        code = proc.exitcode if proc is not None else None
        if code is not None and code < 0 and worker.global_rank not in found:
            found[worker.global_rank] = ProcessFailure(local_rank=worker.local_rank, pid=proc.pid, exitcode=code, error_file="")
    return found


def with_recorded_errors(failures: Dict[int, Any], plan: LaunchPlan, attempt: int) -> Dict[int, Any]:
    """Add ranks that recorded an error this attempt but had not exited when the agent looked."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    suffix = "" if attempt == 0 else rf"\.attempt-{attempt}"
    pattern = re.compile(rf"^rank-(\d+){suffix}\.error\.json$")
    found = dict(failures)
    for path in (Path(plan.run_dir) / "logs").glob("rank-*.error.json"):
        match = pattern.match(path.name)
        if match and int(match.group(1)) not in found:
            found[int(match.group(1))] = ProcessFailure(local_rank=-1, pid=-1, exitcode=1, error_file=str(path))
    return found


def failure_reason(failure: Any) -> str:
    if failure.exitcode is not None and failure.exitcode < 0:
        try:
            name = signal.Signals(-failure.exitcode).name
        except ValueError:
            name = f"signal {-failure.exitcode}"
        return f"killed by {name}"
    message = failure.message
    if isinstance(message, dict):
        message = message.get("message", "")
    text = str(message or "").strip()
    if text.startswith("To enable traceback") or not text:
        return f"exit code {failure.exitcode}"
    first = text.splitlines()[0]
    return f"exit code {failure.exitcode}: {first}"


def rank_log(plan: LaunchPlan, rank: int, attempt: int) -> Path:
    suffix = "" if attempt == 0 else f".attempt-{attempt}"
    return Path(plan.run_dir) / "logs" / f"rank-{rank}{suffix}.log"
