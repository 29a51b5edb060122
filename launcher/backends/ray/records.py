"""A Ray job seen from outside: its record (job.json, written by its driver), its state, cancelling it.

The driver keeps job.json's `state` current (PENDING, RUNNING, then COMPLETED, FAILED or CANCELLED);
a driver that is gone without a final state was killed: its job is LOST.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, Dict

from launcher.rundir import read_json, write_json
from launcher.runtime import formatting
from launcher.runtime.schema import Status

JOB_FILE = "job.json"
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "LOST")
EXIT_CODES = {"COMPLETED": 0, "CANCELLED": 130}  # anything else final: 1


def update_job(run_dir: Path, fields: Dict[str, Any]) -> None:
    path = run_dir / JOB_FILE
    record = read_json(path) if path.is_file() else {}
    record.update(fields)
    write_json(path, record)


def driver_alive(job: Dict[str, Any]) -> bool:
    pid = job.get("driver_pid")
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (our own child, not reaped yet) is gone for this purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def job_state(run_dir: Path) -> str:
    job = read_json(run_dir / JOB_FILE)
    state = str(job.get("state", "PENDING"))
    if state not in FINAL_STATES and not driver_alive(job):
        return "LOST"
    return state


def outcome_line(run_dir: Path, job: Dict[str, Any], state: str) -> str:
    summary_path = run_dir / "summary.json"
    summary = read_json(summary_path) if summary_path.is_file() else {}
    line = f"Ray job {job.get('run_id', run_dir.name)} {state}"
    if summary.get("error") and state in FINAL_STATES:
        line += f": {summary['error']}"
    elif job.get("error"):
        line += f": {job['error']}"
    elif state == "COMPLETED" and summary.get("status") == Status.COMPLETED:
        loss = formatting.loss(summary.get("final_loss"), "-")
        trained = f"{summary['steps']} steps, final loss {loss}, " if summary.get("steps") else ""
        line += f": {trained}world size {summary.get('world_size')}, restarts {summary.get('restarts')}"
    elif state == "LOST":
        line += f": its driver (pid {job.get('driver_pid')}) is gone; see {run_dir}/logs/ray-driver.log"
    return line


def cancel(run_dir: Path, timeout_s: float = 60.0) -> str:
    """Stop the job through its driver (SIGTERM: the agents record the end, the driver removes its Ray objects)."""
    job = read_json(run_dir / JOB_FILE)
    state = job_state(run_dir)
    if state in FINAL_STATES:
        return f"Ray job {job.get('run_id')} already ended ({state}); nothing to cancel"
    os.kill(int(job["driver_pid"]), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and driver_alive(job):
        time.sleep(0.5)
    return f"cancelled Ray job {job.get('run_id')} (was {state}); run directory {run_dir} kept"
