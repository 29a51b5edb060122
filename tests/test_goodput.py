"""Goodput: where a job's wall time went, adding up to the wall time, across restarts and resumes."""

import json

import pytest

from tests.helpers import QUIET, only_run_dir, read_metrics, read_summary, run_launcher
from launcher.runtime.goodput import CAUSES, account

pytestmark = pytest.mark.timeout(240)

# QUIET: W&B is not what goodput counts (its offline run costs a launch ~3 CPU-s; tests/test_metrics_runs.py has it)
JOB = ["--gpus", "2", "trainer.steps=40", "checkpoint.every_steps=8", "trainer.log_every=4", *QUIET]


def test_one_timeline_splits_into_causes_that_add_up():
    attempts = {
        0: {"first_step_at": 10.0, "active_until": 20.0, "block_s": 1.0, "kept": {"step": 8, "at": 16.0, "block_s": 0.5}},
        1: {"first_step_at": 25.0, "active_until": 40.0, "block_s": 2.0, "kept": {"step": 40, "at": 40.0, "block_s": 2.0}},
    }
    seconds = account(0.0, 41.0, attempts, {0: {"detected_at": 21.0}}, "completed")
    assert seconds == pytest.approx({"startup": 10.0, "checkpoint": 3.0, "failure_detection": 1.0, "restart": 4.0,
                                     "membership": 0.0, "recompute": 3.5, "hang": 0.0, "shutdown": 1.0,
                                     "good": 5.5 + 13.0})
    assert sum(seconds.values()) == pytest.approx(41.0)
    # attempt 1 dies while starting (no step): its 5 s were restart time, not detection
    died = account(0.0, 46.0, {0: attempts[0], 2: {**attempts[1], "first_step_at": 30.0}},
                   {0: {"detected_at": 21.0}, 1: {"detected_at": 26.0}}, "completed")
    assert died["restart"] == pytest.approx(5.0 + 4.0) and died["failure_detection"] == pytest.approx(1.0)
    assert sum(died.values()) == pytest.approx(46.0)
    hung = account(0.0, 41.0, {0: attempts[0]}, {0: {"detected_at": 30.0}}, "hung")
    assert hung["hang"] == pytest.approx(21.0) and hung["failure_detection"] == 0.0


def test_an_attempts_start_splits_into_phases_that_add_up():
    marks = {"launch": 22.0, "process_group": 22.5, "build": 23.0, "reload": 24.0}
    attempts = {
        0: {"first_step_at": 10.0, "active_until": 20.0, "block_s": 0.0, "marks": {"launch": 8.0, "process_group": 9.0}},
        1: {"first_step_at": 25.0, "active_until": 40.0, "block_s": 0.0, "marks": marks},
    }
    phases = {"startup": {}, "restart": {}}
    seconds = account(0.0, 41.0, attempts, {0: {"detected_at": 21.0}}, "completed", phases)
    assert phases["restart"] == pytest.approx({"launch": 1.0, "process_group": 0.5, "build": 0.5, "reload": 1.0,
                                               "first_step": 1.0})
    assert sum(phases["restart"].values()) == pytest.approx(seconds["restart"])
    # missing marks merge into the next phase; a mark out of order is clamped, never negative
    assert phases["startup"] == pytest.approx({"launch": 8.0, "process_group": 1.0, "first_step": 1.0})
    odd = {"startup": {}, "restart": {}}
    account(0.0, 41.0, {0: {**attempts[0], "marks": {"launch": 12.0, "build": 3.0}}}, {}, "completed", odd)
    assert odd["startup"] == pytest.approx({"launch": 10.0, "build": 0.0, "first_step": 0.0})


def assert_adds_up(figures, wall):
    total = figures["goodput_s"] + sum(figures["badput_s"].values())
    assert abs(total - wall) <= 0.01 * wall, (total, wall, figures)
    assert figures["goodput"] == pytest.approx(figures["goodput_s"] / wall, rel=1e-3)
    assert set(figures["badput_s"]) == set(CAUSES)


def test_a_restarted_job_accounts_for_every_second(tmp_path):
    result = run_launcher([*JOB, f"output_dir={tmp_path}", "--max-restarts", "1"], cwd=tmp_path, timeout=200,
                          env={"LAUNCHER_INJECT_FAULT": "rank=1,step=13"})
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    summary = read_summary(run_dir)
    assert summary["restarts"] == 1 and summary["goodput_wall_s"] == pytest.approx(summary["wall_s"], abs=1e-3)
    assert_adds_up(summary, summary["wall_s"])
    lost = summary["badput_s"]
    # steps 9-13 were done twice; the failure, the restart and the saves each cost something
    for cause in ("startup", "checkpoint", "failure_detection", "restart", "recompute", "shutdown"):
        assert lost[cause] > 0, cause
    assert lost["hang"] == 0 and 0 < summary["goodput"] < 1
    # the job's first step, not the restarted attempt's: start-up up to it is all start-up badput
    assert summary["time_to_first_step_s"] == pytest.approx(lost["startup"], abs=0.5)
    for cause in ("startup", "restart"):  # where each start went, by phase, adds up to the cause
        split = summary["badput_phases_s"][cause]
        assert sum(split.values()) == pytest.approx(lost[cause], abs=2e-3), (cause, split, lost)
        assert all(split[phase] > 0 for phase in ("launch", "process_group", "build", "reload", "first_step")), split
    assert f"goodput {summary['goodput']:.0%}" in result.stderr.strip().splitlines()[-1]
    last = read_metrics(run_dir)[-1]
    assert last["step"] == 40 and last["badput_s"]["restart"] == lost["restart"]


def test_resume_adds_the_earlier_launch(tmp_path):
    first = run_launcher([*JOB, f"output_dir={tmp_path}", "trainer.steps=20"], cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    run_dir = only_run_dir(tmp_path)
    before = read_summary(run_dir)
    second = run_launcher(["resume", str(run_dir), "trainer.steps=40"], cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    after = json.loads((run_dir / "summary.json").read_text())
    assert after["goodput_launches"] == 2
    assert after["goodput_wall_s"] == pytest.approx(before["wall_s"] + after["wall_s"], abs=1e-3)
    assert after["goodput_s"] > before["goodput_s"] and after["badput_s"]["startup"] > before["badput_s"]["startup"]
    assert_adds_up(after, after["goodput_wall_s"])
    # the last line says which figure is whose: this launch's time, every launch's goodput
    last = second.stderr.strip().splitlines()[-1]
    assert f"completed in {after['wall_s']:.1f}s (this launch)" in last, last
    assert f"goodput {after['goodput']:.0%} of {after['goodput_wall_s']:.1f}s over 2 launches" in last, last
