"""Which rank failed first, and why: the launcher's account of worker failures, per attempt.

When one rank dies, its peers fail moments later in a collective ("connection closed"). torch's
agent reports the ranks it happens to see exit first, with whole-second timestamps; a user needs
the rank that started it. This module completes the agent's view and picks that rank.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from launcher.plan import LaunchPlan
from launcher.runtime.env import START_TIME
from launcher.trainers.metrics.goodput import record_failure

log = logging.getLogger("launcher")


class FailureWatch:
    """Called by the agent (launcher.agent.elastic) on each failed attempt: logs its root cause before a restart."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.last: Optional[Dict[int, Any]] = None  # the latest failed attempt's failures, completed

    def on_failure(self, failures: Dict[int, Any], worker_group: Any, attempt: int, left: int, resumes: bool) -> None:
        started = os.environ.get(START_TIME)
        if started:  # the moment this attempt's failure was seen: the end of its failure detection (trainers.metrics.goodput)
            record_failure(self.plan.run_dir, float(started), attempt)
        self.last = found = with_recorded_errors(failures, self.plan, attempt)
        if left > 0:
            rank, failure = root_cause(found)
            how = "they resume from the latest checkpoint" if resumes else "your script starts again from its beginning"
            log.warning(f"attempt {attempt}: rank {rank} failed: {failure_reason(failure)}; "
                        f"restarting the workers ({left} restart(s) left), {how}; "
                        f"see {rank_log(self.plan, rank, attempt)}")


# Signals agents and users send to stop a whole job: a rank that died of one of these was most
# likely stopped because another rank failed, not the cause.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def root_cause(failures: Dict[int, Any]) -> Tuple[int, Any]:
    """The failure that most likely caused the others.

    First a rank killed by a signal nobody sends to stop a job (SIGKILL, SIGSEGV, the OOM killer),
    then the rank whose error was recorded first (to the nanosecond; torch's timestamps are whole
    seconds), then exit codes, and last the ranks stopped with SIGTERM/SIGINT/SIGHUP.
    """
    def order(item: Tuple[int, Any]) -> Tuple[int, float, int]:
        rank, failure = item
        code = failure.exitcode
        if code is not None and code < 0:
            kind = 3 if -code in STOP_SIGNALS else 0
        else:
            kind = 1
        try:
            written = float(os.stat(failure.error_file).st_mtime_ns)
        except (OSError, TypeError, ValueError):
            written, kind = float(failure.timestamp) * 1e9, 2 if kind == 1 else kind
        return (kind, written, rank)

    return min(failures.items(), key=order)


def with_recorded_errors(failures: Dict[int, Any], plan: LaunchPlan, attempt: int) -> Dict[int, Any]:
    """Add ranks that recorded an error this attempt but had not exited when the agent looked."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    suffix = "" if attempt == 0 else rf"\.attempt-{attempt}"
    pattern = re.compile(rf"^rank-(\d+){suffix}\.error\.json$")
    found = dict(failures)
    for path in (Path(plan.run_dir) / "logs").glob("rank-*.error.json"):
        match = pattern.match(path.name)
        if match and int(match.group(1)) not in found and readable_error_file(str(path)):
            found[int(match.group(1))] = ProcessFailure(local_rank=-1, pid=-1, exitcode=1, error_file=str(path))
    return found


def readable_error_file(path: str) -> str:
    """path where it holds JSON, else "": a full disk leaves an error file empty, and torch raises reading one."""
    try:
        if path and os.path.getsize(path) > 0:
            with open(path, encoding="utf-8") as f:
                json.load(f)
            return path
    except (OSError, ValueError):
        pass
    return ""


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


def root_cause_record(plan: LaunchPlan, failures: Dict[int, Any], attempt: int) -> Dict[str, Any]:
    """summary.json's "root_cause": the rank that failed first, its attempt, and its log and error file
    relative to the run directory, so that ls, logs and the board lead with it rather than with rank 0."""
    rank, failure = root_cause(failures)
    log_path = rank_log(plan, rank, attempt)
    record: Dict[str, Any] = {"rank": rank, "attempt": attempt, "log": str(log_path.relative_to(plan.run_dir))}
    if readable_error_file(failure.error_file or ""):
        record["error_file"] = os.path.relpath(failure.error_file, plan.run_dir)
    return record


def rank_log(plan: LaunchPlan, rank: int, attempt: int) -> Path:
    suffix = "" if attempt == 0 else f".attempt-{attempt}"
    return Path(plan.run_dir) / "logs" / f"rank-{rank}{suffix}.log"
