"""Ctrl-C and SIGTERM stop the job and leave no process behind."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import QUICK, descendants, kill_group, launcher_env, only_run_dir, read_summary, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def start_long_job(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "--gpus", "2", f"output_dir={tmp_path}", "trainer.steps=100000",
         "trainer.log_every=20", *QUICK],
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
    assert read_summary(only_run_dir(tmp_path))["status"] == "interrupted"
