"""Ctrl-C at every moment of a plain script's job: one round, judged (tests/test_ctrl_c.py runs a few,
bench/ctrl_c.py fifty).

A round starts `python -m launcher --gpus 2 ctrl_c_train.py` in its own session, waits for a moment of
the job's life, then sends SIGINT to the whole process group, as a terminal's Ctrl-C does (the launcher
and its zygote get it; the workers lead process groups of their own, as torchrun's do, and get the agent's
SIGINT). The moments, each reached by watching the job from outside:

    start-up  0-1.5 s after the launcher's first line (its imports, the plan, the zygote's start)
    workers   as the worker processes appear (forked from the zygote, in the bootstrap)
    init      after rank 0 printed "start", the script's first line (init_process_group, DDP)
    steps     while the ranks train
    end       after rank 0 printed "done" (destroy_process_group, the script's return, the interpreter's exit)
    exit      after summary.json was written (the launcher's last lines, its atexit handlers, the zygote's end)

A round is clean when no line of the console (stdout or stderr) shows a frame of a launcher file
(a script's own KeyboardInterrupt traceback is the script's, as under torchrun, and allowed), the
launcher ends with its one `interrupted` line and exit 130, or, when the job had already finished,
completed with exit 0, and no process of its group, nor any worker, is left. A round not over within
its timeout is a hang: its group is killed.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from tests.helpers import REPO, catches, descendants, group_processes, kill_group, launcher_env, wait_gone

SCRIPT = REPO / "tests" / "scripts" / "ctrl_c_train.py"
# A frame of a launcher file in a traceback: the package's own files, the bootstrap run as a program, or
# torch's elastic launcher (the agent's).
LAUNCHER_FRAME = re.compile(r'File "[^"]*(?:/launcher/|bootstrap\.py)')
Milestone = Callable[[Path, int], bool]


@dataclass
class Round:
    phase: str
    delay_s: float  # after the phase's milestone
    code: int
    leaked: bool  # a launcher frame on the console
    verdict: str  # clean | bug: <why>
    output: str


def rank0_printed(word: str) -> Milestone:
    def seen(out_dir: Path, _pid: int) -> bool:
        return any(word.encode() in _read(log) for log in out_dir.glob("*/logs/rank-0.log"))
    return seen


def summary_written(out_dir: Path, _pid: int) -> bool:
    return any(out_dir.glob("*/summary.json"))


def workers_running(_out_dir: Path, pid: int) -> bool:
    try:
        import psutil

        return len(psutil.Process(pid).children(recursive=True)) >= 3  # the zygote and two workers
    except Exception:  # noqa: BLE001  (psutil.Error: the launcher ended; the round's wait notices)
        return False


# phase -> (milestone, longest delay after it in seconds)
PHASES: Dict[str, Tuple[Optional[Milestone], float]] = {
    "start-up": (None, 1.5),
    "workers": (workers_running, 0.1),
    "init": (rank0_printed("start"), 0.3),
    "steps": (rank0_printed("step 20"), 1.0),
    "end": (rank0_printed("done"), 0.1),
    "exit": (summary_written, 0.05),
}


def one_round(tmp: Path, phase: str, rng: random.Random, timeout: float = 120.0, steps: int = 150) -> Round:
    """Start a job, Ctrl-C it at a random moment of phase, judge how it ended."""
    milestone, longest = PHASES[phase]
    delay = rng.uniform(0.0, longest)
    out_dir = tmp / "runs"
    argv = [sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={out_dir}", str(SCRIPT), str(steps)]
    proc = subprocess.Popen(argv, cwd=tmp, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        reach(proc, lambda: catches(proc.pid, signal.SIGHUP), timeout)
        if milestone is not None:
            reach(proc, lambda: milestone(out_dir, proc.pid), timeout)
        time.sleep(delay)
        started = descendants(proc.pid)  # the workers lead their own process groups: not in the launcher's
        try:
            os.killpg(proc.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, _ = proc.communicate()
            return Round(phase, delay, -1, bool(LAUNCHER_FRAME.search(out)), "bug: hung", out)
        left = wait_gone(group_processes(proc.pid) + started, timeout=5)
    finally:
        kill_group(proc)
    return Round(phase, delay, proc.returncode, bool(LAUNCHER_FRAME.search(out)), judge(proc.returncode, out, len(left)), out)


def reach(proc: subprocess.Popen, check: Callable[[], bool], timeout: float) -> None:
    """Poll until check() holds or the launcher ended (then the round judges what it printed)."""
    deadline = time.monotonic() + timeout
    while not check() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.003)


def judge(code: int, out: str, left: int) -> str:
    launcher_lines = [line for line in out.splitlines() if not line.startswith("[rank")]
    if LAUNCHER_FRAME.search(out):
        return "bug: a launcher frame on the console"
    if left:
        return f"bug: {left} process(es) left"
    if code == 130 and any("interrupted" in line for line in launcher_lines):
        return "clean"
    if code == 0 and any("completed" in line for line in launcher_lines):
        return "clean"  # the job had finished before the Ctrl-C reached it
    return f"bug: exit {code} without its line"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""
