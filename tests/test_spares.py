"""Hot spares (--spares K): extra node agents that check in warm and run no ranks, one of which takes a lost node's
place, so the world size, the global batch and each rank's share of the data stay as they were.

Real processes: simulated nodes on this machine (c10d rendezvous, its store held by the launcher), gloo. A node agent
is SIGKILLed by its pid (its machine is gone).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import psutil
import pytest

from tests.helpers import QUIET, communicate_bounded, kill_group, launcher_env, only_run_dir, read_summary, run_launcher
from tests.test_elastic import _epoch0_once, _node_agent_of, _wait_for_hang
from tests.wandb_records import history, run_summary

pytestmark = pytest.mark.timeout(300)
SPARE = ["--nodes", "2", "--spares", "1", "--gpus", "1", "--max-restarts", "2"]


def _launch(args: List[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(launcher: subprocess.Popen, what: str) -> str:
    try:
        _, err = communicate_bounded(launcher, 200, what)
    finally:
        if launcher.poll() is None:
            kill_group(launcher)
            launcher.wait()
    assert launcher.returncode == 0, err
    return err


@pytest.mark.slow
def test_a_spare_takes_a_lost_nodes_place_and_the_epoch_goes_on_at_the_same_world_size(tmp_path):
    """2 nodes and a spare, 40 steps of 2 x 16 (an epoch is 32): the node of rank 0 is lost at step 12; the spare
    takes its place, both ranks resume from step 10's checkpoint, and epoch 0 holds every sample once."""
    args = [*SPARE, f"output_dir={tmp_path}", "trainer.steps=40", "checkpoint.every_steps=5", "trainer.log_every=5",
            "data.record_shards=true", "watchdog.timeout_s=0", *QUIET]
    launcher = _launch(args, tmp_path, launcher_env({"LAUNCHER_INJECT_FAULT": "rank=0,step=12,action=hang"}))
    try:
        node = _node_agent_of(_wait_for_hang(tmp_path, 0, time.monotonic() + 150, launcher))
        os.kill(node.pid, signal.SIGKILL)
    finally:
        err = _finish(launcher, "launcher with a spare")
    assert "2 nodes and 1 hot spare" in err and "job of 2 nodes and 1 hot spare" in err
    run_dir = only_run_dir(tmp_path)
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == 40
    assert (summary["world_size"], summary["nodes"], summary["spares"]) == (2, 2, 1)  # the world size stayed
    [change] = summary["membership_changes"]
    [replaced] = change["replaced"]
    assert replaced["left"].endswith(f":{node.pid}") and change["left"] == [replaced["left"]]
    assert change["joined"] == [replaced["by"]] and (change["nodes"], change["world_size"]) == (2, 2)
    assert f"membership changed ({replaced['left']} replaced by {replaced['by']}): 2 nodes, world size 2" in err
    assert "running 2 workers on 2 nodes (--nodes 2 --spares 1)" in err
    _epoch0_once(run_dir)
    for rank in (0, 1):  # the spare's rank too: it resumed from the checkpoint the others did
        assert "resumed from" in (run_dir / "logs" / f"rank-{rank}.attempt-1.log").read_text()
    assert summary["badput_s"]["membership"] > 0
    from launcher.board.views import run_view  # the board's run page, under its events

    shown = [e["text"] for e in run_view(run_dir)["events"] if e["text"].startswith("membership change")]
    assert shown == [f"membership change ({replaced['left']} replaced by {replaced['by']}): 2 nodes, world size 2"]
    listed = run_launcher(["ls", str(tmp_path)], tmp_path, timeout=60)
    assert f"1 hot spare; {replaced['left']} replaced by {replaced['by']}" in listed.stdout, listed.stdout


SCRIPT = """
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world, count = dist.get_rank(), dist.get_world_size(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
with open(os.path.join(sys.argv[1], f"count-{count}-rank-{rank}.json"), "w") as f:
    json.dump({"world": world, "pid": os.getpid()}, f)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(600 if count == 0 else 40):  # the first attempt runs until a node is lost; each rank steps alike
    opt.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
    time.sleep(0.05)
dist.destroy_process_group()
"""


def _wait_for(path: Path, launcher: subprocess.Popen) -> dict:
    deadline = time.monotonic() + 150
    while not path.exists() and time.monotonic() < deadline and launcher.poll() is None:
        time.sleep(0.3)
    time.sleep(0.2)  # written whole
    return json.loads(path.read_text())


def _node_agents(launcher: subprocess.Popen) -> List[psutil.Process]:
    """The launcher's simulated node agents (its children running launcher.backends.node)."""
    return [p for p in psutil.Process(launcher.pid).children() if "launcher.backends.node" in " ".join(p.cmdline())]


