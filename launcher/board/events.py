"""A run's events, each at the step it happened, for the run page's list and the marks on its charts over steps.

What happened comes from the records the run leaves: the agent's failure records (a restart, a hang verdict),
the node agents' rendezvous rounds (a membership change), each launch's attempt records (a resume is a later
launch), metrics.jsonl (the row that first names a straggler) and logs/launcher.log (an interrupt, a preemption
and requeue, the launcher's warnings). Where it happened, as a step of the charts' axis (metrics.jsonl's `step`, the
launch's steps across restarts), comes from rank 0's attempt records (their first and last step, and when) and
a script's rows (each with its time): a time between two of an attempt's known steps is placed by its step rate,
one after an attempt's last step at that step. Standard library only; every path is the board's checked folder.
"""

from __future__ import annotations

import bisect
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from launcher.board.files import read_json, tail_lines
from launcher.runtime.goodput import membership_changes, said_change
from launcher.runtime.schema import FAILURE, GOODPUT, GOODPUT_DIR, Status
from launcher.runtime.stragglers import Lagging

MAX_EVENTS = 100
MAX_MARKS_PER_KIND = 20  # a straggler that comes and goes must not cover a chart in lines
MARKED = ("restart", "hang", "membership", "resume", "interrupt", "preemption", "straggler")  # drawn on charts
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (\S+) (DEBUG|INFO|WARNING|ERROR|CRITICAL) (.*)$")
LOG_KINDS = ((re.compile(r"\brequeue"), "preemption"), (re.compile(r"\binterrupted by SIG"), "interrupt"),
             (re.compile(r"^watchdog: ranks made no progress"), "hang"))  # a job hung with no restart left
SAME_HANG_S = 60.0  # a hang the agent recorded (it restarted the job) and the watchdog's line about it are one
LAUNCHER_LOG_LINES = 2000
FROM_ROWS = re.compile(r"^straggler (at|gone at) step ")  # the rows' own straggler events say these


class Timeline:
    """Wall time to the charts' step, from rank 0's attempt records of every launch and a script's rows."""

    def __init__(self, attempts: List[Tuple[str, int, Dict[str, Any]]], metrics: List[Dict[str, Any]]) -> None:
        self.offsets = attempt_offsets(metrics)
        # (time, step, segment): steps of one segment (an attempt) are joined by their rate, not across a restart
        points: List[Tuple[float, int, Any]] = []
        for launch, attempt, record in attempts:
            offset = self.offsets.get(attempt, 0) if launch == (attempts[-1][0] if attempts else None) else 0
            for at, step in ((record.get("first_step_at"), record.get("start_step")),
                             (record.get("active_until"), record.get("step"))):
                if isinstance(at, (int, float)) and isinstance(step, int):
                    points.append((float(at), step + offset, (launch, attempt)))
        for row in metrics:
            if isinstance(row.get("time"), (int, float)) and isinstance(row.get("step"), int):
                points.append((float(row["time"]), row["step"], ("row", row.get("attempt"))))
        points.sort(key=lambda p: p[0])
        self.points = points
        self.times = [p[0] for p in points]

    def step_at(self, at: Optional[float]) -> Optional[int]:
        """The step the job had reached at wall time `at`; None before its first step or with no time."""
        if at is None or not self.points:
            return None
        i = bisect.bisect_right(self.times, at) - 1
        if i < 0:
            return None
        t0, s0, seg0 = self.points[i]
        if i + 1 < len(self.points):
            t1, s1, seg1 = self.points[i + 1]
            if seg1 == seg0 and t1 > t0 and s1 >= s0:
                return int(round(s0 + (s1 - s0) * (at - t0) / (t1 - t0)))
        return s0


