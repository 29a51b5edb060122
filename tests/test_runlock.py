"""Node slots of a run directory (launcher.runlock) claimed at the same moment by the nodes of one job.

A requeued SLURM job's two node agents claim their slots together; node 0 once read node 1's lock file while
node 1 had emptied it to rewrite it, took it for another job's and refused the requeue ("in use by the
launcher on host ?, pid 0": the job FAILED). A real second process holds the flock here.
"""

import json
import subprocess
import sys
import time

import pytest

from launcher import runlock
from launcher.errors import ConfigError
from launcher.plan import LaunchPlan

pytestmark = pytest.mark.timeout(60)

HOLDER = """
import fcntl, os, sys, time
path, record, delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)  # what an older launcher did before writing: the window a reader must wait out
open(path + ".held", "w").close()
time.sleep(delay)
os.pwrite(fd, record.encode(), 0)
time.sleep(30)
"""


def plan(run_dir, node_rank):
    return LaunchPlan(run_id="r1", run_dir=str(run_dir), nodes=2, workers_per_node=1, world_size=2, device_type="cpu",
                      backend="gloo", rdzv_backend="static", rdzv_endpoint="node1:29500", rdzv_id="r1", rdzv_timeout_s=60,
                      start_method="fork", start_method_reason="", max_restarts=0, omp_threads=1, command=("x",),
                      mode="static", node_rank=node_rank)


def hold_slot_1(run_dir, job, delay):
    (run_dir / "locks").mkdir(parents=True, exist_ok=True)
    path = run_dir / "locks" / "node-1.lock"
    record = json.dumps({"host": "other", "pid": 4242, "job": job, "run_id": "r1"})
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), record, str(delay)])
    deadline = time.monotonic() + 20
    while not (run_dir / "locks" / "node-1.lock.held").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the holder did not take the lock"
        time.sleep(0.02)
    return proc


def test_node_0_waits_for_a_record_being_written_by_node_1_of_the_same_job(tmp_path):
    holder = hold_slot_1(tmp_path, runlock.job_key(plan(tmp_path, 0)), delay=0.8)
    try:
        lock = runlock.claim(plan(tmp_path, 0))  # before the fix: ConfigError "in use by ... host ?, pid 0"
        assert list(lock.fds) == [0]
        lock.release()
    finally:
        holder.kill()
        holder.wait()


def test_a_live_holder_of_another_job_is_still_refused_by_name(tmp_path):
    holder = hold_slot_1(tmp_path, "static otherhost:1 nodes=2", delay=0.3)
    try:
        with pytest.raises(ConfigError, match="in use by the launcher on host other, pid 4242"):
            runlock.claim(plan(tmp_path, 0))
    finally:
        holder.kill()
        holder.wait()


def test_a_record_is_rewritten_in_place_at_a_fixed_size(tmp_path):
    lock = runlock.claim(plan(tmp_path, 0))
    try:
        path = tmp_path / "locks" / "node-0.lock"
        assert path.stat().st_size == runlock.RECORD_BYTES
        assert json.loads(path.read_text())["job"] == runlock.job_key(plan(tmp_path, 0))
    finally:
        lock.release()
