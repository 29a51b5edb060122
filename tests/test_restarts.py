"""Restarts and resumes of real 2-worker jobs end with the same weights as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.helpers import QUICK, QUIET, kill_group, launcher_env, only_run_dir, read_metrics, read_summary, run_launcher

pytestmark = pytest.mark.timeout(180)

STEPS = 40
# 1024 samples / 2 ranks / batch 16 = 32 batches per epoch: checkpoints fall mid-epoch and at epoch ends
JOB = ["--gpus", "2", f"trainer.steps={STEPS}", "checkpoint.every_steps=8", "trainer.log_every=4", *QUICK]
# The same job without W&B's offline run (~3 CPU-s a launch; the same weights either way): nothing here checks W&B
# (tests/test_metrics_runs.py does), so only the reference, the run that trains into its checkpoints and the
# raising-rank job's first launch (a W&B run across an in-job restart) keep it
QUIET_JOB = [*JOB[:-len(QUICK)], *QUIET]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference: the same job, never interrupted."""
    out = tmp_path_factory.mktemp("reference")
    result = run_launcher([*JOB, f"output_dir={out}", "run_id=reference"], cwd=out)
    assert result.returncode == 0, result.stderr
    return out, read_summary(out / "reference")


def assert_same_training(summary, uninterrupted):
    reference = uninterrupted[1]
    assert summary["status"] == "completed" and summary["steps"] == STEPS
    assert summary["param_checksum"] == reference["param_checksum"]
    assert len(set(summary["param_checksums"])) == 1


@pytest.fixture(scope="module")
def restarted_then_resumed(tmp_path_factory):
    """One 20-step job whose rank 1 raises at step 13 and is restarted from step 8 (W&B's default offline run across
    the in-job restart), then `resume`d in place to STEPS: the raising-rank test reads the first launch (its outcome
    is read before the resume), the resume test the second; two launches, not three (as tests/test_exact_resume.py).
    A drift at either shows in the final weights. The resume runs without W&B (W&B's resumed run is
    tests/test_metrics_runs.py's)."""
    tmp = tmp_path_factory.mktemp("restarted")
    first = run_launcher([*JOB, f"output_dir={tmp}", "trainer.steps=20", "--max-restarts", "1"], cwd=tmp,
                         env={"LAUNCHER_INJECT_FAULT": "rank=1,step=13"})
    assert first.returncode == 0, first.stderr
    run_dir = only_run_dir(tmp)
    restarted = {"result": first, "summary": read_summary(run_dir), "metrics": [m["step"] for m in read_metrics(run_dir)],
                 "log": (run_dir / "logs" / "rank-1.attempt-1.log").read_text()}
    resumed = run_launcher(["resume", str(run_dir), f"trainer.steps={STEPS}", "wandb.mode=disabled"], cwd=tmp)
    return restarted, resumed, tmp, run_dir


def test_a_raising_rank_is_restarted_and_resumes(restarted_then_resumed, uninterrupted):
    restarted, _, _, run_dir = restarted_then_resumed
    assert "attempt 0: rank 1 failed: exit code 1: InjectedFault: injected fault on rank 1 at step 13" in \
        restarted["result"].stderr
    summary = restarted["summary"]
    assert (summary["status"], summary["steps"]) == ("completed", 20), summary
    assert summary["restarts"] == 1 and summary["resumed_from_step"] == 8
    assert len(set(summary["param_checksums"])) == 1
    assert "resumed from" in restarted["log"]
    # the steps redone after the restart are logged once
    assert restarted["metrics"] == list(range(4, 21, 4))
    # and the job goes on (the resume test's second launch) to the uninterrupted run's weights
    assert_same_training(read_summary(run_dir), uninterrupted)


