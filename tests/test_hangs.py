"""Hangs in plain scripts, caught with no code change: the DDP tutorial's shape (tests/scripts/ddp_hang.py),
which never imports the launcher, judged by its optimizer steps (docs/hangs.md)."""

import json
import shutil
import time
from pathlib import Path

import pytest

from tests.helpers import (NO_WANDB, command_line, descendants, finish_all, free_port, only_run_dir, read_summary,
                           start_launcher, wait_gone)

pytestmark = pytest.mark.timeout(90)
SCRIPT = Path(__file__).resolve().parent / "scripts" / "ddp_hang.py"
TIMEOUT_S = 3
# After the allowance the verdict states: stack dumps, py-spy, stopping; generous for a loaded 2-core box.
BOUND_S = 30
# Every launch here leaves W&B out (NO_WANDB): a script's first optimizer step would start W&B's offline run, ~1.7 CPU-s
# of a launch that checks nothing of it (W&B is tests/test_metrics_runs.py's and tests/test_script_metrics.py's).


def launch(tmp_path, args, script_args):
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    proc = start_launcher([f"output_dir={tmp_path / 'runs'}", f"watchdog.timeout_s={TIMEOUT_S}", *NO_WANDB, *args,
                           SCRIPT.name, *script_args], tmp_path)
    deadline = time.monotonic() + 30
    workers = []
    while time.monotonic() < deadline and proc.poll() is None and len(workers) < 2:
        time.sleep(0.1)
        workers = [p for p in descendants(proc.pid) if "bootstrap.py" in command_line(p)]
    return proc, workers


def hang_moment(run_dir: Path, rank: int) -> float:
    """When the rank said it hangs (its log file's lines carry no clock: the file's first write is close enough)."""
    return (run_dir / "logs" / f"rank-{rank}.log").stat().st_mtime


def check_caught(tmp_path, proc, workers, out, started):
    assert proc.returncode == 1, out
    assert wait_gone(workers, timeout=5) == [], "a worker outlived the launcher"
    run_dir = only_run_dir(tmp_path / "runs")
    summary = read_summary(run_dir)
    assert summary["status"] == "hung", summary
    assert summary["error"].splitlines()[0] in out or summary["error"] in out
    assert sum(line.count("watchdog: progress = optimizer steps") for line in out.splitlines()) == 1, out
    for rank in (0, 1):
        assert "most recent call first" in (run_dir / "stacks" / f"rank-{rank}.txt").read_text()
        native = run_dir / "stacks" / f"rank-{rank}.native.txt"
        assert native.exists() and native.stat().st_size > 0, "py-spy (in the venv) left no native stack"
    return run_dir, summary["error"]


@pytest.mark.compat
def test_a_rank_that_stops_mid_training_is_named(tmp_path):
    started = time.monotonic()
    proc, workers = launch(tmp_path, ["--gpus", "2"], ["--hang", "1", "--at", "8"])
    out, = finish_all([proc], timeout=75)
    run_dir, error = check_caught(tmp_path, proc, workers, out, started)
    assert "rank 1 stuck" in error and "sleep_forever (ddp_hang.py:" in error, error
    allowed = float(error.split("no progress for over ")[1].split("s")[0])
    assert allowed <= 30, error  # max(timeout, 2 x the start-up and slowest step): a few seconds here
    assert time.time() - hang_moment(run_dir, 1) < allowed + BOUND_S


def test_a_rank_that_never_reaches_init_process_group_is_named(tmp_path):
    proc, workers = launch(tmp_path, ["--gpus", "2", "watchdog.start_timeout_s=4"], ["--hang", "1", "--at", "0"])
    out, = finish_all([proc], timeout=75)
    _, error = check_caught(tmp_path, proc, workers, out, time.monotonic())
    assert error.startswith("stuck start: no progress within 4s"), error
    assert "rank 1 in sleep_forever (ddp_hang.py:" in error, error
    assert "rank 0 in init_process_group (ddp_hang.py:" in error, error


def test_a_hang_on_node_1_is_named_by_the_launcher(tmp_path):
    proc, workers = launch(tmp_path, ["--nodes", "2", "--gpus", "1"], ["--hang", "1", "--at", "8"])
    out, = finish_all([proc], timeout=85)
    assert proc.returncode == 1, out
    assert wait_gone(workers, timeout=5) == [], "a worker outlived the launcher"
    run_dir = only_run_dir(tmp_path / "runs")
    summary = read_summary(run_dir)
    assert summary["status"] == "hung", summary
    assert_node_1_leads(summary["error"])
    assert summary["error"] in out
    assert "most recent call first" in (run_dir / "stacks" / "rank-1.txt").read_text()
    assert_node0_dumped(run_dir)


def assert_node_1_leads(error: str) -> None:
    """Node 1's hang, its rank 1 sleeping, leads the job's verdict, whichever node's watchdog fired first; node 0's
    follows, with where rank 0 waits."""
    assert error.startswith("node 1: hang"), error
    assert "rank 1 stuck" in error.split(" | node 0: ")[0] and "sleep_forever (ddp_hang.py:" in error, error
    assert " | node 0: hang" in error and "rank 0 stuck" in error.split(" | node 0: ")[1], error


