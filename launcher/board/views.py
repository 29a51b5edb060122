"""What the board shows, read from run directories: a run's live view, its rank logs, a group's charts.

Read-only and standard library only (no web framework): every function takes a directory that
inside() has already checked lies under the board's output directory. A run directory holds
metrics.jsonl (rank 0's record per log step, with every rank's step time and memory), summary.json
once it ended, goodput/ (rank 0's per-step record of each attempt, the agent's failure records),
logs/rank-K.log and logs/launcher.log; its status and step target come from the run index
(launcher.runindex), as `ls` shows them.
"""

from __future__ import annotations

import errno
import heapq
import io
import json
import os
import re
import time
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Optional

from launcher.agent.ranklog import RankLog, rank_lines
from launcher.runindex import run_row
from launcher.trainers.metrics.goodput import DIR as GOODPUT_DIR, membership_changes
from launcher.steps.rows import OWN

SERIES = ("loss", "samples_per_s", "steps_per_s", "step_time_s")
MAX_LOGGED_SERIES = 12  # launcher.log() keys charted on a script's run page (metrics.jsonl has them all)
HEATMAP_COLUMNS = 200  # the newest log steps in the heatmap: enough to see a straggler come and go
EVENT_LEVELS = re.compile(r" (WARNING|ERROR|CRITICAL) ")
RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
MAX_LOG_LINES = 2000
FAILURE_LOG_LINES = 40  # of a failed rank's log, where it recorded no error file: its traceback is at the end


def inside(root: Path, rel: str) -> Optional[Path]:
    """root/rel when it is root or lies under it (symlinks followed); None for anything else (.., /abs)."""
    base = root.resolve()
    if not rel or rel in (".", "/"):
        return base
    if rel.startswith("/") or "\x00" in rel:
        return None
    target = (base / rel).resolve()
    return target if target == base or base in target.parents else None


class NotServed(FileNotFoundError):
    """A file of a run folder reached through a symlink: served as absent (404), whatever it points to."""


def servable(path: Path) -> bool:
    return os.path.realpath(path) == os.path.abspath(path)


def open_served(path: Path) -> BinaryIO:
    """path opened for reading only when its real path is itself: a symlink on the way or at the end (anyone
    who can write the output folder can plant one) could lead outside the board's folder (docs/board.md)."""
    if not servable(path):
        raise NotServed(errno.ENOENT, "a symlink: not served", str(path))
    return os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb")  # and one swapped in since


def read_json(path: Path) -> Any:
    try:
        with open_served(path) as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """Every whole line of a JSONL file; a line being written (no newline yet) is left for the next read."""
    try:
        with open_served(path) as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    rows = []
    for line in text.split("\n")[:-1]:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def live_step(run_dir: Path) -> Optional[int]:
    """Rank 0's step now: the newest launch's newest attempt record (trainers.metrics.goodput, rewritten every step)."""
    records = sorted((run_dir / "goodput").glob("*-attempt-*.json"), key=_launch_and_attempt)
    for path in reversed(records):
        record = read_json(path) if path.stat().st_size else None
        if isinstance(record, dict) and isinstance(record.get("step"), int):
            return record["step"]
    return None


def _launch_and_attempt(path: Path) -> tuple:
    launch, _, attempt = path.stem.partition("-attempt-")
    return (int(launch) if launch.isdigit() else 0, int(attempt) if attempt.isdigit() else 0)


def failure_events(run_dir: Path) -> List[Dict[str, Any]]:
    """Attempts that failed (from the agent's failure records, hangs named) and the launcher's warnings.

    Not a restart count: a run that fails on its last attempt has one failure record more than restarts,
    and a resumed run keeps its earlier launches' records; the count is the run index's (summary.json's
    "restarts", the agent's own count)."""
    events: List[Dict[str, Any]] = []
    failures = sorted((run_dir / "goodput").glob("*-failure-*.json"))
    for path in failures:
        record = read_json(path) or {}
        attempt = path.stem.rsplit("-", 1)[1]
        what = "hang verdict: the watchdog stopped" if record.get("hang") else "failed"
        events.append({"at": record.get("detected_at"), "text": f"attempt {attempt} {what}"})
    events += membership_events(run_dir)
    for line in tail_lines(run_dir / "logs" / "launcher.log", 400):
        if EVENT_LEVELS.search(line):
            events.append({"at": None, "text": line})
    return events[-100:]