@pytest.mark.timeout(300)
def test_a_restart_across_nodes_meets_in_a_fresh_store(tmp_path, uninterrupted):
    """--nodes 2 (a static rendezvous, as on SLURM and Ray): the restarted workers once read the dead attempt's
    gloo addresses from the store they shared with it (2 of 3 restarts failed: connectFullMesh, connection
    refused). Three restarts in a row, each meeting after the attempt before it, in one job that ends as the
    uninterrupted run does (three launches of one restart each cost ~3x the CPU for the same three meetings)."""
    assert QUIET_JOB[:2] == ["--gpus", "2"]
    job = ["--nodes", "2", "--gpus", "1", *QUIET_JOB[2:]]
    result = run_launcher([*job, f"output_dir={tmp_path}", "--max-restarts", "3"], cwd=tmp_path, timeout=240,
                          env={"LAUNCHER_INJECT_FAULT": "rank=1,step=13;rank=1,step=21,attempt=1;rank=1,step=29,attempt=2"})
    assert result.returncode == 0, result.stderr[-3000:]
    for attempt, step in enumerate((13, 21, 29)):
        assert f"attempt {attempt}: rank 1 failed: exit code 1: InjectedFault: injected fault on rank 1 at step {step}" \
            in result.stderr, (attempt, result.stderr[-3000:])
    summary = read_summary(only_run_dir(tmp_path))
    assert summary["restarts"] == 3 and summary["resumed_from_step"] == 24, summary
    assert_same_training(summary, uninterrupted)
    for attempt in (1, 2, 3):  # each restarted attempt trained (and resumed) rather than failing to meet
        assert "resumed from" in (only_run_dir(tmp_path) / "logs" / f"rank-0.attempt-{attempt}.log").read_text()