def assert_node0_dumped(run_dir: Path) -> None:
    """Node 0's rank waits on node 1's: node 0 is told when node 1's watchdog fires first (or fires itself) and
    dumps rank 0's stacks before either node stops its rank, so it ends hung, never failed by a reset collective."""
    node0 = json.loads((run_dir / "nodes" / "node-0.json").read_text())
    assert node0["status"] == "hung", node0
    assert "most recent call first" in (run_dir / "stacks" / "rank-0.txt").read_text()


def test_a_hang_on_node_1_is_named_on_node_0_across_machines(tmp_path):
    """Two node agents with their own run directories, as on two machines; rank 1 (node 1) stops. Node 0's own
    watchdog would wait 120 s: only node 1's word stops it, with rank 0's stacks dumped while it still waits."""
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    port = free_port()
    procs = [start_launcher(["--nodes", "2", "--gpus", "1", "--node-rank", str(k), "--master-addr", "127.0.0.1",
                             "--master-port", str(port), f"output_dir={tmp_path / f'machine{k}'}",
                             f"watchdog.timeout_s={120 if k == 0 else TIMEOUT_S}", *NO_WANDB,
                             SCRIPT.name, "--hang", "1", "--at", "8"],
                            tmp_path)
             for k in (0, 1)]
    out0, out1 = finish_all(procs, timeout=85)
    assert [p.returncode for p in procs] == [1, 1], out0 + out1
    summary = read_summary(only_run_dir(tmp_path / "machine0"))
    assert summary["status"] == "hung", summary
    assert_node_1_leads(summary["error"])
    assert "node 0: hang (node 1's watchdog fired first): rank 0 stuck" in summary["error"], summary["error"]
    assert "error: " + summary["error"] in out0, out0
    # each machine's ranks' stacks in its own run directory
    assert "most recent call first" in (only_run_dir(tmp_path / "machine1") / "stacks" / "rank-1.txt").read_text()
    assert_node0_dumped(only_run_dir(tmp_path / "machine0"))


def test_a_rank_on_node_1_that_never_reaches_init_process_group_is_named(tmp_path):
    """Node 0's rank waits in init_process_group; node 1's rank sleeps before it: node 1 is told, and names it."""
    started = time.monotonic()
    proc, workers = launch(tmp_path, ["--nodes", "2", "--gpus", "1", "watchdog.start_timeout_s=4"], ["--hang", "1", "--at", "0"])
    out, = finish_all([proc], timeout=85)
    _, error = check_caught(tmp_path, proc, workers, out, started)
    assert error.startswith("node 1: stuck start: no progress within 4s"), error  # the cause leads
    assert "not in init_process_group: rank 1 in sleep_forever (ddp_hang.py:" in error, error
    assert "node 0: stuck start" in error and "waiting: rank 0 in init_process_group (ddp_hang.py:" in error, error
    # + imports and meeting: 15 s on a quiet machine, 40 s and more at the suite's load 20 (the default
    # start timeout this catches early is 600 s)
    assert time.monotonic() - started < 4 + BOUND_S + 60, "the nodes did not stop together"


def test_a_stuck_start_on_node_0_is_named_across_machines(tmp_path):
    """Two node agents, own run directories, a rendezvous secret (the flag between them is signed);
    rank 0 (node 0, the head) never reaches init_process_group."""
    shutil.copy(SCRIPT, tmp_path / SCRIPT.name)
    port = free_port()
    procs = [start_launcher(["--nodes", "2", "--gpus", "1", "--node-rank", str(k), "--master-addr", "127.0.0.1",
                             "--master-port", str(port), f"output_dir={tmp_path / f'machine{k}'}",
                             f"watchdog.timeout_s={TIMEOUT_S}", "watchdog.start_timeout_s=4", *NO_WANDB, SCRIPT.name,
                             "--hang", "0", "--at", "0"], tmp_path, env={"LAUNCHER_RDZV_SECRET": "s3cret-for-this-test"})
             for k in (0, 1)]
    out0, out1 = finish_all(procs, timeout=85)
    assert [p.returncode for p in procs] == [1, 1], out0 + out1
    summary = read_summary(only_run_dir(tmp_path / "machine0"))
    assert summary["status"] == "hung", summary
    error = summary["error"]
    assert error.startswith("node 0: stuck start") and "not in init_process_group: rank 0 in sleep_forever (ddp_hang.py:" in error, error
    assert "node 1: stuck start" in error and "waiting: rank 1 in init_process_group (ddp_hang.py:" in error, error
    assert error in out0
    # each machine's ranks' stacks in its own run directory
    assert "most recent call first" in (only_run_dir(tmp_path / "machine1") / "stacks" / "rank-1.txt").read_text()
    assert_node0_dumped(only_run_dir(tmp_path / "machine0"))


def test_steps_slower_than_the_timeout_are_not_a_hang(tmp_path):
    # steps of 3 s against a timeout of 2 s; after the first step, two more are judged (4 steps of 4 s took 7 s more)
    proc, _ = launch(tmp_path, ["--gpus", "2", "watchdog.timeout_s=2"], ["--steps", "3", "--step-s", "3"])
    out, = finish_all([proc], timeout=75)
    assert proc.returncode == 0, out
    assert read_summary(only_run_dir(tmp_path / "runs"))["status"] == "completed"
