"""`ls`, `logs` and the environment record for a run on a real SLURM cluster (cluster/devcluster).

Skips without one, like tests/test_slurm.py (whose fixtures it uses: SLURM_CONF, jobs cancelled after).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.helpers import QUIET, kill_group, launcher_env, run_launcher
from tests import test_slurm

runs, slurm_env = test_slurm.runs, test_slurm.slurm_env  # its fixtures: the cluster, and jobs cancelled after

pytestmark = [pytest.mark.slurm]


@pytest.mark.timeout(400)
def test_a_slurm_job_is_listed_followed_by_job_id_and_records_its_environment(runs, slurm_env):
    submit = run_launcher(["--cluster", "slurm", "--nodes", "2", "--gpus", "1", "slurm.time_min=5", f"output_dir={runs}",
                           "run_id=sj", *QUIET, "trainer.steps=100", "trainer.log_every=50"], cwd=runs, timeout=120,
                          env=slurm_env)
    assert submit.returncode == 0, submit.stderr
    job_id = json.loads((runs / "sj" / "job.json").read_text())["job_id"]
    listed = json.loads(run_launcher(["ls", str(runs), "--json"], cwd=runs, timeout=60, env=slurm_env).stdout)
    assert [(r["run_id"], r["kind"], r["slurm_job_id"]) for r in listed] == [("sj", "slurm", job_id)]
    assert listed[0]["status"] in ("unknown", "running", "completed")  # queued: only sacct knows; ls does not ask
    follower = subprocess.Popen([sys.executable, "-m", "launcher", "logs", str(job_id), "--output-dir", str(runs),
                                 "--all", "-f"], cwd=runs, env=launcher_env(slurm_env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        followed, err = follower.communicate(timeout=300)  # ends by itself when the job has ended
    finally:
        kill_group(follower)
    assert follower.returncode == 0, err
    assert "[rank0]: step 100/100" in followed and "[rank1]: rank 1/2" in followed
    deadline = time.monotonic() + 60
    while True:  # sacct may say COMPLETED a moment before the node launchers let go of their locks
        row = json.loads(run_launcher(["ls", str(runs), "--json"], cwd=runs, timeout=60, env=slurm_env).stdout)[0]
        if row["status"] != "running" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert (row["status"], row["step"], row["steps"]) == ("completed", 100, 100)
    record = json.loads(next((runs / "sj" / "env").glob("*.json")).read_text())
    assert record["env"]["SLURM_JOB_ID"] == str(job_id) and record["torch"]["version"]


@pytest.mark.timeout(300)
def test_ls_slurm_asks_sacct_about_a_job_cancelled_before_it_wrote_anything(runs, slurm_env):
    submit = run_launcher(["--cluster", "slurm", "--nodes", "1", "--gpus", "1", "slurm.time_min=5", f"output_dir={runs}",
                           "run_id=gone", "slurm.extra={begin: now+600}", *QUIET], cwd=runs, timeout=120, env=slurm_env)
    assert submit.returncode == 0, submit.stderr
    job_id = json.loads((runs / "gone" / "job.json").read_text())["job_id"]
    deadline = time.monotonic() + 60
    while True:  # sacct knows a job once slurmdbd has recorded it, a few seconds after submission
        row = json.loads(run_launcher(["ls", str(runs), "--json", "--slurm"], cwd=runs, timeout=60, env=slurm_env).stdout)[0]
        if row["slurm_state"] != "UNKNOWN" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert (row["status"], row["slurm_state"]) == ("unknown", "PENDING")  # held back by --begin: queued
    subprocess.run(["scancel", str(job_id)], check=True, timeout=30, env=launcher_env(slurm_env))
    deadline = time.monotonic() + 60
    while True:
        rows = json.loads(run_launcher(["ls", str(runs), "--json", "--slurm"], cwd=runs, timeout=60, env=slurm_env).stdout)
        if rows[0]["status"] != "unknown" or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert (rows[0]["status"], rows[0]["slurm_state"]) == ("interrupted", "CANCELLED")
    plain = json.loads(run_launcher(["ls", str(runs), "--json"], cwd=runs, timeout=60, env=slurm_env).stdout)[0]
    assert plain["status"] == "unknown" and "slurm_state" not in plain  # without --slurm, no scheduler call