def attempt_offsets(metrics: List[Dict[str, Any]]) -> Dict[int, int]:
    """A script's attempt -> the launch's steps before it (its rows count `step` across restarts and `attempt_step`
    within one); the built-in trainer's steps are the job's already (it resumes from its checkpoint's step)."""
    offsets: Dict[int, int] = {}
    for row in metrics:
        attempt, step, own = row.get("attempt"), row.get("step"), row.get("attempt_step")
        if isinstance(attempt, int) and isinstance(step, int) and isinstance(own, int):
            offsets[attempt] = step - own
    return offsets


def attempt_records(run_dir: Path) -> List[Tuple[str, int, Dict[str, Any]]]:
    """(launch, attempt, record) of every attempt rank 0 recorded, oldest launch first."""
    found = []
    for path in (run_dir / GOODPUT_DIR).glob("*-attempt-*.json"):
        launch, _, attempt = path.stem.partition("-attempt-")
        if launch.isdigit() and attempt.isdigit() and path.stat().st_size:
            found.append((launch, int(attempt), GOODPUT.read(read_json(path))))
    return sorted(found, key=lambda f: (int(f[0]), f[1]))


def run_events(run_dir: Path, metrics: List[Dict[str, Any]], summary: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Every event, oldest first: {at (wall time or None), step (or None), kind, text}; kinds in MARKED are drawn
    on the charts over steps, a warning only listed."""
    attempts = attempt_records(run_dir)
    timeline = Timeline(attempts, metrics)
    events = failure_events(run_dir, attempts, timeline) + membership_events(run_dir, timeline)
    recorded = [e["at"] for e in events if e["kind"] == "hang" and e["at"] is not None]
    events += [e for e in log_events(run_dir, timeline) if e["kind"] != "hang" or e["at"] is None
               or not any(abs(e["at"] - at) < SAME_HANG_S for at in recorded)]
    events += resume_events(attempts) + straggler_events(metrics)
    if summary and summary.get("status") == Status.INTERRUPTED and not any(e["kind"] == "interrupt" for e in events):
        events.append({"at": None, "step": summary.get("steps"), "kind": "interrupt",
                       "text": f"interrupted{' by ' + str(summary['stopped_by']) if summary.get('stopped_by') else ''}"})
    events.sort(key=lambda e: (e["at"] is None, e["at"] or 0.0))
    return limit_marks(events[-MAX_EVENTS:])


def failure_events(run_dir: Path, attempts: List[Tuple[str, int, Dict[str, Any]]],
                   timeline: Timeline) -> List[Dict[str, Any]]:
    """Attempts that failed (the agent's failure records), hangs named, at the failed attempt's last step.

    Not a restart count: a run that fails on its last attempt has one failure record more than restarts, and a
    resumed run keeps its earlier launches' records; the count is summary.json's "restarts" (the agent's own)."""
    last_step = {(launch, n): r.get("step") for launch, n, r in attempts}
    events = []
    for path in sorted((run_dir / GOODPUT_DIR).glob("*-failure-*.json")):
        record = FAILURE.read(read_json(path))
        launch, _, attempt = path.stem.partition("-failure-")
        hang = bool(record.get("hang"))
        step = last_step.get((launch, int(attempt))) if attempt.isdigit() else None
        at = record.get("detected_at")
        if isinstance(step, int) and launch == (attempts[-1][0] if attempts else None):
            step += timeline.offsets.get(int(attempt), 0)
        events.append({"at": at, "step": step if isinstance(step, int) else timeline.step_at(at),
                       "kind": "hang" if hang else "restart",
                       "text": f"attempt {attempt} {'hang verdict: the watchdog stopped' if hang else 'failed'}"})
    return events


def membership_events(run_dir: Path, timeline: Timeline) -> List[Dict[str, Any]]:
    """An elastic job's membership changes in its newest launch (while it runs too), as the summary lists them:
    when, who left or joined, and the world size after. Read from the node agents' round records."""
    keys = {p.name.split("-", 1)[0] for p in (run_dir / GOODPUT_DIR).glob("*-round-*.json")}
    launches = [int(k) for k in keys if k.isdigit()]
    events = []
    for change in membership_changes(run_dir, max(launches) / 1000) if launches else []:
        events.append({"at": change.get("at"), "step": timeline.step_at(change.get("at")), "kind": "membership",
                       "text": said_change(change)})
    return events


def resume_events(attempts: List[Tuple[str, int, Dict[str, Any]]]) -> List[Dict[str, Any]]:
    """Each launch after the first (`resume`, a requeue) at the step it went on from."""
    firsts: Dict[str, Dict[str, Any]] = {}
    for launch, _, record in attempts:
        firsts.setdefault(launch, record)
    events = []
    for number, (launch, record) in enumerate(list(firsts.items())[1:], start=2):
        step = record.get("start_step")
        at = record.get("first_step_at") or int(launch) / 1000
        events.append({"at": at, "step": step, "kind": "resume",
                       "text": f"launch {number}: resumed from step {step}" if step else f"launch {number} started"})
    return events


def straggler_events(metrics: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each row that names a straggler other than the row before it did, at its step, in its words. A script's rows
    name one once it lagged a few windows in a row; the built-in trainer's name each window's slowest rank past
    metrics.straggler_fraction, so theirs is marked only as a script's would be (Lagging): one slow window on a
    loaded machine is no straggler."""
    sustained = any(isinstance(row.get("straggler"), str) for row in metrics)
    lagging = Lagging()
    events, named = [], None
    for row in metrics:
        rank = row.get("straggler_rank") if isinstance(row.get("straggler_rank"), int) else None
        rank = rank if sustained else lagging.see(rank)
        if rank is not None and rank != named and isinstance(row.get("step"), int):
            lag = row.get("slowest_rank_lag")
            words = row.get("straggler") if isinstance(row.get("straggler"), str) else (
                f"rank {rank} steps {100 * lag:.0f}% slower than the median rank"
                if isinstance(lag, (int, float)) and row.get("slowest_rank") == rank else f"rank {rank} is the slowest")
            events.append({"at": _time(row), "step": row["step"], "kind": "straggler", "text": f"straggler: {words}"})
        elif rank is None and named is not None:  # listed, not marked: the mark of its naming says where it began
            events.append({"at": _time(row), "step": row.get("step"), "kind": "straggler_gone",
                           "text": f"straggler gone: rank {named} keeps up again"})
        named = rank
    return events


def _time(row: Dict[str, Any]) -> Optional[float]:
    return float(row["time"]) if isinstance(row.get("time"), (int, float)) else None


def log_events(run_dir: Path, timeline: Timeline) -> List[Dict[str, Any]]:
    """launcher.log's interrupts and preemptions (requeues), and its warnings and errors, at their time's step."""
    events = []
    for line in tail_lines(run_dir / "logs" / "launcher.log", LAUNCHER_LOG_LINES):
        match = LOG_LINE.match(line)
        if not match:
            continue
        stamp, ms, _, level, message = match.groups()
        if FROM_ROWS.match(message):
            continue
        kind = next((k for pattern, k in LOG_KINDS if pattern.search(message)), None)
        if kind is None and level not in ("WARNING", "ERROR", "CRITICAL"):
            continue
        try:
            # the line's millisecond's middle: a record written just before the line sorts before it
            at: Optional[float] = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + (int(ms) + 0.5) / 1000
        except (ValueError, OverflowError):
            at = None
        events.append({"at": at, "step": timeline.step_at(at), "kind": kind or level.lower(), "text": message})
    return events


def limit_marks(events: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The newest MAX_MARKS_PER_KIND events of each kind keep their step (their mark); older ones are listed only."""
    seen: Dict[str, int] = {}
    for event in reversed(events):
        seen[event["kind"]] = seen.get(event["kind"], 0) + 1
        if seen[event["kind"]] > MAX_MARKS_PER_KIND:
            event["step"] = None
    return events
