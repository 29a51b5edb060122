"""Against the real SLURM dev cluster (tests/test_slurm.py's fixtures and helpers): a job SLURM takes back and
gives again. A preempted job (`scancel --signal=USR2`) checkpoints, is requeued and ends where an uninterrupted run
does, saying "preempted" (never "failed") while it waits; one past its requeues says it was not requeued; a time
limit's warning requeues the job, which completes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.board_helpers import Board, board, get_json
from tests.helpers import QUICK, QUIET, Stamped, kill_group, log_line_times, read_summary, run_launcher
from tests import test_slurm
from tests.test_slurm import FINAL, SUBMIT, TRAIN, job_state, log_has, nothing_left_running, restarts, submitted, wait_for

# its fixtures: the cluster, jobs cancelled after, and the one local reference run (session-wide, shared)
runs, slurm_env, local_reference = test_slurm.runs, test_slurm.slurm_env, test_slurm.local_reference

pytestmark = [pytest.mark.slurm]


# 2 nodes x 2 workers: 4 ranks, where the order of the ranks' additions matters; the requeued job must
# still end bitwise where the uninterrupted local run does (tests/test_exact_resume.py has the local cases):
# the same TRAIN as local_reference, so that one local run serves both tests.
PREEMPT = ["--cluster", "slurm", "--nodes", "2", "--gpus", "2", "slurm.time_min=5"]
# rank 0 sleeps 1 s a step from step 50 of the first attempt (no CPU, no change to any number), so that
# attempt is still running when the test preempts it whatever the machine's load (150 slow steps left), and the
# requeued one runs the rest at full speed (with 2400 fast steps instead, the test took 276 s at the suite's load)
SLOW_FIRST_ATTEMPT = {"LAUNCHER_INJECT_FAULT": "rank=0,step=50,action=slow"}


# TRAIN with W&B's offline run: its summary is read while the job waits for its requeue (nothing else differs)
TRAIN_WANDB = [*QUICK, *TRAIN[len(QUIET):]]


def watch_the_requeue(run_dir: Path, runs: Path, signalled: float, env: Dict[str, str], on_board: Board) -> Dict[str, List]:
    """What the run says from the signal until its requeued attempt trains: summary.json (every 0.5 s, once rewritten
    since the signal), `status`, `ls --json` and the board's API (every 2 s)."""
    seen: Dict[str, List] = {"summary": [], "status": [], "ls": [], "board": []}
    deadline, asked = time.monotonic() + 180, 0.0
    while not ((run_dir / "logs" / "slurm-attempt-0").is_dir() and log_has(run_dir / "logs" / "rank-0.log", "step 100/")):
        assert time.monotonic() < deadline, f"timed out waiting for the requeued attempt to train: {seen}"
        path = run_dir / "summary.json"
        if path.is_file() and path.stat().st_mtime >= signalled:
            seen["summary"].append(json.loads(path.read_text()))
        if time.monotonic() - asked >= 2:
            asked = time.monotonic()
            seen["status"].append(run_launcher(["status", str(run_dir)], cwd=runs, timeout=60, env=env).stdout)
            seen["ls"].append(json.loads(run_launcher(["ls", "--json", str(runs)], cwd=runs, timeout=60, env=env).stdout)[0])
            seen["board"].append(get_json(on_board.url(f"/api/run?path={run_dir.name}")))
        time.sleep(0.5)
    return seen


def streamed_late(printed: List, logs: List[Path]) -> List[float]:
    """For each line --wait printed that one of these rank logs holds: how long after the launcher got it."""
    arrived: Dict[str, float] = {}
    for log in logs:
        arrived.update({k: v for k, v in log_line_times(log).items() if k not in arrived})
    return [at - arrived[line] for at, stream, line in printed if stream == "out" and line in arrived]


