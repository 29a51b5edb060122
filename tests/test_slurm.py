"""Against a real SLURM cluster (cluster/devcluster: 2 fake nodes on this machine).

tests/run.sh brings it up and exports SLURM_CONF; without it these tests skip. Every wait is
bounded and every job a test submitted is cancelled in teardown. Preemption, requeues and time limits:
tests/test_slurm_requeue.py, with these fixtures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.helpers import NO_WANDB, QUIET, read_summary, run_launcher, slurm_unavailable

pytestmark = [pytest.mark.slurm]
# CPU, so results are exact. 200 steps: enough for the parameters to tell a wrong split of the data (1200 before,
# 4 ranks each in SLURM and here: ~25 CPU-s of the suite, most in SLURM's own processes). The preemption and
# time-limit tests run the same 200 steps (their first attempt slowed from step 50), so the preemption test ends
# where the one local reference run does. No W&B run anywhere here (nothing of W&B is checked; the backend
# contract, tests/test_backend_contract.py, runs SLURM jobs with the default offline run).
TRAIN = QUIET + ["trainer.steps=200", "trainer.log_every=50", "checkpoint.every_steps=100000", "seed=3"]
SUBMIT = ["--cluster", "slurm", "--nodes", "2", "--gpus", "2", "slurm.time_min=5"]
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


@pytest.fixture(scope="session")  # one dev cluster; tests/test_slurm_requeue.py and others take it from here
def slurm_env() -> Dict[str, str]:
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    return {"SLURM_CONF": os.environ["SLURM_CONF"]}  # helpers.launcher_env drops SLURM_* otherwise


@pytest.fixture
def runs(tmp_path: Path):
    """The output dir of a test; every job submitted into it is cancelled afterwards."""
    yield tmp_path
    for job_file in tmp_path.glob("*/job.json"):
        subprocess.run(["scancel", str(json.loads(job_file.read_text())["job_id"])], capture_output=True, timeout=30)


def run_locally(out: Path, workers: int, train: List[str]) -> Dict:
    """The same job run here on one node: the parameters a SLURM run must end with."""
    result = run_launcher(["--gpus", str(workers), "--output-dir", str(out)] + train, cwd=out, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    return read_summary(next(p for p in out.iterdir() if p.is_dir()))


@pytest.fixture(scope="session")  # one local run for this file and tests/test_slurm_requeue.py
def local_reference(tmp_path_factory, slurm_env) -> Dict:
    return run_locally(tmp_path_factory.mktemp("local4"), 4, TRAIN)


def submitted(runs: Path) -> Path:
    run_dirs = [p for p in runs.iterdir() if (p / "job.json").is_file()]
    assert len(run_dirs) == 1, run_dirs
    return run_dirs[0]


def job_state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"], capture_output=True, text=True, timeout=30).stdout
    lines = [line.split()[0] for line in out.splitlines() if line.strip()]
    return lines[-1] if lines else "UNKNOWN"


def restarts(job_id: str) -> int:
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"Restarts=(\d+)", out)
    return int(found.group(1)) if found else 0


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.5)


def node_ranks(run_dir: Path) -> List[List[int]]:
    """The global ranks each node ran, by node rank (each node records itself under nodes/)."""
    nodes = [json.loads(p.read_text()) for p in run_dir.glob("nodes/node-*.json")]
    return [n["ranks"] for n in sorted(nodes, key=lambda n: n["node_rank"])]


def log_has(path: Path, text: str) -> bool:
    return path.is_file() and text in path.read_text(errors="replace")


def job_processes(job_id: str) -> Dict[int, str]:
    """pid -> command line of every process on this machine started for the job (its SLURM_JOB_ID in the
    environment it started with: submitit's task, the node agent, its zygote, the workers; the dev cluster's
    nodes are this machine)."""
    found, marker = {}, f"SLURM_JOB_ID={job_id}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in environ.split(b"\0") and "slurmstepd" not in cmdline:
            found[int(entry)] = cmdline
    return found


def loads_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text(errors="replace")


def nothing_left_running(job_id: str) -> None:
    wait_for(lambda: not job_processes(job_id), 30, f"job {job_id}'s processes to end: {job_processes(job_id)}")


@pytest.mark.timeout(240)
def test_two_nodes_through_slurm_match_a_local_run(runs, slurm_env, local_reference):
    result = run_launcher(SUBMIT + ["--wait", "--output-dir", str(runs)] + TRAIN, cwd=runs, timeout=200, env=slurm_env)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = submitted(runs)
    job = json.loads((run_dir / "job.json").read_text())
    assert job["cluster"] == "slurm" and job["submitted_at"] and f"submitted SLURM job {job['job_id']}" in result.stdout
    assert f"python -m launcher status {run_dir}" in result.stdout
    assert "step 200/200" in result.stdout  # --wait streamed rank 0's log
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["world_size"] == 4 and summary["nodes"] == 2
    assert node_ranks(run_dir) == [[0, 1], [2, 3]]
    assert summary["param_checksum"] == local_reference["param_checksum"]
    assert job_state(job["job_id"]) == "COMPLETED"
    status = run_launcher(["status", job["job_id"], "--output-dir", str(runs)], cwd=runs, timeout=60, env=slurm_env)
    assert status.returncode == 0 and "COMPLETED" in status.stdout
    logs = run_launcher(["logs", str(run_dir), "--rank", "3"], cwd=runs, timeout=60, env=slurm_env)
    assert logs.returncode == 0 and "rank 3/4 (node 1" in logs.stdout


SCRIPT = """
import os, json, torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
t = torch.ones(1) * dist.get_rank()
dist.all_reduce(t)
out = os.path.join(os.environ["LAUNCHER_RUN_DIR"], f"seen-{dist.get_rank()}.json")
json.dump({"rank": dist.get_rank(), "world": dist.get_world_size(), "local": os.environ["LOCAL_RANK"], "sum": t.item()}, open(out, "w"))
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_a_user_script_runs_under_slurm(runs, slurm_env):
    script = runs / "user_train.py"
    script.write_text(SCRIPT)
    result = run_launcher(SUBMIT + ["--wait", "--output-dir", str(runs), *NO_WANDB, str(script)], cwd=runs, timeout=150, env=slurm_env)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = [json.loads(p.read_text()) for p in sorted(submitted(runs).glob("seen-*.json"))]
    assert [s["rank"] for s in seen] == [0, 1, 2, 3]
    assert {s["world"] for s in seen} == {4} and {s["sum"] for s in seen} == {6.0}
    assert [s["local"] for s in seen] == ["0", "1", "0", "1"]
    summary = read_summary(submitted(runs))
    assert summary["steps"] == 3 and len(summary["step_time_s_per_rank"]) == 4  # its optimizer steps, every rank's


