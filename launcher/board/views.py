"""What the board shows of a run, read from its directory: its page's view (one poll) and its rank logs.

Read-only and standard library only (no web framework): every function takes a directory that
inside() (launcher.board.files) has already checked lies under the board's output directory. A run
directory holds metrics.jsonl (rank 0's record per log step, with every rank's step time and memory),
series/ (a script's every launcher.log call: launcher.board.series), summary.json once it ended,
goodput/ (rank 0's per-step record of each attempt, the agent's failure records: launcher.board.events),
logs/rank-K.log and logs/launcher.log; its status and step target come from the run index
(launcher.runindex), as `ls` shows them. Where the time went is launcher.board.timing's, the live
header's rate and ETA launcher.board.live's.
"""

from __future__ import annotations

import errno
import heapq
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.agent.ranklog import RankLog, rank_lines
from launcher.board.events import attempt_records, run_events
from launcher.board.files import NotServed, inside, read_json, read_jsonl, servable, tail_lines
from launcher.board.live import live_header
from launcher.board.series import logged_series
from launcher.board.timing import time_breakdown
from launcher.runindex import entry_or_damaged

from launcher.runtime.fields import Field
from launcher.runtime.schema import ROW, SUMMARY, Status, row_fields

__all__ = ["NotServed", "inside", "heatmap", "log_view", "run_view"]
SERIES = ("loss", "samples_per_s", "steps_per_s", "step_time_s")
HEATMAP_COLUMNS = 200  # the newest log steps in the heatmap: enough to see a straggler come and go
RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
MAX_LOG_LINES = 2000
FAILURE_LOG_LINES = 40  # of a failed rank's log, where it recorded no error file: its traceback is at the end


def live_step(run_dir: Path) -> Optional[int]:
    """Rank 0's step now: the newest launch's newest attempt record (launcher.runtime.goodput, rewritten every step)."""
    for _, _, record in reversed(attempt_records(run_dir)):
        if record.get("step") is not None:
            return record["step"]
    return None


def heatmap(metrics: List[Dict[str, Any]], key: str) -> Dict[str, Any]:
    """Ranks x log steps of a per-rank list (z[rank][column]), the newest HEATMAP_COLUMNS columns. A script's rows
    give what each rank computes of its step (every rank's step time is the slowest's: its row would be uniform),
    the built-in trainer's the step time; `what` says which."""
    if key == "step_time_s_per_rank" and any(isinstance(m.get("compute_s_per_rank"), list) for m in metrics):
        key = "compute_s_per_rank"
    rows = [m for m in metrics if isinstance(m.get(key), list)][-HEATMAP_COLUMNS:]
    ranks = max((len(m[key]) for m in rows), default=0)
    z = [[(m[key][r] if r < len(m[key]) else None) for m in rows] for r in range(ranks)]
    what = "compute" if key == "compute_s_per_rank" else "step time"
    return {"steps": [m.get("step") for m in rows], "ranks": list(range(ranks)), "z": z, "what": what}


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


def column(metrics: List[Dict[str, Any]], field: Field) -> List[Any]:
    """One field of every row, as the schema declares it (null where a row's value has another shape)."""
    out = []
    for m in metrics:
        try:
            out.append(field.check(m.get(field.name)))
        except ValueError:
            out.append(None)
    return out


def figures(metrics: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The step-record fields the schema charts (launcher.runtime.schema.STEP, chart=True), each with its unit and
    meaning: the job's value per row and, where declared per rank, each rank's line."""
    out: Dict[str, Dict[str, Any]] = {}
    for field in row_fields():
        name = field.name[:-len("_per_rank")] if field.name.endswith("_per_rank") else field.name
        if not field.chart or not any(field.name in m for m in metrics):
            continue
        chart = out.setdefault(name, {"name": name, "unit": field.unit, "meaning": field.meaning})
        values = column(metrics, field)
        if field.name == name:
            chart["job"] = values
        else:
            ranks = max((len(v) for v in values if isinstance(v, list)), default=0)
            chart["per_rank"] = [[v[r] if isinstance(v, list) and r < len(v) else None for v in values]
                                 for r in range(ranks)]
    return list(out.values())


def run_view(run_dir: Path) -> Dict[str, Any]:
    """Everything the run page draws, in one poll: the run's index row (status, steps, command) and its records."""
    row = entry_or_damaged(run_dir, time.time()) or {}  # a summary.json of the wrong shape: a damaged run
    summary = SUMMARY.read(read_json(run_dir / "summary.json")) or None  # its fields of the declared shape
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    step = live_step(run_dir)  # rank 0's step now; the row's is the last logged one
    return {
        **{k: row.get(k) for k in ("run_id", "kind", "what", "status", "steps", "command", "error", "world_size", "note",
                                   "preempted_at", "requeued")},
        "nodes": (summary or {}).get("nodes") or plan_nodes(run_dir),
        "view": "run", "step": step if step is not None else row.get("step"),
        "live": live_header(run_dir, row.get("status"), row.get("steps"), metrics),
        "series": {k: column(metrics, ROW.fields[k]) for k in ("step", *SERIES)},
        "logged": logged_series(run_dir, metrics), "figures": figures(metrics),
        "time": time_breakdown(metrics, summary),
        "step_times": heatmap(metrics, "step_time_s_per_rank"), "memory": memory_per_rank(metrics, summary),
        "restarts": int(row.get("restarts") or 0), "events": run_events(run_dir, metrics, summary),
        "ranks": rank_logs(run_dir),
        "summary": {k: summary.get(k) for k in ("status", "wall_s", "samples_per_s", "steps_per_s", "final_loss",
                                                "goodput", "time_to_first_step_s", "error")} if summary else None,
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
    cause = (summary or {}).get("root_cause") if status == Status.FAILED else None
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