@pytest.mark.timeout(420)
def test_preemption_checkpoints_requeues_and_resumes_to_the_same_parameters(runs, slurm_env, local_reference):
    """USR2 (`scancel --signal=USR2`): the workers checkpoint, the job is requeued and ends where an uninterrupted
    run does. From the signal until the requeued attempt trains, summary.json, `status`, `ls` and the W&B run say
    preempted (when, and requeued), never failed, and --wait waits on through the requeue, printing rank 0's lines
    as they come (within 2 s of reaching the launcher: the rank log's own times)."""
    reference = local_reference
    waiting = Stamped([sys.executable, "-m", "launcher", *PREEMPT, "--wait", "--output-dir", str(runs), *TRAIN_WANDB],
                      runs, env={**slurm_env, **SLOW_FIRST_ATTEMPT})
    try:
        wait_for(lambda: any(p.name for p in runs.glob("*/job.json")) or waiting.proc.poll() is not None, 60, "job.json")
        run_dir = submitted(runs)
        job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
        with board(runs) as on_board:
            wait_for(lambda: log_has(run_dir / "logs" / "rank-0.log", "step 50/"), 180, "training to reach step 50")
            signalled = time.time()
            subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
            seen = watch_the_requeue(run_dir, runs, signalled, slurm_env, on_board)
        assert waiting.proc.poll() is None, waiting.text("err")  # --wait still waits
        assert waiting.finish(180) == 0, waiting.text("err")
    finally:
        kill_group(waiting.proc)
    summary = read_summary(run_dir)
    assert job_state(job_id) == "COMPLETED", summary
    assert summary["status"] == "completed" and summary["steps"] == 200 and summary["world_size"] == 4
    assert summary["slurm_requeues"] == 1 and summary["restarts"] >= 1
    assert 50 <= summary["resumed_from_step"] < 200  # from the checkpoint USR2 made, not from scratch
    # the first attempt's rank logs are kept: USR2 reached the trainer, which checkpointed
    first = run_dir / "logs" / "slurm-attempt-0" / "rank-0.log"
    assert "got SIGUSR2: checkpointing at the next step boundary" in first.read_text()
    assert summary["param_checksums"] == reference["param_checksums"] and summary["final_loss"] == reference["final_loss"]
    # while it waited: preempted, with the time, and requeued; never failed
    said = seen["summary"]
    assert said and all(s["status"] == "preempted" and s["stopped_by"] == "SIGUSR2" for s in said), said
    assert signalled - 1 <= said[-1]["preempted_at"] <= time.time() and said[-1]["requeued"] is True
    assert not any("failed" in out.lower() for out in seen["status"]), seen["status"]
    assert any(f"SLURM job {job_id} PENDING: preempted at " in out or f"SLURM job {job_id} REQUEUED: preempted at " in out
               for out in seen["status"]), seen["status"]
    assert {row["status"] for row in seen["ls"]} <= {"preempted", "running"}, seen["ls"]
    preempted = [row for row in seen["ls"] if row["status"] == "preempted"]
    # requeued is None (its scheduler decides) until SLURM has requeued it, then True; never False
    assert preempted and all(row["requeued"] in (None, True) and row["note"].startswith("preempted at ") for row in preempted)
    assert any(row["requeued"] is True and "requeued: it resumes" in row["note"] for row in preempted), preempted
    assert preempted[0]["command"] == f"python -m launcher status {run_dir}"
    assert {view["status"] for view in seen["board"]} <= {"preempted", "running"}, seen["board"]
    shown = [view for view in seen["board"] if view["status"] == "preempted"]
    assert shown and shown[0]["note"].startswith("preempted at ") and shown[0]["preempted_at"] == said[-1]["preempted_at"]
    err = waiting.text("err")
    assert f"SLURM job {job_id}: REQUEUED: preempted at " in err or f"SLURM job {job_id}: PENDING: preempted at " in err, err
    assert "failed" not in err.lower() and f"SLURM job {job_id} COMPLETED: 200 steps" in err, err
    # the W&B run said so too: the first attempt's offline run ends preempted, the requeued one's completed
    attempts = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2, attempts
    history = [next(a.glob("*.wandb")).read_bytes() for a in attempts]
    assert b'"preempted"' in history[0] and b"preempted_at" in history[0] and b'"completed"' in history[1]
    # --wait printed rank 0's lines as they came, both attempts'
    late = streamed_late(waiting.lines, [first, run_dir / "logs" / "rank-0.log"])
    assert len(late) >= 6 and max(late) < 2.0, late
    nothing_left_running(job_id)  # neither attempt left an agent, a zygote or a worker behind


