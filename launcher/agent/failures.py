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
from typing import Any, Dict, Iterable, Optional, Set, Tuple

from launcher.plan import LaunchPlan
from launcher.runtime.env import START_TIME
from launcher.runtime.goodput import record_failure

log = logging.getLogger("launcher")


class FailureWatch:
    """Called by the agent (launcher.agent.elastic) on each failed attempt: logs its root cause before a restart."""

    def __init__(self, plan: LaunchPlan) -> None:
        self.plan = plan
        self.last: Optional[Dict[int, Any]] = None  # the latest failed attempt's failures, completed
        self.times: Dict[int, float] = {}  # when each of them failed (time.time())

    def on_failure(self, failures: Dict[int, Any], worker_group: Any, attempt: int, left: int, resumes: bool,
                   times: Optional[Dict[int, float]] = None) -> None:
        started = os.environ.get(START_TIME)
        if started:  # the moment this attempt's failure was seen: the end of its failure detection (launcher.runtime.goodput)
            record_failure(self.plan.run_dir, float(started), attempt)
        here = {w.global_rank for w in getattr(worker_group, "workers", ())} or None
        self.last = found = with_recorded_errors(failures, self.plan, attempt, here)
        self.times = dict(times or {})
        if left > 0:
            rank, failure = root_cause(found, self.times)
            how = "they resume from the latest checkpoint" if resumes else "your script starts again from its beginning"
            log.warning(f"attempt {attempt}: rank {rank} failed: {failure_reason(failure)}; "
                        f"restarting the workers ({left} restart(s) left), {how}; "
                        f"see {rank_log(self.plan, rank, attempt)}")


# Signals agents and users send to stop a whole job: a rank that died of one of these was most
# likely stopped because another rank failed, not the cause.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
KILLED, EXITED, STOPPED = "killed", "exited", "stopped"  # how a rank failed, in the order that blames it first


def how_it_failed(failure: Any) -> str:
    """KILLED by a signal nobody sends to stop a job (SIGKILL, SIGSEGV, the OOM killer), STOPPED by one they send,
    or EXITED with a code (an exception, sys.exit)."""
    code = failure.exitcode
    if code is not None and code < 0:
        return STOPPED if -code in STOP_SIGNALS else KILLED
    return EXITED


def failed_at(rank: int, failure: Any, times: Optional[Dict[int, float]] = None) -> float:
    """When the rank failed (time.time()): as its process said or was reaped (launcher.agent.processes), else when it
    recorded its error (a rank that had not exited yet), else torch's whole-second timestamp."""
    if times and rank in times:
        return times[rank]
    try:
        return os.stat(failure.error_file).st_mtime_ns / 1e9
    except (OSError, TypeError, ValueError):
        return float(failure.timestamp)


def root_cause(failures: Dict[int, Any], times: Optional[Dict[int, float]] = None) -> Tuple[int, Any]:
    """The failure that caused the others: the rank that failed first. A rank that exits, raises or is killed makes
    its peers fail moments later (their collectives find the connection closed), so the first in time is the cause;
    a rank killed by a signal is put before the ranks that exited (its exit is only seen when reaped, up to 50 ms
    late), and ranks stopped with SIGTERM/SIGINT/SIGHUP last."""
    def order(item: Tuple[int, Any]) -> Tuple[int, float, int]:
        rank, failure = item
        return ((KILLED, EXITED, STOPPED).index(how_it_failed(failure)), failed_at(rank, failure, times), rank)

    return min(failures.items(), key=order)


def first_cause(causes: Iterable[Optional[Dict[str, Any]]]) -> Optional[Dict[str, Any]]:
    """Of several nodes' root causes (root_cause_record's), the job's: the same order across nodes (a cause without
    a time, written by an older launcher, last)."""
    known = [c for c in causes if isinstance(c, dict) and isinstance(c.get("rank"), int)]
    if not known:
        return None
    ranked = (KILLED, EXITED, STOPPED)
    return min(known, key=lambda c: (ranked.index(c["how"]) if c.get("how") in ranked else 1,
                                     c.get("failed_at") if isinstance(c.get("failed_at"), (int, float)) else float("inf"),
                                     c["rank"]))


def with_recorded_errors(failures: Dict[int, Any], plan: LaunchPlan, attempt: int,
                         ranks: Optional[Set[int]] = None) -> Dict[int, Any]:
    """Add ranks (of this node: `ranks`, where given) that recorded an error this attempt but had not exited when
    the agent looked. Another node's ranks are its own agent's to judge (a shared run directory holds theirs too)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    suffix = "" if attempt == 0 else rf"\.attempt-{attempt}"
    pattern = re.compile(rf"^rank-(\d+){suffix}\.error\.json$")
    found = dict(failures)
    for path in (Path(plan.run_dir) / "logs").glob("rank-*.error.json"):
        match = pattern.match(path.name)
        if match and (ranks is None or int(match.group(1)) in ranks) and int(match.group(1)) not in found \
                and readable_error_file(str(path)):
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


def root_cause_record(plan: LaunchPlan, failures: Dict[int, Any], attempt: int,
                      times: Optional[Dict[int, float]] = None) -> Dict[str, Any]:
    """summary.json's "root_cause": the rank that failed first, its attempt, how and when it failed, and its log and
    error file relative to the run directory, so that ls, logs and the board lead with it rather than with rank 0."""
    rank, failure = root_cause(failures, times)
    log_path = rank_log(plan, rank, attempt)
    record: Dict[str, Any] = {"rank": rank, "attempt": attempt, "log": str(log_path.relative_to(plan.run_dir)),
                              "how": how_it_failed(failure), "failed_at": failed_at(rank, failure, times)}
    if readable_error_file(failure.error_file or ""):
        record["error_file"] = os.path.relpath(failure.error_file, plan.run_dir)
    return record


def rank_log(plan: LaunchPlan, rank: int, attempt: int) -> Path:
    suffix = "" if attempt == 0 else f".attempt-{attempt}"
    return Path(plan.run_dir) / "logs" / f"rank-{rank}{suffix}.log"
