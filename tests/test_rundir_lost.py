"""The run directory deleted or made read-only while a real job runs: noticed within seconds, the job stopped
in one line (exit 1, no launcher traceback, no process left), saying what is left; a read-only one resumes once
writable again."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import QUIET, kill_group, read_summary, run_launcher, start_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
JOB = ["--gpus", "2", *QUIET, "trainer.steps=300", "trainer.log_every=100", "checkpoint.every_steps=100", "run_id=r"]
# From step 101 (after the first checkpoint) rank 0 sleeps a second a step (no CPU): the job is still running
# when the run directory goes, whatever the load; the resume (no fault) trains the 200 steps left.
SLOW_AFTER_FIRST_CHECKPOINT = {"LAUNCHER_INJECT_FAULT": "rank=0,step=101,action=slow"}


def wait_for_checkpoint(run_dir: Path, proc, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "checkpoints").is_dir() and any(p.name.startswith("step-") for p in (run_dir / "checkpoints").iterdir()):
            return
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        time.sleep(0.2)
    raise AssertionError("no checkpoint within the time allowed")


def ended_in_one_line(proc, since: float) -> str:
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - since < 30, "the lost run directory went unnoticed"
    assert proc.returncode == 1, out[-3000:]
    own = [line for line in out.splitlines() if not line.startswith("[rank")]
    assert not any(line.startswith("Traceback") for line in own), out[-3000:]
    assert own[-1].startswith("error: the run directory "), own[-5:]
    return own[-1]


def test_a_deleted_run_directory_stops_the_job_in_one_line(tmp_path):
    runs = tmp_path / "runs"
    proc = start_launcher([*JOB, f"output_dir={runs}"], tmp_path, env=SLOW_AFTER_FIRST_CHECKPOINT)
    try:
        wait_for_checkpoint(runs / "r", proc)
        shutil.rmtree(runs / "r")
        line = ended_in_one_line(proc, time.monotonic())
    finally:
        kill_group(proc)
    assert "was deleted or moved while the job ran: the job was stopped; nothing more could be saved" in line


def test_a_read_only_run_directory_stops_the_job_and_resumes_once_writable(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "r"
    proc = start_launcher([*JOB, f"output_dir={runs}"], tmp_path, env=SLOW_AFTER_FIRST_CHECKPOINT)
    mounted = False
    try:
        wait_for_checkpoint(run_dir, proc)
        bind = subprocess.run(["mount", "--bind", str(run_dir), str(run_dir)], capture_output=True, text=True)
        if bind.returncode != 0:
            pytest.skip(f"cannot make a read-only bind mount here (needs root and mount): {bind.stderr.strip()}")
        mounted = True
        subprocess.run(["mount", "-o", "remount,bind,ro", str(run_dir)], check=True, capture_output=True)
        line = ended_in_one_line(proc, time.monotonic())
    finally:
        if mounted:
            subprocess.run(["umount", str(run_dir)], check=True)
        kill_group(proc)
    assert "became read-only" in line and "its newest checkpoint, " in line, line
    assert line.endswith(f"make it writable again and continue with python -m launcher resume {run_dir}"), line
    resumed = run_launcher(["resume", str(run_dir)], cwd=tmp_path, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == 300 and summary["resumed_from_step"] >= 100