@pytest.mark.timeout(240)
def test_a_preempted_job_past_its_requeues_says_it_was_not_requeued(runs, slurm_env):
    """slurm.max_requeues=0: a USR2 stops the workers after a checkpoint and the job ends there (submitit's own count
    is of time limits only): summary.json, `status` (exit 140: the signal's, as a stopped run's) and `ls` say it was
    preempted and not requeued, why, and how to continue."""
    result = run_launcher(SUBMIT + ["slurm.max_requeues=0", "--output-dir", str(runs)] + QUIET + ["trainer.steps=1000000"],
                          cwd=runs, timeout=60, env={**slurm_env, "LAUNCHER_INJECT_FAULT": "rank=0,step=10,action=slow"})
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = submitted(runs)
    job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
    wait_for(lambda: log_has(run_dir / "logs" / "rank-0.log", "step 10/"), 120, "training to start")
    subprocess.run(["scancel", "--signal=USR2", job_id], check=True, timeout=30)
    wait_for(lambda: job_state(job_id) in FINAL, 120, "the job to end")
    summary = read_summary(run_dir)
    assert (summary["status"], summary["requeued"], summary["stopped_by"]) == ("preempted", False, "SIGUSR2"), summary
    assert "not requeued: slurm.max_requeues=0 reached" in summary["error"], summary["error"]
    assert f"python -m launcher resume {run_dir}" in summary["error"] and restarts(job_id) == 0
    status = run_launcher(["status", str(run_dir)], cwd=runs, timeout=60, env=slurm_env)
    assert status.returncode == 128 + 12 and "not requeued: slurm.max_requeues=0 reached" in status.stdout, status.stdout
    (row,) = json.loads(run_launcher(["ls", "--json", str(runs)], cwd=runs, timeout=60, env=slurm_env).stdout)
    assert (row["status"], row["requeued"], row["command"]) == ("preempted", False, f"python -m launcher resume {run_dir}")
    assert "not requeued" in row["note"] and "failed" not in row["note"]
    with board(runs) as on_board:
        view = get_json(on_board.url(f"/api/run?path={run_dir.name}"))
    assert (view["status"], view["requeued"]) == ("preempted", False) and "not requeued" in view["error"], view
    nothing_left_running(job_id)


@pytest.mark.timeout(600)
def test_a_time_limit_requeues_and_the_job_completes(runs, slurm_env):
    """time_min=2 with the warning 70 s before the end: USR2 50-80 s into the job (SLURM checks
    limits about every 30 s). Not sooner: a task still starting Python has no handler yet, and USR2
    ends it (in the suite at load 12 the job died with signal 12 at 20-50 s: FAILED, never requeued).
    The first attempt must still be running then whatever the load, and the requeued one must end in
    bounded time whatever the load (12000 steps at the suite's load took more than 420 s): rank 0 is
    slow from step 50 of the first attempt only (a 1 s sleep a step, no CPU), so that attempt cannot
    finish its 200 steps before the warning (150 slow steps: 150 s at least), and the requeued attempt runs the rest at full speed. Once it
    has requeued, the test lifts the limit, so the rest runs to the end instead of being warned again.
    The warning's clock starts when the job runs: under the suite's load the job once waited for nodes
    long enough that a wait counted from the submission ran out before the warning was due."""
    env = {**slurm_env, "LAUNCHER_INJECT_FAULT": "rank=0,step=50,action=slow"}
    result = run_launcher(["--cluster", "slurm", "--nodes", "2", "--gpus", "2", "--output-dir", str(runs),
                           "slurm.time_min=2", "slurm.signal_delay_s=70", "slurm.max_requeues=8"] + TRAIN,
                          cwd=runs, timeout=60, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = submitted(runs)
    job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
    wait_for(lambda: job_state(job_id) not in ("PENDING", "UNKNOWN"), 180, "the job to start")

    def requeued() -> bool:
        state = job_state(job_id)
        assert state not in ("COMPLETED", "FAILED", "TIMEOUT"), f"the job ended {state} without a requeue"
        return restarts(job_id) >= 1

    wait_for(requeued, 150, "the time limit's warning to requeue the job")
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=10"], check=True, timeout=30)
    wait_for(lambda: job_state(job_id) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 240, "the job to finish")
    summary = read_summary(run_dir)
    assert job_state(job_id) == "COMPLETED", summary
    assert summary["steps"] == 200 and summary["slurm_requeues"] >= 1
    assert 1 <= summary["resumed_from_step"] < 200  # from the checkpoint the warning made, not from scratch
    first = (run_dir / "logs" / "slurm-attempt-0" / "rank-0.log").read_text()
    assert "got SIGUSR2: checkpointing at the next step boundary" in first