@pytest.mark.timeout(180)
def test_a_failing_rank_fails_the_job_and_names_the_rank(runs, slurm_env):
    env = {**slurm_env, "LAUNCHER_INJECT_FAULT": "rank=3,step=5"}
    result = run_launcher(SUBMIT + ["--wait", "--output-dir", str(runs)] + QUIET + ["trainer.steps=50"],
                          cwd=runs, timeout=150, env=env)
    assert result.returncode == 1
    assert "FAILED: rank 3 failed" in result.stderr and "InjectedFault" in result.stderr
    run_dir = submitted(runs)
    status = run_launcher(["status", str(run_dir)], cwd=runs, timeout=60, env=slurm_env)
    assert status.returncode == 1 and "FAILED: rank 3 failed" in status.stdout
    logs = run_launcher(["logs", str(run_dir), "--rank", "3"], cwd=runs, timeout=60, env=slurm_env)
    assert "InjectedFault" in logs.stdout
    task_log = next((run_dir / "slurm").glob("*_1_log.out")).read_text()  # SLURM's output of node 1's task
    assert f"node 1 ended with exit code 1; see {run_dir}/logs" in task_log


@pytest.mark.timeout(180)
def test_cancel_stops_a_running_job(runs, slurm_env):
    # from step 10 on rank 0 sleeps a second a step (the fault injector's slow rank): the job waits for the cancel
    # without 4 ranks training at full speed meanwhile
    result = run_launcher(SUBMIT + ["--output-dir", str(runs)] + QUIET + ["trainer.steps=1000000"], cwd=runs, timeout=60,
                          env={**slurm_env, "LAUNCHER_INJECT_FAULT": "rank=0,step=10,action=slow"})
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = submitted(runs)
    job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
    wait_for(lambda: log_has(run_dir / "logs" / "rank-0.log", "step 10/"), 90, "training to start")
    status = run_launcher(["status", str(run_dir)], cwd=runs, timeout=60, env=slurm_env)
    assert status.returncode == 0 and "RUNNING" in status.stdout
    # each node's task: submitit's process (no torch of its own) running the node agent, which imports torch once
    # for itself and the zygote the workers fork from
    running = job_processes(job_id)
    tasks = [pid for pid, command in running.items() if command.split()[1:4] == ["-u", "-m", "submitit.core._submit"]]
    assert len(tasks) == 2 and not any(loads_torch(pid) for pid in tasks), running
    nodes = [pid for pid, command in running.items() if "launcher.backends.slurm.node" in command]
    assert len(nodes) == 2 * (1 + 1 + 2), running  # per node: its agent, the zygote, 2 workers
    cancel = run_launcher(["cancel", run_dir.name, "--output-dir", str(runs)], cwd=runs, timeout=60, env=slurm_env)
    assert cancel.returncode == 0 and f"cancelled SLURM job {job_id}" in cancel.stdout
    wait_for(lambda: job_state(job_id) == "CANCELLED", 60, "the job to be cancelled")
    status = run_launcher(["status", str(run_dir)], cwd=runs, timeout=60, env=slurm_env)
    assert status.returncode == 130 and "CANCELLED" in status.stdout
    nothing_left_running(job_id)


