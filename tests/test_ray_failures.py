"""A Ray node that dies mid-run (its raylet killed by pid) on a real three-node Ray cluster on this machine.

Without restarts the job ends naming the lost node and its ranks; with --max-restarts 1 the driver
re-places both bundles on the nodes left and the trainer resumes from its newest checkpoint, ending
with the parameters of an uninterrupted run. Either way no placement group or actor is left behind.

The job trains KILL_AT steps at full speed, then rank 0 sleeps a second in every step (the fault injector's slow
rank, forwarded to the Ray nodes with the job's runtime_env): the node dies mid-run however loaded the machine is,
while the CPU goes into few steps (a 1500-step run cost ~57 CPU-s in the test's own processes alone). The restart
test runs first: the two nodes its kill leaves are all the other one needs, so no node is started again in between.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, List

import pytest

from tests.helpers import QUICK, read_summary, run_launcher, start_launcher
from tests.ray_cluster import kill_node, ray_cluster, ray_env

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.timeout(600)]
KILL_AT, STEPS = 20, 36  # the node is killed once rank 0 logged step KILL_AT: 16 slow steps (~16 s) are left
TRAIN = QUICK + [f"trainer.steps={STEPS}", "trainer.log_every=5", "checkpoint.every_steps=5", "seed=3",
                 "wandb.mode=disabled"]
SUBMIT = ["--cluster", "ray", "--nodes", "2", "--gpus", "1", "--wait"]
SLOW = {"LAUNCHER_INJECT_FAULT": f"rank=0,step={KILL_AT},action=slow"}  # a re-placed job's agents are slow again


@pytest.fixture(scope="module")
def ray3(tmp_path_factory):
    yield from ray_cluster(tmp_path_factory, 3)


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def kill_a_bundle_node(cluster, runs: Path, proc) -> Dict:
    """Once training passed step KILL_AT, kill the raylet of a node holding a bundle (not the driver's own node)."""
    def run_dir() -> List[Path]:
        return [p for p in runs.iterdir() if (p / "job.json").is_file()] if runs.is_dir() else []

    wait_for(lambda: bool(run_dir()), 120, "the run directory")
    rank0 = run_dir()[0] / "logs" / "rank-0.log"
    reached = f"step {KILL_AT}/"
    wait_for(lambda: proc.poll() is not None or (rank0.is_file() and reached in rank0.read_text(errors="replace")),
             240, f"training to reach step {KILL_AT}")
    assert proc.poll() is None, proc.stdout.read()[-3000:]
    job = json.loads((run_dir()[0] / "job.json").read_text())
    victim = next(p for p in reversed(job["placement"]) if p["ray_node_id"] != job["driver_ray_node_id"])
    kill_node(cluster, victim["ray_node_id"])
    return victim


def finish(proc, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return out


def test_with_max_restarts_a_killed_node_is_replaced_and_the_job_ends_as_an_uninterrupted_run_does(ray3, tmp_path):
    reference = run_launcher(["--gpus", "2", f"output_dir={tmp_path / 'local'}", *TRAIN], cwd=tmp_path, timeout=300)
    assert reference.returncode == 0, reference.stderr[-2000:]
    expected = read_summary(next((tmp_path / "local").iterdir()))["param_checksum"]
    ray3.grow_to(3)
    runs = tmp_path / "runs"
    proc = start_launcher([*SUBMIT, "--max-restarts", "1", f"output_dir={runs}", *TRAIN], tmp_path,
                          env={**ray_env(ray3), **SLOW})
    try:
        victim = kill_a_bundle_node(ray3, runs, proc)
    finally:
        console = finish(proc, 420)
    assert proc.returncode == 0, console[-3000:]
    run_dir = next(runs.iterdir())
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == STEPS, summary
    assert summary["ray_replacements"] == 1 and summary["restarts"] >= 1, summary
    assert f"(node {victim['node_rank']}, Ray node id {victim['ray_node_id'][:12]}" in summary["lost_nodes"][0]
    assert KILL_AT <= summary["resumed_from_step"] < STEPS, summary  # from a checkpoint, not from scratch
    assert victim["ray_node_id"] not in {p["ray_node_id"] for p in summary["ray_placement"]}  # re-placed elsewhere
    assert (run_dir / "logs" / "ray-attempt-0" / "rank-0.log").is_file()
    assert summary["param_checksum"] == expected, (summary["param_checksum"], expected)
    assert ray3.leftovers() == {"placement_groups": [], "actors": []}


def test_a_killed_ray_node_ends_the_job_naming_the_node_and_its_ranks(ray3, tmp_path):
    ray3.grow_to(2)  # after the test above, the two nodes it left: no node started again for this one
    runs = tmp_path / "runs"
    proc = start_launcher([*SUBMIT, f"output_dir={runs}", *TRAIN], tmp_path, env={**ray_env(ray3), **SLOW})
    try:
        victim = kill_a_bundle_node(ray3, runs, proc)
    finally:
        console = finish(proc, 240)
    assert proc.returncode == 1, console[-3000:]
    k = victim["node_rank"]
    named = f"(node {k}, Ray node id {victim['ray_node_id'][:12]}, ranks {k}) died"
    assert named in console, console[-3000:]
    summary = read_summary(next(runs.iterdir()))
    assert summary["status"] == "failed" and named in summary["error"], summary
    assert ray3.leftovers() == {"placement_groups": [], "actors": []}
