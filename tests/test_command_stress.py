"""The commands that start and stop processes, besides a launch, repeated in a row: the board server,
`logs -f` following a run to its end, and Ctrl-C of a running sweep. Each round must end with the
right exit code and leave no process of its own behind.

LAUNCHER_STRESS_ROUNDS=50 repeats each that many times (the bounded suite default is 2: each round is a
real launch, ~12 CPU-s on 2 cores).
"""

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.board_helpers import on_board, wait_for_url
from tests.helpers import QUICK, communicate_bounded, group_processes, kill_group, run_launcher, start_launcher

ROUNDS = int(os.environ.get("LAUNCHER_STRESS_ROUNDS", "2"))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300 + 120 * ROUNDS)]


def ended(proc: subprocess.Popen, timeout: float) -> str:
    """Its output (stderr merged in) once it has exited; fails (after killing its group) if it has not within timeout."""
    return communicate_bounded(proc, timeout, " ".join(proc.args[2:4]))[0]


def nothing_left(proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 10
    while group_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = group_processes(proc.pid)
    kill_group(proc)
    assert not left, f"left running: {[p.cmdline() for p in left]}"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    done = run_launcher(["--gpus", "2", f"output_dir={out}", "run_id=done", "trainer.steps=20", "wandb.mode=disabled",
                         *QUICK], out, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGTERM])
def test_the_board_starts_serves_and_stops_every_time(finished_run, how):
    for round_ in range(ROUNDS):
        proc = start_launcher(["board", str(finished_run), "--port", "0"], cwd=finished_run)
        try:
            url = wait_for_url(proc, timeout=60)
            with urllib.request.urlopen(on_board(url, "/api/runs"), timeout=30) as response:
                assert b'"done"' in response.read()
            os.killpg(proc.pid, how)  # as a terminal's Ctrl-C, or a service manager's stop
            out = ended(proc, 20)
        finally:
            nothing_left(proc)
        assert proc.returncode in (0, 128 + how, -how), (round_, proc.returncode, out[-2000:])
        assert "Traceback" not in out, out[-3000:]


def test_logs_follow_ends_with_the_run_every_time(tmp_path):
    for round_ in range(ROUNDS):
        out_dir = tmp_path / f"r{round_}"
        job = start_launcher(["--gpus", "2", f"output_dir={out_dir}", "run_id=live", "trainer.steps=150",
                              "trainer.log_every=10", "wandb.mode=disabled", *QUICK], cwd=tmp_path)
        follow = None
        try:
            deadline = time.monotonic() + 120
            while not (out_dir / "live" / "plan.json").is_file():
                assert job.poll() is None and time.monotonic() < deadline, "the run did not start"
                time.sleep(0.1)
            follow = start_launcher(["logs", str(out_dir / "live"), "-f"], cwd=tmp_path)
            assert ended(job, 240) is not None and job.returncode == 0
            followed = ended(follow, 60)  # ends by itself once the run has
        finally:
            nothing_left(job)
            if follow is not None:
                nothing_left(follow)
        assert follow.returncode == 0, (round_, followed[-2000:])
        assert "step 150/150" in followed, followed[-2000:]


def test_ctrl_c_of_a_running_sweep_stops_every_member_every_time(tmp_path):
    for round_ in range(ROUNDS):
        out = tmp_path / f"r{round_}"
        # from step 11 rank 0 sleeps a second a step (no CPU): both members are mid-run when Ctrl-C comes
        proc = start_launcher(["sweep", "seed=1,2", "--parallel", "2", "--name", "s", "--output-dir", str(out),
                               *QUICK, "trainer.steps=1000", "trainer.log_every=10", "wandb.mode=disabled"],
                              cwd=tmp_path, env={"LAUNCHER_INJECT_FAULT": "rank=0,step=11,action=slow"})
        logs = [out / "s" / name / "logs" / "rank-0.log" for name in ("m000-seed=1", "m001-seed=2")]
        try:
            deadline = time.monotonic() + 150
            while not all(p.is_file() and "step 10/" in p.read_text(errors="replace") for p in logs):
                assert proc.poll() is None and time.monotonic() < deadline, "the members did not start training"
                time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches the whole group
            output = ended(proc, 90)
        finally:
            nothing_left(proc)
        assert proc.returncode == 130, (round_, output[-3000:])
        assert "Traceback" not in output, output[-3000:]
