"""Every run under an output directory, one row each: what `ls` prints and the board shows.

A row is read from the files a run leaves (launcher.rundir), never from a scheduler: status from
the run's lock (launcher.runlock: a live holder means running, a run that claims to run without
one is dead) and summary.json, progress and throughput from the last line of metrics.jsonl (its
tail only; `metrics` holds that row's figures, launcher.runtime.schema.ROW's), the step target from
config.yaml. summary.json and the metrics row are read through the schema: a summary field of the
wrong shape makes the row `damaged`. Sweeps (sweep.json), comparisons and scaling sweeps are one
row each, with their runs as `members`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set, Union

from launcher.backends.base import run_kind
from launcher.runlock import live_holders
from launcher.runtime import safefs
from launcher.runtime.formatting import first_line, preemption
from launcher.runtime.schema import LISTED, NODE, NODES_DIR, ROW, SUMMARY, Status

STATUSES = tuple(s.value for s in LISTED)
# summary.json's own words -> the index's (a hang is a kind of failure; its error says which rank)
SUMMARY_STATUS: Dict[Optional[str], Status] = {
    Status.COMPLETED: Status.COMPLETED, Status.FAILED: Status.FAILED, Status.HUNG: Status.FAILED,
    Status.INTERRUPTED: Status.INTERRUPTED, Status.PREEMPTED: Status.PREEMPTED}
TAIL_BYTES = 8192
RUN_FILES = frozenset(("plan.json", "config.yaml", "job.json"))  # any of them: a run directory
# trainer.steps and script.path in a recorded config.yaml (launcher.config.schema.to_yaml): found, not parsed (fast)
STEPS_LINE = re.compile(r"^  steps: (\d+)\s*$", re.M)
SCRIPT_PATH = re.compile(r"^script:\n  path: (.*)$", re.M)


def list_runs(root: Path, now: Optional[float] = None) -> List[Dict[str, Any]]:
    """One row per run, sweep, comparison or scaling sweep directly under root, oldest first.

    A root that is itself a run (or a sweep, comparison, scaling sweep) lists that one."""
    root = Path(root).resolve()
    now = time.time() if now is None else now
    own = entry_or_damaged(root, now)
    if own is not None:
        return [own]
    rows = [row for row in (entry_or_damaged(path, now) for path in sorted(_subdirs(root))) if row is not None]
    rows.sort(key=lambda r: (r["started"] or 0, r["run_id"]))
    return rows


def entry_or_damaged(path: Path, now: float) -> Optional[Dict[str, Any]]:
    """read_entry's row, or a `damaged` one naming why its files cannot be read: one bad run hides no other."""
    try:
        return read_entry(path, now)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:  # text not UTF-8, a field of a wrong type
        row = pending_row(path, now)
        del row["pending"]
        why = f"damaged: {e.__class__.__name__}: {error_line(e) or ''}".strip()
        return {**row, "status": Status.DAMAGED, "error": why,
                "started": _mtime(path), "age_s": max(0.0, now - (_mtime(path) or now))}


def read_entry(path: Path, now: float) -> Optional[Dict[str, Any]]:
    """The row for one directory, or None if it holds no run."""
    names = _names(path)  # one listing per directory, then only the files that are there are opened
    if "sweep.json" in names:
        return sweep_row(path, now)
    if "compare.json" in names or (path.name.startswith("compare-") and "runs" in names):
        return group_row(path, "compare", now)
    if "scale.json" in names or (path.name.startswith("scale-") and "runs" in names):
        return group_row(path, "scale", now)
    if RUN_FILES & names:
        return run_row(path, now, names)
    return None


def is_run_dir(path: Path) -> bool:
    return bool(RUN_FILES & _names(path))