def membership_events(run_dir: Path) -> List[Dict[str, Any]]:
    """An elastic job's membership changes in its newest launch (while it runs too), as the summary lists them:
    when, who left or joined, and the world size after. Read from the node agents' round records."""
    keys = {p.name.split("-", 1)[0] for p in (run_dir / GOODPUT_DIR).glob("*-round-*.json")}
    launches = [int(k) for k in keys if k.isdigit()]
    if not launches:
        return []
    events = []
    for change in membership_changes(run_dir, max(launches) / 1000):
        who = "; ".join([f"left: {', '.join(change['left'])}"] * bool(change["left"]) +
                        [f"joined: {', '.join(change['joined'])}"] * bool(change["joined"]))
        events.append({"at": change.get("at"), "text": f"membership change ({who}): {change.get('nodes')} nodes, "
                                                      f"world size {change.get('world_size')}"})
    return events


def heatmap(metrics: List[Dict[str, Any]], key: str) -> Dict[str, Any]:
    """Ranks x log steps of a per-rank list (z[rank][column]), the newest HEATMAP_COLUMNS columns."""
    rows = [m for m in metrics if isinstance(m.get(key), list)][-HEATMAP_COLUMNS:]
    ranks = max((len(m[key]) for m in rows), default=0)
    z = [[(m[key][r] if r < len(m[key]) else None) for m in rows] for r in range(ranks)]
    return {"steps": [m.get("step") for m in rows], "ranks": list(range(ranks)), "z": z}


