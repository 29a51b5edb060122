"""Multi-node for real: node agents as separate processes that meet over TCP, like machines would."""

import json
import os
import signal
import time

import psutil
import pytest

from tests.helpers import (QUIET, command_line, descendants, finish_all, free_port, kill_group, only_run_dir,
                           read_summary, start_launcher, wait_gone)

pytestmark = pytest.mark.timeout(150)
STEPS = ["trainer.steps=12", "trainer.log_every=4", *QUIET]
SLOW_RANKS = {"LAUNCHER_INJECT_FAULT": "rank=0,step=2,action=slow;rank=1,step=2,action=slow"}


def assert_one_job(summary, world, node_ranks):
    """What a user checks: it finished, every rank ran, and every replica ends with the same parameters."""
    assert summary["status"] == "completed", summary
    assert summary["world_size"] == world
    assert len(summary["param_checksums"]) == world and len(set(summary["param_checksums"])) == 1
    assert [n["ranks"] for n in summary["node_list"]] == node_ranks
    assert [n["node_rank"] for n in summary["node_list"]] == list(range(len(node_ranks)))


@pytest.fixture(scope="module")
def two_simulated_jobs(tmp_path_factory):
    """Two simulated jobs started at once (2 nodes x 2 workers, 2 nodes x 1): the two-node test reads the first,
    the no-collision test both; shared because a simulated launch costs ~20 CPU-s."""
    root = tmp_path_factory.mktemp("two-jobs")
    outs = [root / "a", root / "b"]
    procs = [start_launcher(["--nodes", "2", "--gpus", "2", f"output_dir={outs[0]}", *STEPS], root),
             start_launcher(["--nodes", "2", "--gpus", "1", f"output_dir={outs[1]}", "trainer.steps=4", *QUIET], root)]
    logs = finish_all(procs, timeout=120)
    return outs, [p.returncode for p in procs], logs


def test_simulated_two_nodes_on_one_box(two_simulated_jobs):
    (tmp_path, _), codes, (out, _) = two_simulated_jobs
    assert codes[0] == 0, out
    assert sum("simulating 2 nodes on this machine" in line for line in out.splitlines()) == 1
    run_dir = only_run_dir(tmp_path)
    assert_one_job(read_summary(run_dir), 4, [[0, 1], [2, 3]])
    for rank, node in ((0, 0), (1, 0), (2, 1), (3, 1)):  # WORLD_SIZE 4, GROUP_RANK 0 and 1
        assert f"rank {rank}/4 (node {node}," in (run_dir / "logs" / f"rank-{rank}.log").read_text()
    plan = json.loads((run_dir / "plan.json").read_text())
    assert (plan["mode"], plan["rdzv_backend"], plan["rdzv_id"]) == ("simulated", "static", run_dir.name)


def test_two_simulated_jobs_at_once_do_not_collide(two_simulated_jobs):
    outs, codes, logs = two_simulated_jobs
    assert codes == [0, 0], logs
    plans = [json.loads((only_run_dir(o) / "plan.json").read_text()) for o in outs]
    assert plans[0]["rdzv_endpoint"] != plans[1]["rdzv_endpoint"]
    assert plans[0]["rdzv_id"] != plans[1]["rdzv_id"]
    assert_one_job(read_summary(only_run_dir(outs[0])), 4, [[0, 1], [2, 3]])
    assert_one_job(read_summary(only_run_dir(outs[1])), 2, [[0], [1]])