def test_each_restart_resumes_and_the_last_failure_is_reported(tmp_path, uninterrupted):
    faults = "rank=1,step=5;rank=0,step=19,attempt=1;rank=0,step=30,attempt=2"
    ok = run_launcher([*QUIET_JOB, f"output_dir={tmp_path / 'ok'}", "--max-restarts", "3"], cwd=tmp_path,
                      env={"LAUNCHER_INJECT_FAULT": faults})
    assert ok.returncode == 0, ok.stderr
    assert "attempt 1: rank 0 failed" in ok.stderr and "attempt 2: rank 0 failed" in ok.stderr
    summary = read_summary(only_run_dir(tmp_path / "ok"))
    assert summary["restarts"] == 3 and summary["resumed_from_step"] == 24
    assert_same_training(summary, uninterrupted)

    out = tmp_path / "out-of-restarts"
    failed = run_launcher([*QUIET_JOB, f"output_dir={out}", "--max-restarts", "1"], cwd=tmp_path,
                          env={"LAUNCHER_INJECT_FAULT": faults})
    assert failed.returncode == 1
    run_dir = only_run_dir(out)
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("error: rank 0 failed: exit code 1: InjectedFault: injected fault on rank 0 at step 19 (attempt 1)")
    assert last.endswith(f"see {run_dir / 'logs' / 'rank-0.attempt-1.log'}")
    summary = read_summary(run_dir)
    assert (summary["status"], summary["restarts"]) == ("failed", 1)


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory):
    """One job killed from outside twice: rank 1 hangs at step 21 and is SIGKILLed; the restarted attempt's rank 1
    hangs at step 29 and the zygote the workers fork from is SIGKILLed. The two kills' tests read its outcome (one
    launch for both: each kill is a restart of its own, from the checkpoint before it)."""
    tmp = tmp_path_factory.mktemp("killed")
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", *QUIET_JOB, f"output_dir={tmp}", "--max-restarts", "2"], cwd=tmp,
        env=launcher_env({"LAUNCHER_INJECT_FAULT": "rank=1,step=21,action=hang;rank=1,step=29,attempt=1,action=hang"}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        os.kill(wait_for_hang(tmp), signal.SIGKILL)  # a real kill of a real worker, from outside
        zygote = psutil.Process(wait_for_hang(tmp, log="rank-1.attempt-1.log")).parent()
        zygote_ppid = zygote.ppid()
        zygote.kill()  # a real kill of the real zygote, from outside
        _, err = proc.communicate(timeout=150)
    finally:
        kill_group(proc)
    return {"returncode": proc.returncode, "err": err, "zygote": zygote.pid, "zygote_ppid": zygote_ppid,
            "launcher": proc.pid, "run_dir": only_run_dir(tmp)}


def test_a_sigkilled_rank_is_restarted_and_resumes(killed_twice, uninterrupted):
    assert killed_twice["returncode"] == 0, killed_twice["err"]
    assert "attempt 0: rank 1 failed: killed by SIGKILL" in killed_twice["err"]
    logs = killed_twice["run_dir"] / "logs"
    assert "/step-00000016 at step 16 " in (logs / "rank-1.attempt-1.log").read_text()  # where the kill left it
    summary = read_summary(killed_twice["run_dir"])
    assert summary["restarts"] == 2 and summary["resumed_from_step"] == 24
    assert_same_training(summary, uninterrupted)


def test_a_killed_zygote_is_replaced_and_the_job_resumes(killed_twice, uninterrupted):
    """The zygote that forks the workers, SIGKILLed mid-run: its workers die with it, and the restart forks from a
    new zygote (it once wrote to the dead one's socket: a BrokenPipeError traceback and no summary)."""
    assert killed_twice["zygote_ppid"] == killed_twice["launcher"], "a worker's parent is the launcher's zygote, the launcher's child"
    assert killed_twice["returncode"] == 0, killed_twice["err"]
    err, logs = killed_twice["err"], killed_twice["run_dir"] / "logs"
    assert f"the worker zygote (pid {killed_twice['zygote']}) is gone" in err
    # no traceback of the launcher's own, nor of a rank from the zygote's kill on (attempt 0's rank 0 has one: its
    # peer was the SIGKILLed rank)
    assert not [line for line in err.splitlines() if "Traceback" in line and not line.startswith("[rank")], err
    for attempt in (1, 2):
        for rank in (0, 1):
            assert "Traceback" not in (logs / f"rank-{rank}.attempt-{attempt}.log").read_text(), (attempt, rank)
    assert "/step-00000024 at step 24 " in (logs / "rank-1.attempt-2.log").read_text()  # forked by the new zygote
    summary = read_summary(killed_twice["run_dir"])
    assert summary["restarts"] == 2 and summary["resumed_from_step"] == 24
    assert_same_training(summary, uninterrupted)


def wait_for_hang(output_dir, timeout=90, log="rank-1.log"):
    """The pid of the rank that printed 'injected hang' (it stops there, so the kill lands mid-training)."""
    return wait_for_line(output_dir, "injected hang", timeout, log)


def test_resume_command_continues_a_finished_run_in_place(restarted_then_resumed, uninterrupted):
    _, result, tmp, run_dir = restarted_then_resumed
    assert result.returncode == 0, result.stderr
    assert "resuming run" in result.stderr and "from step-00000020 (step 20)" in result.stderr
    assert only_run_dir(tmp) == run_dir  # same directory, no new run
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 20
    assert_same_training(summary, uninterrupted)
    assert f"steps: {STEPS}" in (run_dir / "config.yaml").read_text()  # the recorded config follows
    assert [m["step"] for m in read_metrics(run_dir)] == list(range(4, STEPS + 1, 4))


def test_running_a_finished_job_again_repeats_nothing(tmp_path, uninterrupted):
    """An elastic agent (or a SLURM requeue) may start a finished job again as a new attempt: it must resume, not retrain.

    A new launch may not reuse the finished run's directory (tests/test_run_ownership.py), so this
    attempt is a new run that trains into the finished run's checkpoints, as such an attempt would.
    """
    out, reference = uninterrupted
    ckpts = out / "reference" / "checkpoints"
    result = run_launcher([*JOB, f"output_dir={out}", "run_id=again", f"checkpoint.dir={ckpts}"], cwd=out)
    assert result.returncode == 0, result.stderr
    summary = read_summary(out / "again")
    assert summary["resumed_from_step"] == STEPS and summary["final_loss"] == reference["final_loss"]
    assert_same_training(summary, uninterrupted)
    manifest = json.loads((out / "reference" / "checkpoints" / f"step-{STEPS:08d}" / "manifest.json").read_text())
    assert manifest["step"] == STEPS and manifest["world_size"] == 2


def test_a_kill_during_a_background_write_resumes_from_the_checkpoint_before(tmp_path, uninterrupted):
    """Async saves: rank 1 is SIGKILLed while its write of step 16 is in flight; step 8 is what resumes."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", *QUIET_JOB, "checkpoint.async_save=true", f"output_dir={tmp_path}",
         "--max-restarts", "1"], cwd=tmp_path,
        env=launcher_env({"LAUNCHER_TEST_SAVE_DELAY_S": "60,step=16"}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        pid = wait_for_line(tmp_path, "save of step 16 delayed")
        os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, err
    assert "attempt 0: rank 1 failed: killed by SIGKILL" in err
    run_dir = only_run_dir(tmp_path)
    assert "resumed from" in (run_dir / "logs" / "rank-0.attempt-1.log").read_text()
    summary = read_summary(run_dir)
    assert summary["restarts"] == 1 and summary["resumed_from_step"] == 8 and summary["checkpoint_async"] is True
    assert_same_training(summary, uninterrupted)


def wait_for_line(output_dir, start, timeout=90, log="rank-1.log"):
    """The pid at the end of the first line of a rank's log (rank 1's first attempt's) that starts with `start`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in output_dir.glob(f"*/logs/{log}"):
            for line in path.read_text().splitlines():
                if line.startswith(start):
                    return int(line.rsplit("pid ", 1)[1])
        time.sleep(0.2)
    raise AssertionError(f"{log} never had a line {start!r}")
