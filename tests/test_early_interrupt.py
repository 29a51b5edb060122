"""Ctrl-C in a run's first moments: always exit 130 with one "interrupted" line, no traceback, no process
left, and either no run directory or one whose summary says "interrupted" (launcher.interrupts).

bench/early_interrupt.py is the long version (--launches N); this is a bounded sample of it.
"""

import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

from launcher.agent.processes import spawn_worker
from launcher.agent.zygote import Zygote
from tests.helpers import QUICK, REPO, catches, descendants, group_processes, kill_group, launcher_env, read_summary, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

# Each of the four ways (trainer or script; SIGINT to the launcher or to its group) twice, spread over the window
# (~1.5 CPU-s a launch; bench/early_interrupt.py --launches N for a long run)
LAUNCHES = 8
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


def read_what_is_there(fd: int) -> str:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1 << 16).decode()
    except BlockingIOError:
        return ""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_the_agents_stop_reaches_a_worker_whose_code_has_not_started_yet(tmp_path, start_method):
    """A Ctrl-C as the workers start: the agent's one SIGINT can reach a rank before its code has started. It stops
    the rank once the code starts; it was lost (the rank trained on, and a short run ended "completed", exit 0).

    Deterministic: the script is a FIFO, so the worker waits in reading it, before its code starts, until the
    SIGINT has been sent; then the script is written: it would run for 5 s and print its last line.
    """
    script = tmp_path / "script.py"
    os.mkfifo(script)
    spec = {"kind": "script", "target": str(script), "args": [], "env": launcher_env(), "cwd": str(tmp_path),
            "error_file": None, "slurm": False}
    (out_r, out_w), (err_r, err_w), (status_r, status_w) = os.pipe(), os.pipe(), os.pipe()
    zygote, popen = None, None
    try:
        if start_method == "fork":
            zygote = Zygote("script", launcher_env())
            pid = zygote.fork(spec, [out_w, err_w, status_w])
        else:
            popen = spawn_worker(spec, launcher_env(), str(tmp_path), out_w, err_w, status_w)
            pid = popen.pid
        for fd in (out_w, err_w, status_w):
            os.close(fd)
        os.kill(pid, signal.SIGINT)  # what the agent's shutdown sends (launcher.agent.processes)
        script.write_text("import time\ntime.sleep(5)\nprint('ran to its end', flush=True)\n")
        deadline = time.monotonic() + 60
        code = None
        while code is None and time.monotonic() < deadline:
            code = popen.poll() if popen is not None else zygote.poll().get(pid)
            time.sleep(0.05)
        out, err = (read_what_is_there(fd) for fd in (out_r, err_r))
    finally:
        if zygote is not None:
            zygote.stop()  # kills what it holds
        if popen is not None and popen.poll() is None:
            popen.kill()
            popen.wait()
        for fd in (out_r, err_r, status_r):
            os.close(fd)
    assert code == 128 + signal.SIGINT, f"exit {code}\n{out}{err}"
    assert "ran to its end" not in out and "KeyboardInterrupt" in err, out + err


def test_a_ctrl_c_inside_a_stores_start_is_a_keyboardinterrupt_and_leaves_no_socket():
    """A SIGINT while a TCPStore starts (CI's Ctrl-C 1.5 s in): the store had closed the socket handed to it, and
    closing it again raised EBADF, a traceback in place of "interrupted". Signals land at moments spread over the start."""
    from launcher.agent.stores import listening_store

    armed = [False]

    def interrupt(_signum, _frame):
        if armed[0]:  # once a start: never in the loop's own bookkeeping
            armed[0] = False
            raise KeyboardInterrupt

    listening_store("127.0.0.1", 0, 1)  # torch's first store opens what every later one shares; this one is dropped
    before, raised = len(os.listdir("/proc/self/fd")), []
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        for i in range(120):
            armed[0] = True
            try:
                signal.setitimer(signal.ITIMER_REAL, 0.0001 * (i % 40) + 1e-6)
                store = listening_store("127.0.0.1", 0, 1)
                del store
            except BaseException as e:  # noqa: B036  (what a Ctrl-C raises is the point)
                raised.append(type(e))  # the class only: a traceback would keep the failed store's frame, and its socket
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert raised and set(raised) == {KeyboardInterrupt}, set(raised)
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 1, os.listdir("/proc/self/fd")