def run_row(run_dir: Path, now: float, names: Optional[Set[str]] = None) -> Dict[str, Any]:
    """One run's row: its kind, live status, progress, throughput, goodput, restarts and age."""
    names = _names(run_dir) if names is None else names
    here = str(run_dir)

    def read(name: str) -> Dict[str, Any]:
        return _read_json(os.path.join(here, name)) if name in names else {}

    summary, plan, job = SUMMARY.check(read("summary.json")), read("plan.json"), read("job.json")
    last = ROW.read(last_metrics(os.path.join(here, "metrics.jsonl"))) if "metrics.jsonl" in names else {}
    holders = live_holders(run_dir) if "locks" in names else []
    status = run_status(here, summary, plan, bool(holders))
    kind, recorded = run_kind(job, plan)  # as the run recorded it when it was made (launcher.backends.base)
    finished = status != Status.RUNNING and summary
    # when it was submitted (SLURM) or last launched (config.yaml is written again by a resume)
    started = (_mtime(os.path.join(here, "job.json")) or _mtime(os.path.join(here, "config.yaml"))
               or _mtime(os.path.join(here, "plan.json")) or _mtime(here))
    row: Dict[str, Any] = {
        "run_id": run_dir.name,
        "path": str(run_dir),
        "kind": kind,
        "status": status,
        "step": last.get("step", summary.get("steps") if summary.get("status") == Status.COMPLETED else None),
        "steps": target_steps(here, summary) if "config.yaml" in names else summary.get("steps"),
        "what": job_what(plan.get("command"), summary),
        "throughput": (summary.get("samples_per_s") if finished else None) or last.get("samples_per_s"),
        # a script whose DataLoader could not be read has steps/s only: the list shows that instead
        "steps_per_s": (summary.get("steps_per_s") if finished else None) or last.get("steps_per_s"),
        "loss": summary.get("final_loss") if finished and summary.get("final_loss") is not None else last.get("loss"),
        "goodput": (summary.get("goodput") if finished else None) or last.get("goodput"),
        "restarts": int(summary.get("restarts") or 0) if finished else attempts_so_far(here),
        "started": started,
        "age_s": max(0.0, now - started) if started else None,
        "command": next_command(here, status, bool(job), "checkpoints" in names, failed_rank(summary, status),
                                summary.get("requeued")),
        "updated": _mtime(os.path.join(here, "metrics.jsonl")) or started,
        "world_size": summary.get("world_size") or plan.get("world_size"),
        "error": error_line(summary.get("error")) if status in (Status.FAILED, Status.INTERRUPTED, Status.PREEMPTED) else None,
        "failed_rank": failed_rank(summary, status),
        "holders": [f"{h.host}:{h.pid}" for h in holders],
        "metrics": {k: v for k, v in last.items() if not isinstance(v, (list, dict))},  # the newest row's figures
        "spares": _count(summary.get("spares", plan.get("spares"))),
        "replaced": [{"left": _node_name(r.get("left")), "by": _node_name(r.get("by"))}
                     for c in summary.get("membership_changes") or [] if isinstance(c, dict)
                     for r in c.get("replaced") or [] if isinstance(r, dict)],
    }
    if not recorded:  # a run from before kinds were recorded: its kind is inferred from its files
        row["kind_guessed"] = True
    if kind == "slurm":
        row["slurm_job_id"] = job.get("job_id")
    if status == Status.PREEMPTED:  # when, and whether its scheduler runs it again (null: not decided yet)
        row.update(preempted_at=summary.get("preempted_at"), requeued=summary.get("requeued"),
                   note=preemption(summary))
    return row


def job_what(command: Any, summary: Dict[str, Any]) -> Optional[str]:
    """What the run runs, in a few words: the built-in trainer's strategy and model, or the script's name, from the
    worker command plan.json records (launcher.plan.worker_command), else summary.json."""
    parts = [str(c) for c in command] if isinstance(command, list) else []
    if parts[:1] == ["<built-in trainer>"]:
        given = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        return f"{given.get('trainer.strategy', '?')} {given.get('model.name', '?')}"
    if parts[:2] == ["python", "-m"] and len(parts) > 2:
        return f"script -m {parts[2]}"
    if parts[:1] == ["python"] and len(parts) > 1:
        return f"script {os.path.basename(parts[1])}"
    if summary.get("script"):
        return f"script {os.path.basename(str(summary['script']))}"
    return f"{summary['strategy']} {summary.get('model')}" if summary.get("strategy") else None


def run_status(run_dir: str, summary: Dict[str, Any], plan: Dict[str, Any], held: bool) -> str:
    """running: a launcher holds its lock now. Otherwise what summary.json says, unless a later launch
    (plan.json newer than it) left none: that one died (SIGKILL, a lost machine) and is `dead`."""
    if held:
        return Status.RUNNING
    summary_time = _mtime(os.path.join(run_dir, "summary.json"))
    plan_time = _mtime(os.path.join(run_dir, "plan.json"))
    if summary and not (plan_time and summary_time and plan_time > summary_time + 1.0):
        return SUMMARY_STATUS.get(summary.get("status"), Status.UNKNOWN)
    node_end = this_launch_node_end(run_dir, plan_time or 0.0)
    if node_end:  # one node of a multi-machine job whose summary another node wrote (elsewhere)
        return SUMMARY_STATUS.get(node_end, Status.UNKNOWN)
    if plan:
        return Status.DEAD  # it started (plan.json) and nobody holds it, but it never wrote how it ended
    return Status.UNKNOWN  # a SLURM job still queued (or lost): `status RUN` asks the scheduler


