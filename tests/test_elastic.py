"""Elastic membership (--nodes MIN:MAX): a job that loses a node goes on without it, with the data split following.

Real processes: simulated nodes on this machine (c10d rendezvous, its store held by the launcher), gloo,
the quick model. A node agent is killed by its pid while its rank hangs at a known step.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import psutil
import pytest

from tests.helpers import (QUIET, communicate_bounded, finish_all, free_port, kill_group, launcher_env, only_run_dir,
                           read_summary, run_launcher, start_launcher)

pytestmark = pytest.mark.timeout(300)

# re-form fast: a lost node counts as gone after 5 missed 1 s keep-alives; both nodes join the first round (MAX) if they
# start within 10 s of each other, and after the loss the one left waits 10 s for others before it goes on alone
LOST_RANK = 0  # the node with rank 0 goes: the other node's rank becomes rank 0 and writes the summary
FAST_RDZV = ["rdzv.conf.last_call_timeout=10", "rdzv.conf.keep_alive_interval=1", "rdzv.conf.keep_alive_max_attempt=5"]


def test_nodes_min_max_parses_into_the_config():
    from launcher.config.elastic import parse_nodes
    from launcher.config.schema import load_config

    assert parse_nodes("2") == (2, 2) and parse_nodes("1:4") == (1, 4)
    cfg = load_config(None, ["nodes=2", "min_nodes=1"])
    assert (cfg.min_nodes, cfg.nodes) == (1, 2)


def test_sampler_resplits_an_epoch_at_its_global_offset():
    """Two ranks read 10 batches of 4, then one rank reads the rest: every sample once, in the epoch's order."""
    import torch

    from launcher.trainers.data import ResumableSampler

    data = torch.utils.data.TensorDataset(torch.arange(200))
    two = [ResumableSampler(data, 2, r, seed=3) for r in range(2)]
    for s in two:
        s.set_epoch(5)
    plain = torch.utils.data.DistributedSampler(data, 2, 0, seed=3, drop_last=True)
    plain.set_epoch(5)
    assert list(two[0]) == list(plain), "from an epoch's start it deals as DistributedSampler does"
    before = [i for step in range(10) for s in two for i in list(s)[step * 4:(step + 1) * 4]]
    one = ResumableSampler(data, 1, 0, seed=3)
    one.set_epoch(5, start=80)
    after = list(one)
    assert len(before) == 80 and len(after) == 120
    assert sorted(before + after) == list(range(200)), "a sample was dropped or repeated across the change"
    assert set(before) == set(one.order()[:80])


def test_an_epoch_resumed_at_an_odd_offset_ends_with_a_smaller_batch_not_a_dropped_tail():
    """One rank stopped after 31 batches of 16 (a join's stop lands on any step); two ranks of 16 read the
    remaining 528 as 16 batches each and then one of 8, as the trainer's loader deals them."""
    import torch

    from launcher.trainers.data import build_loader

    data = torch.utils.data.TensorDataset(torch.arange(1024))
    loaders = [build_loader(data, 16, r, 2, seed=3) for r in range(2)]
    for _, sampler in loaders:
        sampler.set_epoch(0, start=31 * 16)
    batches = [[b[0].tolist() for b in loader] for loader, _ in loaders]
    assert [len(b) for b in batches[0]] == [16] * 16 + [8] == [len(b) for b in batches[1]]
    read = sorted(i for rank in batches for b in rank for i in b)
    assert read == sorted(loaders[0][1].order()[31 * 16:]), "the epoch's tail was dropped or repeated"
    loaders[0][1].set_epoch(1, start=0)  # an epoch from its start: whole batches only, as DistributedSampler
    assert len(loaders[0][1]) == 512 and len(list(loaders[0][0])) == 32