def two_agents_on_loopback(tmp_path, rendezvous, gpus):
    """Two node agents (gpus[k] workers on node k) meeting on 127.0.0.1 at a rendezvous of that kind, like two
    machines would; the run directory they share and its summary."""
    port = free_port()
    if rendezvous == "static":
        flags = [["--node-rank", str(k), "--master-addr", "127.0.0.1", "--master-port", str(port)] for k in (0, 1)]
    else:
        flags = [["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "loop"]] * 2
    procs = [start_launcher(["--nodes", "2", "--gpus", str(g), "--rdzv-timeout", "60", f"output_dir={tmp_path}",
                             *f, *STEPS], tmp_path) for f, g in zip(flags, gpus)]
    logs = finish_all(procs, timeout=120)
    assert [p.returncode for p in procs] == [0, 0], logs
    run_dir = only_run_dir(tmp_path)  # both nodes derived the same run id
    assert run_dir.name == (f"job-127.0.0.1-{port}" if rendezvous == "static" else "job-loop")
    return run_dir, read_summary(run_dir)


@pytest.fixture(scope="module")
def c10d_job(tmp_path_factory):
    """A c10d job of a node with 1 worker and a node with 2: read by the loopback test's c10d case and the
    different-worker-counts test (a pair of node agents costs ~10 CPU-s)."""
    return two_agents_on_loopback(tmp_path_factory.mktemp("c10d"), "c10d", (1, 2))


@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_two_node_agents_on_loopback(request, tmp_path, rendezvous):
    if rendezvous == "static":
        run_dir, summary = two_agents_on_loopback(tmp_path, rendezvous, (2, 2))
        node_ranks = [[0, 1], [2, 3]]
    else:  # c10d ranks the nodes in the order they joined: either node may be node 0
        run_dir, summary = request.getfixturevalue("c10d_job")
        node_ranks = [[0], [1, 2]] if len(summary["node_list"][0]["ranks"]) == 1 else [[0, 1], [2]]
    world = sum(len(ranks) for ranks in node_ranks)
    assert_one_job(summary, world, node_ranks)
    assert summary["rendezvous"] == rendezvous
    assert sorted(p.name for p in (run_dir / "logs").glob("rank-*.log")) == [f"rank-{r}.log" for r in range(world)]


def test_c10d_admits_nodes_with_different_worker_counts(c10d_job):
    _, summary = c10d_job
    assert summary["world_size"] == 3 and len(set(summary["param_checksums"])) == 1
    assert sorted(len(n["ranks"]) for n in summary["node_list"]) == [1, 2]
    assert sorted(r for n in summary["node_list"] for r in n["ranks"]) == [0, 1, 2]


def node_processes(launcher_pid):
    """The simulated node agents, node 0 first (their command line is `... launcher.backends.node RUN_DIR K PID`)."""
    nodes = [p for p in psutil.Process(launcher_pid).children() if "launcher.backends.node" in command_line(p).split()]
    return sorted(nodes, key=lambda p: int(p.cmdline()[-2]))


def kill_node_groups(nodes):
    """Each simulated node runs in its own process group, which we (the test) caused to exist."""
    for node in nodes:
        try:
            if node.is_running():  # psutil checks the start time too: never a recycled pid
                os.killpg(node.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            pass


def start_long_simulated_job(tmp_path):
    # both ranks sleep 1 s a step from step 2 (no CPU): the job is still running when the test stops it
    proc = start_launcher(["--nodes", "2", "--gpus", "1", f"output_dir={tmp_path}", "trainer.steps=100000",
                           "trainer.log_every=1", *QUIET], tmp_path, env=SLOW_RANKS)
    # 120 s: at a load of 16 on 2 cores, three imports of torch and a rendezvous once took more than 60 s
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        runs = [p for p in tmp_path.iterdir() if p.is_dir()]
        metrics = runs[0] / "metrics.jsonl" if runs else None
        if metrics and metrics.exists() and metrics.read_text().strip():
            return proc
        time.sleep(0.2)
    try:
        nodes = node_processes(proc.pid)
    except psutil.Error:  # the launcher has gone meanwhile
        nodes = []
    kill_group(proc)
    kill_node_groups(nodes)  # their own process groups: a node's zygote outlived the launcher's once
    raise AssertionError(f"the simulated job never started training:\n{proc.communicate()[0][-3000:]}")


@pytest.mark.timeout(300)  # a start of up to 120 s under load (start_long_simulated_job), then the stop
@pytest.mark.parametrize("how, code", [("ctrl-c", 130), ("sigterm", 143), ("node dies", 1)])
def test_simulated_job_stops_every_node(tmp_path, how, code):
    proc = start_long_simulated_job(tmp_path)
    nodes = node_processes(proc.pid)
    everything = descendants(proc.pid)
    try:
        assert len(nodes) == 2 and len(everything) >= 4, everything  # 2 node agents, a worker each
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        elif how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            nodes[1].kill()  # node 1's machine dies: its workers go with it (PR_SET_PDEATHSIG)
        out, = finish_all([proc], timeout=90)
        assert proc.returncode == code, out
        assert wait_gone(everything, timeout=15) == []
    finally:
        kill_group(proc)
        kill_node_groups(nodes)
    summary = read_summary(only_run_dir(tmp_path))
    if how == "node dies":
        assert summary["status"] == "failed" and "node 1 was killed by SIGKILL" in summary["error"], summary
        assert "stopping the other nodes" in out
    else:
        assert summary["status"] == "interrupted"
