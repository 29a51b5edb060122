"""Ctrl-C in a run's first moments: always exit 130 with one "interrupted" line, no traceback, no process
left, and either no run directory or one whose summary says "interrupted" (launcher.interrupts).

bench/early_interrupt.py is the long version (--launches N); this is a bounded sample of it.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from tests.helpers import QUICK, REPO, catches, descendants, group_processes, kill_group, launcher_env, read_summary, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LAUNCHES = 14
WINDOW_S = 1.5
SHAPES = {
    "trainer": ["--gpus", "2", "trainer.steps=300", *QUICK],
    "script": ["--gpus", "2", str(REPO / "tests" / "scripts" / "stress_ddp_tutorial.py")],
}


def wait_for_the_launchers_first_line(pid: int) -> None:
    """Until launcher.__main__ has run its first line: the hold catches SIGHUP, which Python leaves alone.

    Before that the interpreter is still starting (site-packages, 0.05-0.3 s), which no code of ours
    can guard; docs/run-directory.md "Exit codes" says so.
    """
    deadline = time.monotonic() + 30
    while not catches(pid, signal.SIGHUP):
        assert time.monotonic() < deadline, "the launcher never started"
        time.sleep(0.002)


def run_dir_made(out_dir: Path) -> bool:
    return out_dir.is_dir() and any(out_dir.iterdir())


def workers_started(pid: int) -> bool:
    return len(descendants(pid)) >= 3  # the zygote and two workers


def interrupt_once(tmp: Path, shape: str, delay: float, whole_group: bool,
                   milestone: Optional[Callable[[Path, int], bool]] = None) -> None:
    """Start a launch, SIGINT it `delay` s after its first line (or after the milestone), check how it ended."""
    out_dir = tmp / "runs"
    argv = [sys.executable, "-m", "launcher", f"output_dir={out_dir}", *SHAPES[shape]]
    if shape == "script":
        argv.append(str(tmp / "script-out"))
    proc = subprocess.Popen(argv, cwd=tmp, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        wait_for_the_launchers_first_line(proc.pid)
        deadline = time.monotonic() + 120
        while milestone is not None and not milestone(out_dir, proc.pid) and proc.poll() is None:
            assert time.monotonic() < deadline, "the launch never got there"
            time.sleep(0.005)
        time.sleep(delay)
        started = descendants(proc.pid)  # workers lead their own process groups, outside the launcher's
        if whole_group:
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the launcher and its zygote
        else:
            proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        left = wait_gone(group_processes(proc.pid) + started, timeout=5)
    finally:
        kill_group(proc)
    what = f"{shape}, SIGINT {delay:.2f}s after start{' to the group' if whole_group else ''}:\n{out}"
    assert proc.returncode == 130, what
    # A script's own KeyboardInterrupt traceback, [rank<k>]-prefixed, is the script's, as under torchrun.
    launcher_lines = [line for line in out.splitlines() if not line.startswith("[rank")]
    assert "interrupted" in out and not [line for line in launcher_lines if "Traceback" in line], what
    assert left == [], what
    runs = list(out_dir.iterdir()) if out_dir.is_dir() else []
    assert len(runs) <= 1, what
    for run_dir in runs:  # made: then whole, and its summary says how it ended
        assert (run_dir / "config.yaml").is_file() and (run_dir / "plan.json").is_file(), what
        assert read_summary(run_dir)["status"] == "interrupted", what
        assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".")], what


def test_ctrl_c_in_the_first_moments_always_stops_the_run_cleanly(tmp_path):
    for i in range(LAUNCHES):
        delay = WINDOW_S * i / (LAUNCHES - 1)  # spread over the window: imports, set-up, zygote, workers
        case = tmp_path / f"launch-{i}"
        case.mkdir()
        interrupt_once(case, "trainer" if i % 2 == 0 else "script", delay, whole_group=i % 4 >= 2)


@pytest.mark.parametrize("shape", ["trainer", "script"])
def test_ctrl_c_once_the_run_directory_exists_leaves_an_interrupted_summary(tmp_path, shape):
    (tmp_path / "dir").mkdir()
    interrupt_once(tmp_path / "dir", shape, 0.0, whole_group=False, milestone=lambda out, _pid: run_dir_made(out))
    assert (read_summary(next((tmp_path / "dir" / "runs").iterdir()))["status"]) == "interrupted"
    (tmp_path / "workers").mkdir()
    interrupt_once(tmp_path / "workers", shape, 0.0, whole_group=True, milestone=lambda _out, pid: workers_started(pid))
    assert (read_summary(next((tmp_path / "workers" / "runs").iterdir()))["status"]) == "interrupted"