def test_elastic_with_a_static_rendezvous_is_refused_in_one_line(tmp_path):
    result = run_launcher(["--nodes", "1:2", "--gpus", "1", "--node-rank", "0", "--master-addr", "127.0.0.1",
                           f"output_dir={tmp_path}", *QUIET], cwd=tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--rdzv-endpoint" in lines[0] and "1:2" in lines[0], result.stderr


def _node_agent_of(pid: int) -> psutil.Process:
    """The simulated node agent (launcher.backends.node) a worker runs under: the highest process above it with that
    command line, as its zygote, between the two, has it too (forked from the node: launcher.prestart)."""
    proc, found = psutil.Process(pid), None
    while proc is not None:
        if "launcher.backends.node" in " ".join(proc.cmdline()):
            found = proc
        elif found is not None:
            return found
        proc = proc.parent()
    raise AssertionError(f"no node agent above pid {pid}")


def _wait_for_hang(run_dir_parent: Path, rank: int, deadline: float, launcher: subprocess.Popen) -> int:
    """The pid rank `rank` printed as it hung (the fault injection's line)."""
    while time.monotonic() < deadline and launcher.poll() is None:
        for log in run_dir_parent.glob(f"*/logs/rank-{rank}.log"):
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith(f"injected hang on rank {rank}"):
                    return int(line.rsplit("pid ", 1)[1])
        time.sleep(0.3)
    raise AssertionError(f"rank {rank} never reached its injected hang")


def _epoch0_once(run_dir: Path, samples: int = 1024) -> None:
    """The epoch that spans the change: every sample exactly once."""
    epoch0 = [i for indices in _kept_steps(run_dir).values() for i in indices]
    assert len(epoch0) == len(set(epoch0)), "a sample was repeated in the epoch that spans the change"
    assert sorted(epoch0) == list(range(samples)), "a sample was dropped in the epoch that spans the change"


def _kept_steps(run_dir: Path) -> Dict[int, List[int]]:
    """{step: the indices every rank trained on}, each step from the last attempt that ran it (a restart redoes
    the steps after its checkpoint: the earlier attempt's are lost work, not progress)."""
    by_attempt: Dict[int, Dict[int, List[int]]] = {}
    epochs: Dict[int, int] = {}
    for path in (run_dir / "shards").glob("seen-*-rank-*.jsonl"):
        attempt = int(path.name.split("-")[1])
        for line in path.read_text().splitlines():
            row = json.loads(line)
            by_attempt.setdefault(attempt, {}).setdefault(row["step"], []).extend(row["indices"])
            epochs[row["step"]] = row["epoch"]
    kept: Dict[int, List[int]] = {}
    for attempt in sorted(by_attempt):
        resumed_after = min(by_attempt[attempt]) - 1
        kept = {s: v for s, v in kept.items() if s <= resumed_after}
        kept.update(by_attempt[attempt])
    return {s: v for s, v in kept.items() if epochs[s] == 0}


@pytest.mark.slow
@pytest.mark.parametrize("nodes, steps", [pytest.param("1:2", 60, marks=pytest.mark.compat), ("2:3", 40)],
                         ids=["one-of-2", "one-of-3"])
def test_simulated_job_loses_a_node_and_completes_on_the_others(tmp_path, nodes, steps):
    """Epoch 0 across the change, resumed from step 10: one of 2 is 10 steps of 2 x 16, then 44 of 16; one of 3
    is 10 steps of 3 x 16, then 17 of 2 x 16 (1024 samples either way, none left for drop_last)."""
    left = int(nodes.split(":")[1]) - 1  # nodes and ranks (one a node) after the change
    args = [sys.executable, "-m", "launcher", "--nodes", nodes, "--gpus", "1", "--max-restarts", "1", *FAST_RDZV,
            f"output_dir={tmp_path}", f"trainer.steps={steps}", "checkpoint.every_steps=5", "trainer.log_every=5",
            "data.record_shards=true", "watchdog.timeout_s=0", *QUIET]
    env = launcher_env({"LAUNCHER_INJECT_FAULT": f"rank={LOST_RANK},step=12,action=hang"})
    launcher = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    try:
        hung = _wait_for_hang(tmp_path, LOST_RANK, time.monotonic() + 150, launcher)
        node = _node_agent_of(hung)
        os.kill(node.pid, signal.SIGKILL)  # the machine of that rank is gone
        out, err = communicate_bounded(launcher, 200, "elastic launcher")
    finally:
        if launcher.poll() is None:
            kill_group(launcher)
            launcher.wait()
    assert launcher.returncode == 0, err
    assert "the job goes on without it" in err
    run_dir = only_run_dir(tmp_path)
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == steps
    assert (summary["world_size"], summary["nodes"], summary["restarts"]) == (left, left, 1)
    [change] = summary["membership_changes"]
    assert len(change["left"]) == 1 and change["joined"] == []
    assert (change["nodes"], change["world_size"]) == (left, left)
    assert change["left"][0].endswith(f":{node.pid}")
    assert summary["badput_s"]["membership"] > 0
    _epoch0_once(run_dir)
    assert "resumed from" in (run_dir / "logs" / "rank-0.attempt-1.log").read_text()
    from launcher.board.views import run_view  # what the board's run page lists under its events

    shown = [e["text"] for e in run_view(run_dir)["events"] if e["text"].startswith("membership change")]
    assert shown == [f"membership change (left: {change['left'][0]}): {left} nodes, world size {left}"]


SCRIPT = """
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world, attempt = dist.get_rank(), dist.get_world_size(), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
with open(os.path.join(sys.argv[1], f"attempt-{attempt}-rank-{rank}.json"), "w") as f:
    json.dump({"world": world, "pid": os.getpid(), "env_world": int(os.environ["WORLD_SIZE"])}, f)
for _ in range(600 if attempt == 0 else 3):  # the first attempt runs until a node is lost
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.05)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_script_is_restarted_on_the_nodes_left_with_the_restart_count(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    args = [sys.executable, "-m", "launcher", "--nodes", "1:2", "--gpus", "1", "--max-restarts", "1", *FAST_RDZV,
            f"output_dir={tmp_path / 'runs'}", "watchdog.timeout_s=0", "train.py", str(out)]
    launcher = subprocess.Popen(args, cwd=tmp_path, env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while not (out / "attempt-0-rank-1.json").exists() and time.monotonic() < deadline and launcher.poll() is None:
            time.sleep(0.3)
        first = json.loads((out / "attempt-0-rank-1.json").read_text())
        assert first["world"] == 2
        os.kill(_node_agent_of(first["pid"]).pid, signal.SIGKILL)
        _, err = communicate_bounded(launcher, 200, "elastic launcher")
    finally:
        if launcher.poll() is None:
            kill_group(launcher)
            launcher.wait()
    assert launcher.returncode == 0, err
    again = json.loads((out / "attempt-1-rank-0.json").read_text())  # TORCHELASTIC_RESTART_COUNT=1, as torchrun
    assert again["world"] == again["env_world"] == 1
    assert not (out / "attempt-1-rank-1.json").exists()
    summary = read_summary(only_run_dir(tmp_path / "runs"))
    assert summary["status"] == "completed" and summary["restarts"] == 1
    assert [c["world_size"] for c in summary.get("membership_changes", [])] == [1]


def _wait_for_line(path: Path, text: str, deadline: float, procs: List[subprocess.Popen]) -> None:
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.3)
    raise AssertionError(f"'{text}' never appeared in {path}")


@pytest.mark.slow
@pytest.mark.compat
def test_a_node_that_joins_a_running_job_is_admitted(tmp_path):
    """Node A trains alone (--nodes 1:2); node B, started with the same command, is taken in at once: A's workers
    stop at a step boundary with a checkpoint (not counted against --max-restarts 0), and both resume from it."""
    steps = 130  # epoch 0 is 128 steps alone: it spans the join wherever it lands, and ends before the job does
    common = ["--nodes", "1:2", "--gpus", "1", "--max-restarts", "0", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
              "--rdzv-id", "join", "--rdzv-timeout", "120", "rdzv.conf.last_call_timeout=5",
              f"output_dir={tmp_path}", f"trainer.steps={steps}",
              "checkpoint.every_steps=10", "trainer.log_every=10", "data.record_shards=true", "watchdog.timeout_s=0",
              *QUIET, "data.dataset_size=2048"]
    # torch's keep-alives (3 missed, 5 s apart): at 1 s apart, a load of 22 once stalled A's heartbeats past 3 s, and
    # B, finding A "dead", formed a job of its own beside it (torch's c10d has no fencing)
    # alone, rank 0 takes 1 s a step (attempt 0 only), a wait that costs no CPU: B's start, however slow (60 s at
    # a load of 18 on 2 cores), lands in epoch 0; together they run at full speed
    slow = {"LAUNCHER_INJECT_FAULT": "rank=0,step=1,action=slow"}
    procs = [start_launcher(common, tmp_path, env=slow)]
    try:
        _wait_for_line(tmp_path / "job-join" / "shards" / "seen-0-rank-0.jsonl", '"step": 1,', time.monotonic() + 120,
                       procs)
        procs.append(start_launcher(common, tmp_path, env=slow))
        outs = finish_all(procs, timeout=200)
    finally:
        for proc in procs:
            kill_group(proc)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert f"membership changed (joined: 127.0.0.1:{procs[1].pid}): 2 nodes, world size 2" in outs[0], outs[0]
    rounds = re.findall(r"elastic round (\d+): running (\d+) workers? on (\d+) nodes? \(--nodes 1:2\)", outs[0] + outs[1])
    assert rounds[0][1:] == ("1", "1") and rounds[-1][1:] == ("2", "2"), rounds  # what ran, each round, not the 2 at most
    assert len({r[0] for r in rounds}) == len(rounds), rounds  # one line a round: the node that holds group rank 0
    run_dir = only_run_dir(tmp_path)
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and summary["steps"] == steps
    assert (summary["world_size"], summary["nodes"], summary["restarts"]) == (2, 2, 0)
    [change] = summary["membership_changes"]
    assert change["left"] == [] and change["joined"] == [f"127.0.0.1:{procs[1].pid}"]
    assert (change["nodes"], change["world_size"]) == (2, 2)
    assert summary["badput_s"]["membership"] > 0 and summary["badput_s"]["restart"] == 0
    # each attempt after the join has names of its own (torch's restart count stays 0 there); B is in from the
    # next round, or the one after where the last call closed before its once-a-second poll (a loaded machine)
    logs = sorted(p.name for p in (run_dir / "logs").glob("rank-*.log"))
    last = change["round"]
    assert logs[-2:] == ["rank-0.log", f"rank-1.attempt-{last}.log"] and f"rank-0.attempt-{last}.log" in logs, logs
    records = {p.name.rsplit("-attempt-", 1)[1] for p in (run_dir / "goodput").glob("*-attempt-*.json")}
    assert {"0.json", f"{last}.json"} <= records, records  # rank 0's, one per attempt
    assert "(epoch 0, sample " in (run_dir / "logs" / f"rank-0.attempt-{last}.log").read_text()  # resumed mid-epoch
    _epoch0_once(run_dir, samples=2048)  # whatever step the join stopped A at: its tail is read, as a smaller batch
