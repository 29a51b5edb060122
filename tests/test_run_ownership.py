"""A run directory belongs to the launcher that runs it: a second launch is refused, only `resume` continues a run.

Real launchers, real flocks, real signals: two launchers on one run_id at once, a new run on a
finished run's id, `resume` of a simulated two-node run, and SIGTERM after the last step.
"""

import json
import signal
import socket
import time

import pytest

from tests.helpers import QUIET, wait_while_running, kill_group, read_summary, run_launcher, start_launcher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def snapshot(run_dir):
    """Every file's bytes and mtime: what a refused launch must leave exactly as it was."""
    return {str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(run_dir.rglob("*")) if p.is_file()}


def one_line_error(result):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


WAITING_SCRIPT = """
import os, pathlib, sys, time
go, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
out.mkdir(exist_ok=True)
(out / "waiting").write_text("yes")
while not go.exists():
    time.sleep(0.05)
(out / f"result-rank-{os.environ['RANK']}.txt").write_text("done")
"""


def test_a_second_launcher_is_refused_by_name_and_a_new_run_on_a_finished_one_changes_nothing(tmp_path):
    script = tmp_path / "wait_for_go.py"
    script.write_text(WAITING_SCRIPT)
    go, out = tmp_path / "go", tmp_path / "out"
    common = ["--gpus", "1", f"output_dir={tmp_path}", "run_id=shared"]
    first = start_launcher([*common, str(script), str(go), str(out)], cwd=tmp_path)
    run_dir = tmp_path / "shared"
    try:
        wait_while_running((out / "waiting").is_file, 240, first, "the first run's script")
        second = run_launcher([*common, str(script), str(go), str(tmp_path / "other")], cwd=tmp_path, timeout=120)
        line = one_line_error(second)
        assert f"in use by the launcher on host {socket.gethostname()}, pid {first.pid}" in line
        assert "run_id=" in line  # the fix: another run id
        go.write_text("go")
        output, _ = first.communicate(timeout=120)
    finally:
        kill_group(first)
    assert first.returncode == 0, output
    assert read_summary(run_dir)["status"] == "completed"
    assert (out / "result-rank-0.txt").read_text() == "done"
    assert not (tmp_path / "other").exists()  # the refused launcher started nothing ...
    assert str(tmp_path / "other") not in (run_dir / "config.yaml").read_text()  # ... and wrote nothing

    before = snapshot(run_dir)
    again = run_launcher([*common, str(script), str(go), str(out)], cwd=tmp_path, timeout=120)
    line = one_line_error(again)
    assert "run_id=shared already names a run" in line and f"python -m launcher resume {run_dir}" in line
    assert snapshot(run_dir) == before  # no file rewritten, none added


def test_resume_of_a_simulated_two_node_run_completes_and_keeps_the_earlier_rank_logs(tmp_path):
    first = run_launcher(["--nodes", "2", "--gpus", "1", f"output_dir={tmp_path}", "run_id=sim", "trainer.steps=4",
                          "trainer.log_every=2", *QUIET], cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr
    run_dir = tmp_path / "sim"
    earlier = {k: (run_dir / "logs" / f"rank-{k}.log").read_text() for k in (0, 1)}
    assert "step 4/4" in earlier[0], earlier

    resumed = run_launcher(["resume", str(run_dir), "trainer.steps=6"], cwd=tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    summary = read_summary(run_dir)
    assert (summary["status"], summary["steps"], summary["resumed_from_step"]) == ("completed", 6, 4)
    assert summary["nodes"] == 2 and summary["world_size"] == 2
    kept = run_dir / "logs" / "before-resume-1"
    assert {k: (kept / f"rank-{k}.log").read_text() for k in (0, 1)} == earlier
    assert "resumed from" in (run_dir / "logs" / "rank-0.log").read_text()
    assert f"the earlier rank logs are in {kept}" in resumed.stderr


@pytest.mark.parametrize("moment", ["final gathers", "report"])
def test_sigterm_after_the_last_step_ends_completed(tmp_path, moment):
    """SIGTERM as the ranks finish (the agent stops them), or as the launcher reports and exits: completed, exit 0."""
    steps = 6
    proc = start_launcher(["--gpus", "2", f"output_dir={tmp_path}", "run_id=late", f"trainer.steps={steps}",
                           "trainer.log_every=1", *QUIET], cwd=tmp_path)
    run_dir = tmp_path / "late"
    last = run_dir / "checkpoints" / f"step-{steps:08d}" / "manifest.json"
    try:
        if moment == "final gathers":
            wait_while_running(last.is_file, 300, proc, "the last step's checkpoint")
            proc.send_signal(signal.SIGTERM)  # the ranks are in their final gathers, or already gone
            out, _ = proc.communicate(timeout=60)
        else:
            lines = []
            for line in proc.stdout:  # bounded by the test's timeout
                lines.append(line)
                if line.startswith("[launcher] completed in"):
                    break
            while proc.poll() is None:  # through the launcher's exit: its atexit handlers, its teardown
                proc.send_signal(signal.SIGTERM)
                time.sleep(0.05)
            out = "".join(lines) + proc.stdout.read()
    finally:
        kill_group(proc)
    summary = read_summary(run_dir)
    assert (summary["status"], summary["steps"]) == ("completed", steps), out
    assert summary["final_loss"] is not None and proc.returncode == 0, out
    assert json.loads(last.read_text())["step"] == steps