def memory_per_rank(metrics: List[Dict[str, Any]], summary: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Each rank's newest peak memory in MB: CUDA when on GPU, else process RSS."""
    for m in reversed(metrics):
        for key, kind in (("cuda_peak_mb_per_rank", "cuda peak"), ("rss_mb_per_rank", "process RSS peak")):
            if isinstance(m.get(key), list):
                return {"kind": kind, "mb": m[key]}
    per_rank = (summary or {}).get("peak_memory_bytes_per_rank")
    if isinstance(per_rank, list):
        return {"kind": (summary or {}).get("peak_memory_kind") or "peak", "mb": [b / 2**20 for b in per_rank]}
    return {"kind": None, "mb": []}


def logged_series(metrics: List[Dict[str, Any]]) -> Dict[str, Any]:
    """A script's launcher.log() values by key (rows of a script carry attempt_step; the built-in trainer's own
    fields are charted above): {key: [value per row]}, and {key_per_rank: [[value per row] per rank]}."""
    rows = [m for m in metrics if "attempt_step" in m]
    keys = sorted({k for m in rows for k, v in m.items() if k not in OWN and k not in SERIES
                   and (isinstance(v, (int, float)) and not isinstance(v, bool) or isinstance(v, list))})
    out: Dict[str, Any] = {}
    for key in keys[:MAX_LOGGED_SERIES]:
        values = [m.get(key) for m in metrics]
        if any(isinstance(v, list) for v in values):
            ranks = max(len(v) for v in values if isinstance(v, list))
            out[key] = [[v[r] if isinstance(v, list) and r < len(v) else None for v in values] for r in range(ranks)]
        else:
            out[key] = values
    return out


def run_view(run_dir: Path) -> Dict[str, Any]:
    """Everything the run page draws, in one poll: the run's index row (status, steps, command) and its records."""
    row = run_row(run_dir, time.time())
    summary = read_json(run_dir / "summary.json")
    summary = summary if isinstance(summary, dict) else None
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    step = live_step(run_dir)  # rank 0's step now; the row's is the last logged one
    return {
        **{k: row.get(k) for k in ("run_id", "kind", "status", "steps", "command", "error", "world_size")},
        "nodes": (summary or {}).get("nodes") or plan_nodes(run_dir),
        "view": "run", "step": step if step is not None else row.get("step"),
        "series": {"step": [m.get("step") for m in metrics], **{k: [m.get(k) for m in metrics] for k in SERIES}},
        "logged": logged_series(metrics),
        "step_times": heatmap(metrics, "step_time_s_per_rank"), "memory": memory_per_rank(metrics, summary),
        "restarts": int(row.get("restarts") or 0), "events": failure_events(run_dir), "ranks": rank_logs(run_dir),
        "summary": {k: summary.get(k) for k in ("status", "wall_s", "samples_per_s", "final_loss", "goodput",
                                                "time_to_first_step_s", "error")} if summary else None,
        "failure": failure_view(run_dir, summary, row.get("status")),
        "read_at": time.time(),
    }


def plan_nodes(run_dir: Path) -> Optional[int]:
    """How many machines the newest launch planned (plan.json), for a run that has not ended."""
    plan = read_json(run_dir / "plan.json")
    nodes = plan.get("nodes") if isinstance(plan, dict) else None
    return nodes if isinstance(nodes, int) else None


def failure_view(run_dir: Path, summary: Optional[Dict[str, Any]], status: Any) -> Optional[Dict[str, Any]]:
    """A failed run's root cause, which the run page leads with: the rank that failed first (summary.json's
    root_cause, the agent's finding), its error and its traceback (its error file's, else its log's last lines),
    rather than rank 0's knock-on error."""
    cause = (summary or {}).get("root_cause") if status == "failed" else None
    if not isinstance(cause, dict) or not isinstance(cause.get("rank"), int):
        return None
    traceback = ""
    error_file = inside(run_dir, str(cause.get("error_file") or ""))  # both from the run's own summary: kept inside it
    if cause.get("error_file") and error_file is not None:
        message = (read_json(error_file) or {}).get("message")
        info = message.get("extraInfo") if isinstance(message, dict) else None
        traceback = str(info.get("py_callstack") or "") if isinstance(info, dict) else ""
    log = inside(run_dir, str(cause.get("log") or ""))
    if not traceback and cause.get("log") and log is not None:
        traceback = "\n".join(tail_lines(log, FAILURE_LOG_LINES))
    return {"rank": cause["rank"], "attempt": cause.get("attempt"), "error": (summary or {}).get("error"),
            "traceback": traceback.rstrip("\n")}


def rank_logs(run_dir: Path) -> List[int]:
    folder = run_dir / "logs"
    found = [RANK_LOG.match(p.name) for p in folder.iterdir() if servable(p)] if servable(folder) and folder.is_dir() else []
    return sorted(int(m.group(1)) for m in found if m)


def tail_lines(path: Path, count: int) -> List[str]:
    try:
        with io.TextIOWrapper(open_served(path), encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in deque(f, maxlen=count)]
    except OSError:
        return []


def log_view(run_dir: Path, rank: Optional[int], count: int, grep: str = "") -> Dict[str, Any]:
    """One rank's newest lines, or every rank's (rank None) in the order they arrived, each with one
    `[rank<k>]: ` prefix and a progress bar at its last state, as `logs --all` prints them; optionally filtered."""
    ranks = rank_logs(run_dir)
    if rank is not None and not servable(run_dir / "logs" / f"rank-{rank}.log"):
        raise NotServed(errno.ENOENT, "a symlink: not served", f"rank-{rank}.log")  # the server's 404
    if rank is None:
        merged = heapq.merge(*(rank_lines([RankLog(run_dir / "logs" / f"rank-{r}.log", r)], finished=True) for r in ranks),
                             key=lambda item: (item[0], item[1]))
        lines = [line.rstrip("\n") for _, _, line in merged]
    else:
        lines = tail_lines(run_dir / "logs" / f"rank-{rank}.log", count) if rank in ranks else []
    if grep:
        lines = [line for line in lines if grep in line]
    return {"ranks": ranks, "rank": rank, "lines": lines[-count:]}