def this_launch_node_end(run_dir: str, since: float) -> Optional[Status]:
    """How the newest node record (nodes/node-K.json, launcher.backends.node) written since plan.json says it ended."""
    folder = os.path.join(run_dir, NODES_DIR)
    try:
        records = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".json")]
    except OSError:
        return None
    fresh = [(mtime, p) for p in records if (mtime := _mtime(p) or 0.0) >= since]
    return NODE.read(_read_json(max(fresh)[1])).get("status") if fresh else None


def target_steps(run_dir: str, summary: Dict[str, Any]) -> Optional[int]:
    """trainer.steps of the built-in trainer, from config.yaml; None for a script (its own loop decides)."""
    try:
        with os.fdopen(safefs.open_regular(os.path.join(run_dir, "config.yaml")), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return summary.get("steps") if summary.get("model") else None
    script = SCRIPT_PATH.search(text)
    if script and script.group(1) != "null":
        return None
    section = text.split("\ntrainer:\n", 1)
    match = STEPS_LINE.search(section[1]) if len(section) == 2 else None
    return int(match.group(1)) if match else None


def last_metrics(path: str) -> Dict[str, Any]:
    """The last whole JSON line of metrics.jsonl, reading only its tail."""
    try:
        with os.fdopen(safefs.open_regular(path), "rb") as f:  # a FIFO planted there: none, not a wait
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read()
    except OSError:
        return {}
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if line.startswith(b"{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue  # half-written (being appended now) or cut by the tail window
            if isinstance(data, dict):
                return data
    return {}


def attempts_so_far(run_dir: str) -> int:
    """Restarts of a job still running: rank 0's attempt logs (logs/rank-0.attempt-N.log)."""
    logs = os.path.join(run_dir, "logs")
    try:
        return sum(1 for name in os.listdir(logs) if name.startswith("rank-0.attempt-") and name.endswith(".log"))
    except OSError:
        return 0


def failed_rank(summary: Dict[str, Any], status: str) -> Optional[int]:
    """The rank a failed run's agent found failed first (summary.json's root_cause), not rank 0's knock-on error."""
    cause = summary.get("root_cause") if status == Status.FAILED else None
    rank = cause.get("rank") if isinstance(cause, dict) else None
    return rank if isinstance(rank, int) else None


def next_command(run_dir: str, status: str, submitted: bool, has_checkpoints: bool, failed: Optional[int] = None,
                 requeued: Optional[bool] = None) -> str:
    """What to type next: follow a running (or requeued) job, resume a stopped one, read a finished one's logs (a
    failed one's from the rank that failed first)."""
    where = shlex.quote(run_dir)
    if submitted and (status == Status.UNKNOWN or (status == Status.PREEMPTED and requeued is not False)):
        return f"python -m launcher status {where}"  # queued, requeued or lost: only its scheduler knows
    if status == Status.RUNNING:
        return f"python -m launcher logs {where} -f"
    if status in (Status.FAILED, Status.INTERRUPTED, Status.PREEMPTED, Status.DEAD) and has_checkpoints:
        return f"python -m launcher resume {where}"
    return f"python -m launcher logs {where}" + (f" --rank {failed}" if failed is not None else "")


def sweep_row(sweep_dir: Path, now: float) -> Dict[str, Any]:
    """A sweep (sweep.json, written by the sweep command) and one member row per grid point."""
    sweep = _read_json(sweep_dir / "sweep.json")
    members = []
    for member in sweep.get("members") or []:
        run_dir = sweep_dir / str(member.get("run_dir", ""))
        row = run_row(run_dir, now) if is_run_dir(run_dir) else pending_row(run_dir, now)
        row["overrides"] = dict(member.get("overrides") or {})
        row["index"] = member.get("index")
        members.append(row)
    held = bool(live_holders(sweep_dir))
    return parent_row(sweep_dir, "sweep", sweep.get("sweep_id") or sweep_dir.name, list(sweep.get("keys") or []),
                      members, now, sweep.get("created"), held=held, done=False, cluster=sweep.get("cluster"))


def group_row(group_dir: Path, kind: str, now: float) -> Dict[str, Any]:
    """A `compare` (one run per strategy) or `scale` (one per size) folder: <dir>/runs/<name>/."""
    runs = group_dir / "runs"
    members = []
    for run_dir in sorted(_subdirs(runs)) if runs.is_dir() else []:
        if not is_run_dir(run_dir):
            continue
        row = run_row(run_dir, now)
        row["overrides"] = member_overrides(kind, run_dir.name)
        members.append(row)
    keys = ["trainer.strategy"] if kind == "compare" else ["nodes", "gpus", "round"]
    report = group_dir / f"{kind}.json"
    return parent_row(group_dir, kind, group_dir.name, keys, members, now, _mtime(group_dir), held=False,
                      done=report.is_file())


def member_overrides(kind: str, name: str) -> Dict[str, str]:
    if kind == "compare":
        return {"trainer.strategy": name}
    # launcher.commands.scale: SweepPoint.name for round 1, then -r<round>
    match = re.fullmatch(r"n(\d+)-g(\d+)(?:-r(\d+))?", name)
    return {"nodes": match.group(1), "gpus": match.group(2), "round": match.group(3) or "1"} if match else {}


def parent_row(path: Path, kind: str, run_id: str, keys: List[str], members: List[Dict[str, Any]], now: float,
               created: Optional[float], held: bool, done: bool, cluster: Optional[str] = None) -> Dict[str, Any]:
    """A row over member rows: running while any member (or the parent's runner) runs; step counts members done."""
    states = [m["status"] for m in members]
    if held or Status.RUNNING in states:
        status = Status.RUNNING
    elif done or (states and all(s == Status.COMPLETED for s in states)):
        status = Status.COMPLETED
    elif cluster == "slurm" and Status.UNKNOWN in states:
        status = Status.UNKNOWN  # members still queued on SLURM, as far as files tell
    elif any(s in (Status.FAILED, Status.DEAD) for s in states):
        status = Status.FAILED
    elif Status.PREEMPTED in states:
        status = Status.PREEMPTED
    else:
        status = Status.INTERRUPTED if members else Status.UNKNOWN
    started = float(created) if created else _mtime(path)
    where = shlex.quote(str(path))
    unfinished = kind == "sweep" and status != Status.RUNNING and any(s != Status.COMPLETED for s in states)
    throughputs = [m["throughput"] for m in members if m["status"] == Status.RUNNING and m["throughput"]]
    whats = sorted({str(m.get("what")) for m in members if m.get("what")})
    return {
        "run_id": run_id, "path": str(path), "kind": kind, "status": status,
        "step": states.count(Status.COMPLETED), "steps": len(members),
        "what": whats[0] if len(whats) == 1 else None,  # the members' where they all run the same
        "throughput": sum(throughputs) if throughputs else None, "steps_per_s": None, "loss": None,
        "goodput": None,
        "restarts": sum(int(m.get("restarts") or 0) for m in members),
        "started": started, "age_s": max(0.0, now - started) if started else None,
        "command": f"python -m launcher resume {where}" if unfinished else f"python -m launcher ls {where}",
        "members": members, "keys": keys,
    }


def pending_row(run_dir: Path, now: float) -> Dict[str, Any]:
    """A sweep member whose run has not started (no run directory yet)."""
    return {"run_id": run_dir.name, "path": str(run_dir.resolve()), "kind": "unknown", "status": Status.UNKNOWN,
            "what": None, "step": None, "steps": None, "throughput": None, "steps_per_s": None, "loss": None,
            "goodput": None, "restarts": 0, "started": None,
            "age_s": None, "command": "", "pending": True}


def error_line(text: Any) -> Optional[str]:
    """An error as ls and the board show it: its first line, 200 characters at most; None for none."""
    return first_line(text)[:200] if text else None


def _subdirs(path: Path) -> Iterable[Path]:
    try:
        with os.scandir(path) as entries:
            return [Path(e.path) for e in entries if e.is_dir() and not e.name.startswith(".")]
    except OSError:
        return []


def _read_json(path: Union[str, Path]) -> Dict[str, Any]:
    try:
        with os.fdopen(safefs.open_regular(str(path)), "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return {}  # absent, or being replaced this instant (writes are atomic renames: rare)
    return data if isinstance(data, dict) else {}


def _names(path: Path) -> Set[str]:
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


def _mtime(path: Union[str, Path]) -> Optional[float]:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _count(value: Any) -> int:
    """A count read back from a run's files: a non-negative int, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _node_name(value: Any) -> str:
    """A node's host:pid read back from a run's files, fit for a terminal ('?' where it is not)."""
    return value if isinstance(value, str) and len(value) <= 300 and value.isprintable() else "?"
