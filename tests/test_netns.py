"""Two "machines" with their own IP addresses: network namespaces joined by a veth pair.

The job must cross a real network interface: the nodes meet on the head's address 10.77.0.1,
not on 127.0.0.1. Needs root and iproute2 (tests/run.sh installs it); skipped with the reason
otherwise. The namespaces are removed even when the test fails.
"""

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.helpers import QUICK, finish_all, kill_group, only_run_dir, read_metrics, read_summary, run_launcher, start_launcher

pytestmark = [pytest.mark.netns, pytest.mark.timeout(150)]
HEAD, OTHER = "10.77.0.1", "10.77.0.2"


def ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)


@pytest.fixture
def two_hosts():
    """Two namespaces named after this test process (concurrent runs never collide), wired by veth."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("`ip` (iproute2) is not installed: apt-get install -y iproute2")
    names = [f"lnch{os.getpid()}{side}" for side in "ab"]
    made = []
    try:
        for ns in names:
            result = ip("netns", "add", ns)
            if result.returncode != 0:
                pytest.skip(f"cannot make a network namespace here: {result.stderr.strip()}")
            made.append(ns)
        steps = [("link", "add", f"{names[0]}v", "type", "veth", "peer", "name", f"{names[1]}v")]
        for ns, addr in zip(names, (HEAD, OTHER)):
            steps += [("link", "set", f"{ns}v", "netns", ns), ("-n", ns, "addr", "add", f"{addr}/24", "dev", f"{ns}v"),
                      ("-n", ns, "link", "set", f"{ns}v", "up"), ("-n", ns, "link", "set", "lo", "up")]
        for step in steps:
            result = ip(*step)
            assert result.returncode == 0, f"ip {' '.join(step)}: {result.stderr}"
        yield names
    finally:
        for ns in made:
            ip("netns", "del", ns)  # takes its end of the veth pair with it
        leftover = ip("netns", "list").stdout
        assert not any(ns in leftover for ns in made), leftover


def test_two_namespaces_train_across_a_network_interface(tmp_path, two_hosts):
    common = ["--nodes", "2", "--gpus", "2", "--master-addr", HEAD, "--master-port", "29555", "--rdzv-timeout", "60",
              "trainer.steps=12", *QUICK]
    procs = [start_launcher([*common, "--node-rank", str(k), f"output_dir={tmp_path / name}"], tmp_path,
                            prefix=["ip", "netns", "exec", ns])
             for k, (ns, name) in enumerate(zip(two_hosts, ("head", "other")))]
    outs = finish_all(procs, timeout=120)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert f"workers talk over interface {two_hosts[1]}v ({OTHER})" in outs[1]
    for out in outs:  # a clean job prints no error: node 1 once met the head's store closing under its last call
        assert "frame #" not in out and "failed" not in out and "Traceback" not in out, out

    head, other = only_run_dir(tmp_path / "head"), only_run_dir(tmp_path / "other")
    assert head.name == other.name == "job-10.77.0.1-29555"
    summary = read_summary(head)  # written by the node that ran rank 0
    assert summary["status"] == "completed" and summary["world_size"] == 4
    assert len(summary["param_checksums"]) == 4 and len(set(summary["param_checksums"])) == 1
    assert [n["ranks"] for n in summary["node_list"]] == [[0, 1], [2, 3]]
    assert not (other / "summary.json").exists()
    # each global rank's log is written on the machine that ran it, and copied to the head's run directory
    # while the job runs (launcher.backends.mirror): the two output folders are not shared
    assert sorted(p.name for p in (other / "logs").glob("rank-*.log")) == ["rank-2.log", "rank-3.log"]
    assert sorted(p.name for p in (head / "logs").glob("rank-*.log")) == [f"rank-{r}.log" for r in range(4)]
    for rank in (2, 3):
        assert (head / "logs" / f"rank-{rank}.log").read_bytes() == (other / "logs" / f"rank-{rank}.log").read_bytes()
    assert json.loads((head / "nodes" / "node-1.json").read_text())["ranks"] == [2, 3]
    assert len(read_metrics(head)[-1]["step_time_s_per_rank"]) == 4
    assert not (head / ".head-token").exists()
    logs = run_launcher(["logs", head.name, "--output-dir", str(tmp_path / "head"), "--rank", "3"], tmp_path, timeout=60)
    assert logs.returncode == 0 and "rank 3/4 (node 1" in logs.stdout, logs.stdout[-2000:] + logs.stderr
    listing = run_launcher(["ls", str(tmp_path / "head")], tmp_path, timeout=60)
    assert listing.returncode == 0 and head.name in listing.stdout and "completed" in listing.stdout, listing.stdout


@pytest.mark.timeout(300)
def test_elastic_job_across_namespaces_loses_the_other_host_and_completes(tmp_path, two_hosts):
    """--nodes 1:2 on c10d across a real interface: the host without the rendezvous store is lost (its launcher,
    the node agent, killed by pid while its rank hangs at step 12); the head re-forms alone and finishes."""
    shared = tmp_path / "ckpt"  # the checkpoint on storage both hosts reach, as on a cluster
    common = ["--nodes", "1:2", "--gpus", "1", "--max-restarts", "1", "--rdzv-endpoint", f"{HEAD}:29557",
              "--rdzv-id", "elastic", "rdzv.conf.last_call_timeout=10",
              "rdzv.conf.keep_alive_interval=1", "rdzv.conf.keep_alive_max_attempt=5",
              "trainer.steps=30", "checkpoint.every_steps=5", f"checkpoint.dir={shared}", "watchdog.timeout_s=0",
              "data.record_shards=true", *QUICK, "wandb.mode=disabled"]
    procs = [start_launcher([*common, f"output_dir={tmp_path / name}"], tmp_path, prefix=["ip", "netns", "exec", ns],
                            env={"LAUNCHER_INJECT_FAULT": "rank=1,step=12,action=hang"})
             for ns, name in zip(two_hosts, ("head", "other"))]
    log = tmp_path / "other" / "job-elastic" / "logs" / "rank-1.log"  # rank 1: the second node by address
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and procs[1].poll() is None and "injected hang" not in _text(log):
        time.sleep(0.3)
    if "injected hang" in _text(log):
        os.kill(procs[1].pid, signal.SIGKILL)  # `ip netns exec` execs: the other host's launcher, its node agent
    else:
        for proc in procs:
            kill_group(proc)
    outs = finish_all(procs, timeout=200)
    assert "injected hang" in _text(log), f"rank 1 never reached its injected hang on the other host: {outs}"
    assert procs[0].returncode == 0, outs[0]
    summary = read_summary(tmp_path / "head" / "job-elastic")
    assert summary["status"] == "completed" and summary["steps"] == 30 and summary["restarts"] == 1
    assert (summary["world_size"], summary["nodes"]) == (1, 1)
    [change] = summary["membership_changes"]
    assert change["left"] == [f"{OTHER}:{procs[1].pid}"] and change["world_size"] == 1


@pytest.mark.timeout(300)
def test_a_host_that_joins_a_running_elastic_job_is_admitted(tmp_path, two_hosts):
    """--nodes 1:2 on c10d across a real interface: the head trains alone (1 s a step, a wait that costs no CPU),
    the other host starts with the same command and is taken in; both finish on a world of 2. The head keeps
    rank 0 (c10d orders nodes by address), so its summary lists the join."""
    shared = tmp_path / "ckpt"  # the checkpoint on storage both hosts reach, as on a cluster
    common = ["--nodes", "1:2", "--gpus", "1", "--max-restarts", "0", "--rdzv-endpoint", f"{HEAD}:29559",
              "--rdzv-id", "join", "--rdzv-timeout", "120", "rdzv.conf.last_call_timeout=5", "trainer.steps=130",
              "checkpoint.every_steps=10",
              f"checkpoint.dir={shared}", "watchdog.timeout_s=0", *QUICK, "data.dataset_size=2048",
              "wandb.mode=disabled"]
    slow = {"LAUNCHER_INJECT_FAULT": "rank=0,step=1,action=slow"}
    procs = [start_launcher([*common, f"output_dir={tmp_path / 'head'}"], tmp_path,
                            prefix=["ip", "netns", "exec", two_hosts[0]], env=slow)]
    log = tmp_path / "head" / "job-join" / "logs" / "rank-0.log"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and procs[0].poll() is None and "samples per epoch" not in _text(log):
            time.sleep(0.3)
        procs.append(start_launcher([*common, f"output_dir={tmp_path / 'other'}"], tmp_path,
                                    prefix=["ip", "netns", "exec", two_hosts[1]], env=slow))
        outs = finish_all(procs, timeout=200)
    finally:
        for proc in procs:
            kill_group(proc)
    assert [p.returncode for p in procs] == [0, 0], outs
    summary = read_summary(tmp_path / "head" / "job-join")
    assert summary["status"] == "completed" and summary["steps"] == 130 and summary["restarts"] == 0
    assert (summary["world_size"], summary["nodes"]) == (2, 2)
    [change] = summary["membership_changes"]
    assert change["left"] == [] and change["joined"] == [f"{OTHER}:{procs[1].pid}"] and change["world_size"] == 2
    assert (tmp_path / "other" / "job-join" / "logs" / f"rank-1.attempt-{change['round']}.log").exists()

def _text(path):
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
