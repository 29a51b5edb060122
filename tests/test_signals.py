"""Ctrl-C and SIGTERM stop the job after a checkpoint, leave no process behind, and the run resumes."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import QUIET, descendants, kill_group, launcher_env, only_run_dir, read_summary, run_launcher, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def start_long_job(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={tmp_path}", "trainer.steps=100000",
         "trainer.log_every=20", "checkpoint.every_steps=0", *QUIET],
        cwd=tmp_path, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = [p for p in tmp_path.iterdir() if p.is_dir()]
        if runs and (runs[0] / "metrics.jsonl").exists() and (runs[0] / "metrics.jsonl").read_text().strip():
            return proc
        time.sleep(0.2)
    kill_group(proc)
    raise AssertionError("the job never started training")


@pytest.mark.parametrize("how, code", [("ctrl-c", 130), ("sigterm", 143)])
def test_interrupt_stops_everything(tmp_path, how, code):
    proc = start_long_job(tmp_path)
    workers = descendants(proc.pid)
    assert len(workers) >= 2, workers
    try:
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # the terminal signals the whole foreground group
        else:
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        kill_group(proc)
    assert proc.returncode == code, out
    assert wait_gone(workers, timeout=15) == []
    run_dir = only_run_dir(tmp_path)
    assert read_summary(run_dir)["status"] == "interrupted"
    # the workers checkpointed on the way out (checkpoint.every_steps=0: no other checkpoint exists)
    saved = list((run_dir / "checkpoints").glob("step-*"))
    assert len(saved) == 1 and (saved[0] / "manifest.json").is_file(), out
    assert "no clean stop" not in out
    assert f"continue with: python -m launcher resume {run_dir}" in out

    step = int(saved[0].name.split("-")[1])
    resumed = run_launcher(["resume", str(run_dir), f"trainer.steps={step + 5}"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert (summary["status"], summary["resumed_from_step"], summary["steps"]) == ("completed", step, step + 5)


def test_a_stuck_worker_cannot_hold_up_the_stop(tmp_path):
    """A rank that never reaches a step boundary: the others wait for it, the grace period ends them all."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={tmp_path}", "trainer.steps=100",
         "checkpoint.every_steps=5", "checkpoint.grace_s=3", *QUIET],
        cwd=tmp_path, env=launcher_env({"LAUNCHER_INJECT_FAULT": "rank=1,step=12,action=hang"}),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        from tests.test_restarts import wait_for_hang

        wait_for_hang(tmp_path)
        workers = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        out, _ = proc.communicate(timeout=30)
        assert wait_gone(workers, timeout=max(0.0, 15 - (time.monotonic() - signalled))) == []
    finally:
        kill_group(proc)
    assert proc.returncode == 143, out
    run_dir = only_run_dir(tmp_path)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-00000005", "step-00000010"]  # nothing half-written
    assert "no clean stop within 3s of SIGTERM" in (run_dir / "logs" / "rank-1.log").read_text()


def test_a_stop_signal_while_a_launcher_thread_starts_reaches_its_handler_after_the_start():
    """launcher.interrupts.start_thread: a stop signal that comes as the thread starts is kept over start() and then
    raised to the handler before (torch's agent handler raises in there: threading then lost track of the thread)."""
    import threading

    from launcher.interrupts import start_thread

    seen = []
    started = threading.Event()

    def handler(signum, _frame):
        seen.append((signum, thread.is_alive(), thread in threading.enumerate()))

    def run():
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the main thread is inside start()
        started.wait(10)

    thread = threading.Thread(target=run, daemon=True)
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        start_thread(thread)
        for _ in range(100):
            if seen:
                break
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGTERM, previous)
        started.set()
        thread.join(10)
    assert seen == [(signal.SIGTERM, True, True)]
