"""A submitted SLURM job seen from outside: its record (job.json), its state (sacct), its logs.

Shared by `--wait` and the SLURM backend (launcher.backends.slurm.backend: status, logs, cancel). The only places that run
SLURM's client commands after submission.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, TextIO

from launcher.errors import LaunchError
from launcher.rundir import read_json
from launcher.runtime import formatting
from launcher.runtime.schema import Status

JOB_FILE = "job.json"
# sacct states after which the job will not run again (REQUEUED and PREEMPTED may run again).
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE")
EXIT_CODES = {"COMPLETED": 0, "CANCELLED": 130}  # anything else final: 1, or a preempted job's signal (140)
FOLLOW_S = 0.25  # how often a followed log is read: its lines reach the console within this


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


def node_output(job: Dict[str, Any]) -> Optional[Path]:
    """Node 0's task output (submitit's <job>_0_log.out): its node agent's console."""
    folder = job.get("slurm_folder")
    return Path(str(folder)) / f"{job['job_id']}_0_log.out" if folder else None


def read_summary(run_dir: Path) -> Dict[str, Any]:
    summary_path = run_dir / "summary.json"
    try:
        summary = read_json(summary_path) if summary_path.is_file() else {}
    except (OSError, ValueError):  # replaced this instant
        summary = {}
    return summary if isinstance(summary, dict) else {}


def exit_code(run_dir: Path, state: str) -> int:
    """A final state's exit code: a job that was preempted and not requeued ends with its signal's (140), as a run
    stopped by a signal does; CANCELLED 130, COMPLETED 0, any other 1."""
    summary = read_summary(run_dir)
    if state != "COMPLETED" and summary.get("status") == Status.PREEMPTED:
        return 128 + int(getattr(signal.Signals, str(summary.get("stopped_by")), signal.SIGUSR2))
    return EXIT_CODES.get(state, 1)


def outcome_line(run_dir: Path, job: Dict[str, Any], state: str) -> str:
    """'job 12 COMPLETED: ...' with the run's own account (summary.json) of what failed, where there is one; a
    preempted job's when and whether it was requeued."""
    summary = read_summary(run_dir)
    line = f"SLURM job {job['job_id']} {state}"
    if summary.get("status") == Status.PREEMPTED:
        line += f": {preemption_note(summary, state)}"
    elif summary.get("error"):
        line += f": {summary['error']}"
    elif state == "COMPLETED" and summary.get("status") == Status.COMPLETED:
        line += (f": {summary.get('steps')} steps, world size {summary.get('world_size')}, "
                 f"final loss {formatting.loss(summary.get('final_loss'), '-')}, restarts {summary.get('restarts')}")
    elif state in FINAL_STATES and state != "COMPLETED":
        line += f": see `python -m launcher logs {run_dir}` and {run_dir}/slurm/"
    return line


def preemption_note(summary: Dict[str, Any], state: str) -> str:
    """A preempted job's summary in words, as it stands in this state (running again once requeued)."""
    if state == "RUNNING" and summary.get("requeued"):
        return f"requeued after its preemption at {formatting.clock(summary.get('preempted_at'))}, running again"
    return formatting.preemption(summary)


def launcher_line(line: str) -> bool:
    """A node agent's own line in its console output (its ranks' lines there are in the ranks' logs too)."""
    return line.startswith(("[launcher", "error:", "warning:"))


class LogFollower:
    """Prints what a log file gains; starts over when the file is replaced (a requeued job starts a new one).
    keep: print only the whole lines it passes (a node's console output: its own lines, launcher_line)."""

    def __init__(self, path: Path, out: TextIO = sys.stdout, keep: Optional[Callable[[str], bool]] = None) -> None:
        self.path, self.out, self.pos, self.inode = path, out, 0, 0
        self.keep, self.partial = keep, ""

    def poll(self) -> None:
        try:
            stat = self.path.stat()
        except OSError:
            return
        if stat.st_size < self.pos or stat.st_ino != self.inode:
            self.pos, self.inode = 0, stat.st_ino
        if stat.st_size == self.pos:
            return
        with self.path.open("rb") as f:
            f.seek(self.pos)
            text = f.read().decode("utf-8", errors="replace")
            self.pos = f.tell()
        if self.keep is not None:
            *whole, self.partial = (self.partial + text).split("\n")
            text = "".join(f"{line}\n" for line in whole if self.keep(line))
        self.out.write(text)
        self.out.flush()


@contextlib.contextmanager
def following(path: Path, node_output: Optional[Path] = None) -> Iterator[None]:
    """Rank 0's log followed to stdout, and node 0's own lines from its console output (node_output: a node starting
    says what it does while the ranks have nothing to say yet) to stderr, every FOLLOW_S, in a thread of its own
    (sacct's answer, or the Ray driver's work, can take seconds under load), while the block runs; read once more at
    its end."""
    followers, done = [LogFollower(path)], threading.Event()
    if node_output is not None:
        followers.append(LogFollower(node_output, sys.stderr, launcher_line))

    def follow() -> None:
        while not done.wait(FOLLOW_S):
            for follower in followers:
                follower.poll()

    thread = threading.Thread(target=follow, name="log-follower", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
        for follower in followers:
            follower.poll()


def wait_for_job(run_dir: Path, job: Dict[str, Any], timeout_s: Optional[float] = None, poll_s: float = 2.0) -> int:
    """Block until the job ends, streaming rank 0's log as it grows; the exit code follows the job's final state.
    A preempted job waits for its requeue (REQUEUED, PENDING: not final), saying so."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    state, last = "UNKNOWN", ""
    with following(rank_log(run_dir, 0), node_output(job)):
        while True:
            state = job_state(job["job_id"])
            if state != last:
                summary = read_summary(run_dir)
                preempted = summary.get("status") == Status.PREEMPTED and state not in FINAL_STATES
                said = f": {preemption_note(summary, state)}" if preempted else ""
                print(f"[launcher] SLURM job {job['job_id']}: {state}{said}", file=sys.stderr, flush=True)
                last = state
            if state in FINAL_STATES:
                break
            if deadline is not None and time.monotonic() > deadline:
                print(f"[launcher] still {state} after {timeout_s:.0f}s; the job goes on (cancel RUN stops it)",
                      file=sys.stderr)
                return 1
            time.sleep(poll_s)
        time.sleep(0.5)
    print(f"[launcher] {outcome_line(run_dir, job, state)}", file=sys.stderr, flush=True)
    return exit_code(run_dir, state)