@pytest.mark.timeout(180)
def test_inside_an_allocation_srun_runs_one_node_per_task_without_submitting(runs, slurm_env):
    """An sbatch script that calls `srun python -m launcher`: SLURM's environment decides the nodes."""
    import shlex

    from tests.helpers import launcher_env

    command = [sys.executable, "-m", "launcher", "--gpus", "2", "--output-dir", str(runs)] + QUIET + ["trainer.steps=20"]
    script = f"srun --ntasks-per-node=1 {' '.join(shlex.quote(c) for c in command)}"
    done = subprocess.run(["sbatch", "--parsable", "-N", "2", "-o", str(runs / "batch-%j.out"), "--wrap", script],
                          cwd=runs, env=launcher_env(slurm_env), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip().split(";")[0]
    (runs / "submitted").write_text(job_id)
    try:
        wait_for(lambda: job_state(job_id) in ("COMPLETED", "FAILED", "CANCELLED"), 150, "the batch job to end")
        output = (runs / f"batch-{job_id}.out").read_text()
        assert job_state(job_id) == "COMPLETED", output[-3000:]
        summary = read_summary(runs / f"slurm-{job_id}")  # the run id every node derived from the job id
        assert summary["world_size"] == 4 and summary["nodes"] == 2 and summary["steps"] == 20
        assert node_ranks(runs / f"slurm-{job_id}") == [[0, 1], [2, 3]]
        assert "submitted SLURM job" not in output  # it ran in the allocation, it did not submit another job
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)


def test_node_list_parsing_agrees_with_scontrol(slurm_env):
    from launcher.backends.slurm.environment import hostnames_via_scontrol, parse_nodelist

    for text in ("node[1-2]", "node1,node2", "gpu[01-03,7],cpu5", "n[8-10]"):
        assert parse_nodelist(text) == hostnames_via_scontrol(text), text
