"""A submitted SLURM job seen from outside: its record (job.json), its state (sacct), its logs.

Shared by `--wait` and the SLURM backend (launcher.backends.slurm.backend: status, logs, cancel). The only places that run
SLURM's client commands after submission.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, TextIO

from launcher.errors import LaunchError
from launcher.rundir import read_json
from launcher.runtime import formatting

JOB_FILE = "job.json"
# sacct states after which the job will not run again (REQUEUED and PREEMPTED may run again).
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE")
EXIT_CODES = {"COMPLETED": 0, "CANCELLED": 130}  # anything else final: 1


def _slurm(args: List[str], timeout: float = 30) -> str:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise LaunchError(f"{args[0]} not found: SLURM's client commands must be on PATH (slurm-client)") from e
    except subprocess.TimeoutExpired as e:
        raise LaunchError(f"`{' '.join(args)}` did not answer within {timeout:.0f}s: is slurmctld up?") from e
    if done.returncode != 0:
        first = formatting.first_line(done.stderr) or "no message"
        raise LaunchError(f"`{' '.join(args)}` failed: {first}")
    return done.stdout


def job_state(job_id: str) -> str:
    """The job's current state as sacct reports it (a requeued job's latest record); UNKNOWN if none yet."""
    out = _slurm(["sacct", "-j", str(job_id), "-X", "-n", "-P", "-o", "State"])
    lines = [line.split()[0] for line in out.splitlines() if line.strip()]
    return lines[-1] if lines else "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED


def job_states(job_ids: List[str]) -> Dict[str, str]:
    """Several jobs' current states in one sacct call (a requeued job's latest record wins)."""
    out = _slurm(["sacct", "-j", ",".join(job_ids), "-X", "-n", "-P", "-o", "JobIDRaw,State"])
    states: Dict[str, str] = {}
    for line in out.splitlines():
        job, _, state = line.partition("|")
        if job.strip() and state.strip():
            states[job.strip()] = state.split()[0]
    return states


def cancel_job(job_id: str) -> None:
    _slurm(["scancel", str(job_id)])


def rank_log(run_dir: Path, rank: int) -> Path:
    return run_dir / "logs" / f"rank-{rank}.log"


def outcome_line(run_dir: Path, job: Dict[str, Any], state: str) -> str:
    """'job 12 COMPLETED: ...' with the run's own account (summary.json) of what failed, where there is one."""
    summary_path = run_dir / "summary.json"
    summary = read_json(summary_path) if summary_path.is_file() else {}
    line = f"SLURM job {job['job_id']} {state}"
    if summary.get("error"):
        line += f": {summary['error']}"
    elif state == "COMPLETED" and summary.get("status") == "completed":
        line += (f": {summary.get('steps')} steps, world size {summary.get('world_size')}, "
                 f"final loss {formatting.loss(summary.get('final_loss'), '-')}, restarts {summary.get('restarts')}")
    elif state in FINAL_STATES and state != "COMPLETED":
        line += f": see `python -m launcher logs {run_dir}` and {run_dir}/slurm/"
    return line


class LogFollower:
    """Prints what a log file gains; starts over when the file is replaced (a requeued job rewrites it)."""

    def __init__(self, path: Path, out: TextIO = sys.stdout) -> None:
        self.path, self.out, self.pos = path, out, 0

    def poll(self) -> None:
        try:
            size = self.path.stat().st_size
        except OSError:
            return
        if size < self.pos:
            self.pos = 0
        if size == self.pos:
            return
        with self.path.open("r", encoding="utf-8", errors="replace") as f:
            f.seek(self.pos)
            self.out.write(f.read())
            self.pos = f.tell()
        self.out.flush()


def wait_for_job(run_dir: Path, job: Dict[str, Any], timeout_s: Optional[float] = None, poll_s: float = 2.0) -> int:
    """Block until the job ends, streaming rank 0's log; the exit code follows the job's final state."""
    follower = LogFollower(rank_log(run_dir, 0))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    state, last = "UNKNOWN", ""
    while True:
        follower.poll()
        state = job_state(job["job_id"])
        if state != last:
            print(f"[launcher] SLURM job {job['job_id']}: {state}", file=sys.stderr, flush=True)
            last = state
        if state in FINAL_STATES:
            break
        if deadline is not None and time.monotonic() > deadline:
            print(f"[launcher] still {state} after {timeout_s:.0f}s; the job goes on (cancel RUN stops it)", file=sys.stderr)
            return 1
        time.sleep(poll_s)
    time.sleep(0.5)
    follower.poll()
    print(f"[launcher] {outcome_line(run_dir, job, state)}", file=sys.stderr, flush=True)
    return EXIT_CODES.get(state, 1)