@pytest.mark.slow
def test_a_scripts_ranks_all_restart_with_the_count_up_by_one_where_a_spare_took_the_place(tmp_path):
    """The spare's rank sees TORCHELASTIC_RESTART_COUNT=1 as the survivor's does (its own agent made no restart: a
    script that loads its checkpoint when the count is above 0 would otherwise run two ways); W&B has the change."""
    (tmp_path / "train.py").write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    launcher = _launch([*SPARE, f"output_dir={tmp_path / 'runs'}", "watchdog.timeout_s=0", "train.py", str(out)],
                       tmp_path, launcher_env())
    try:
        first = _wait_for(out / "count-0-rank-1.json", launcher)
        other = _wait_for(out / "count-0-rank-0.json", launcher)
        lost, kept = _node_agent_of(first["pid"]), _node_agent_of(other["pid"])
        os.kill(lost.pid, signal.SIGKILL)
        again = [_wait_for(out / f"count-1-rank-{rank}.json", launcher) for rank in (0, 1)]
        agents = {_node_agent_of(a["pid"]).pid for a in again}  # (while the ranks run: 2 s)
    finally:
        err = _finish(launcher, "launcher with a spare")
    assert [a["world"] for a in again] == [2, 2]
    assert lost.pid not in agents and kept.pid in agents and len(agents) == 2  # the survivor and the spare
    run_dir = only_run_dir(tmp_path / "runs")
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and (summary["world_size"], summary["spares"]) == (2, 1)
    assert summary["restarts"] == 1
    [change] = summary["membership_changes"]
    (wandb_run,) = (run_dir / "wandb").glob("offline-run-*")
    assert run_summary(wandb_run)["replacements"] == 1 and run_summary(wandb_run)["spares"] == 1
    assert any(row.get("events/membership") == 1 for row in history(wandb_run)), err


@pytest.mark.slow
def test_a_spare_lost_while_it_waits_costs_the_job_nothing(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT.replace("range(600 if count == 0 else 40)", "range(60)"))
    out = tmp_path / "out"
    out.mkdir()
    launcher = _launch([*SPARE, f"output_dir={tmp_path / 'runs'}", "watchdog.timeout_s=0", *QUIET[-1:], "train.py",
                        str(out)], tmp_path, launcher_env())
    try:
        running = {_node_agent_of(_wait_for(out / f"count-0-rank-{rank}.json", launcher)["pid"]).pid for rank in (0, 1)}
        [spare] = [p for p in _node_agents(launcher) if p.pid not in running]
        os.kill(spare.pid, signal.SIGKILL)
    finally:
        err = _finish(launcher, "launcher with a spare")
    assert re.search(rf"node \d \(pid {spare.pid}\) was killed by SIGKILL; 2 node agents remain", err), err
    summary = read_summary(only_run_dir(tmp_path / "runs"))
    assert summary["status"] == "completed" and summary["restarts"] == 0 and "membership_changes" not in summary
    assert not (out / "count-1-rank-0.json").exists() and summary["steps"] == 60  # the ranks never restarted


@pytest.mark.parametrize("flags, said", [
    (["--spares", "-1"], "--spares -1 must be 0 or more"),
    (["--spares", "1"], "--spares 1 with --max-restarts 0"),
    (["--spares", "1", "--max-restarts", "2", "--node-rank", "0", "--master-addr", "127.0.0.1"], "--spares 1 needs the c10d rendezvous"),
])
def test_a_spare_that_cannot_work_is_refused_in_one_line(tmp_path, flags, said):
    done = run_launcher(["--nodes", "2", "--gpus", "1", *flags, f"output_dir={tmp_path / 'runs'}", *QUIET], tmp_path, timeout=60)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_an_elastic_jobs_keep_alives_are_quick_only_where_no_two_groups_of_min_nodes_can_form():
    from types import SimpleNamespace

    from launcher.config.rendezvous import rdzv_configs

    def configs(nodes, least, spares, conf=None):
        plan = SimpleNamespace(rdzv_timeout_s=60, rdzv_conf=conf or {}, rdzv_backend="c10d", mode="simulated",
                               nodes=nodes, min_nodes=least, spares=spares)
        found = rdzv_configs(plan)
        return found.get("keep_alive_interval"), found.get("keep_alive_max_attempt")

    assert configs(2, 2, 1) == (1, 3) and configs(4, 4, 3) == (1, 3)  # a dropped node could join no job but this one
    assert configs(2, 1, 1) == (None, None)  # 1 of 2 and a spare: two jobs of one node each could form (torch's 5 s)
    assert configs(2, 2, 2) == (None, None) and configs(2, 2, 0) == (None, None)  # a fixed-size job: torch's
    assert configs(3, 2, 0) == (1, 3) and configs(2, 1, 0) == (1, 3)  # no spare: a joining node waits its last call,
    # and the dropped node fences itself before (launcher.runtime.torch_private)
    assert configs(2, 2, 1, {"keep_alive_interval": "4"})[0] == "4"  # the user's own setting wins (as torch parses it)


def test_a_round_after_the_first_waits_two_seconds_for_more_nodes_not_the_whole_last_call():
    from datetime import timedelta

    from launcher.agent.rendezvous import REFORM_LAST_CALL_S, ReformingTimeout

    timeout = ReformingTimeout(None, timedelta(seconds=30), None, None)
    assert timeout.last_call == timedelta(seconds=30) and timeout.join == timedelta(seconds=600)  # torch's join default
    timeout.formed()  # this node's first round: the nodes started together are in
    assert timeout.last_call == timedelta(seconds=REFORM_LAST_CALL_S) == timedelta(seconds=2)
    short = ReformingTimeout(None, timedelta(seconds=1), None, None)
    short.formed()
    assert short.last_call == timedelta(seconds=1)  # a user's shorter last call stays
