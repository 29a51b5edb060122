"""Multi-node mistakes fail fast with a message that names the problem, and never hang.

Each case is bounded: the launcher must finish within the timeout given (a short --rdzv-timeout),
or the test kills it and fails.
"""

import socket

import pytest

from tests.helpers import QUICK, descendants, finish_all, free_port, run_launcher, start_launcher, wait_gone

pytestmark = pytest.mark.timeout(120)
TWO = ["--nodes", "2", "--gpus", "1", "trainer.steps=4", *QUICK]


def static(rank, port, *extra):
    return ["--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port), *extra]


def test_usage_mistakes_exit_2_with_a_hint_and_start_nothing(tmp_path):
    out = tmp_path / "runs"
    with socket.socket() as held:  # something else holds node 0's port
        held.bind(("", 0))
        held.listen()
        busy = held.getsockname()[1]
        cases = [
            (["--node-rank", "2", "--master-addr", "127.0.0.1"], "--node-rank 2 is outside 0..1 for --nodes 2"),
            (["--node-rank", "-1", "--master-addr", "127.0.0.1"], "--node-rank -1 is outside 0..1"),
            (static(0, 70000), "--master-port 70000 is outside 1..65535"),
            (["--rdzv-endpoint", "127.0.0.1:0"], "port 0 (a free port) is for one node"),
            (["--rdzv-endpoint", "nocolon"], "is not HOST:PORT"),
            (["--node-rank", "1"], "needs --master-addr HOST"),
            (["--node-rank", "1", "--master-addr", "no-such-host.invalid"], "--master-addr no-such-host.invalid does not resolve"),
            (static(0, busy), f"port {busy} is already in use on this machine"),
        ]
        for argv, words in cases:
            result = run_launcher([*TWO, f"output_dir={out}", *argv], cwd=tmp_path, timeout=30)
            lines = result.stderr.strip().splitlines()
            assert result.returncode == 2, (argv, result.stderr)
            assert len(lines) == 1 and words in lines[0], (argv, result.stderr)
            assert not out.exists(), f"{argv} created a run directory"


def test_a_head_that_never_answers_gives_up_after_the_rdzv_timeout(tmp_path):
    port = free_port()  # nothing listens there
    proc = start_launcher([*TWO, f"output_dir={tmp_path}", *static(1, port, "--rdzv-timeout", "3")], tmp_path)
    workers = descendants(proc.pid)
    out, = finish_all([proc], timeout=40)
    assert proc.returncode == 1, out
    error = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(error) == 1, out
    for words in (f"no answer from 127.0.0.1 port {port} within 3s", "firewall", "--node-rank 0"):
        assert words in error[0]
    assert "Traceback" not in out and "frame #" not in out  # c10d's C++ retries stay in the log file
    assert wait_gone(workers, timeout=5) == []


def run_nodes(tmp_path, node_args, timeout=60):
    procs = [start_launcher([f"output_dir={tmp_path}", "trainer.steps=4", *QUICK, *a], tmp_path) for a in node_args]
    return procs, finish_all(procs, timeout=timeout)


def test_nodes_started_with_different_gpus_are_told_which_and_how(tmp_path):
    port = free_port()
    procs, outs = run_nodes(tmp_path, [
        ["--nodes", "2", "--gpus", "2", *static(0, port, "--rdzv-timeout", "20")],
        ["--nodes", "2", "--gpus", "1", *static(1, port, "--rdzv-timeout", "20")],
    ])
    assert [p.returncode for p in procs] == [2, 2], outs
    for out in outs:
        assert "node settings differ" in out and "--nodes 2 --gpus 2" in out and "--nodes 2 --gpus 1" in out, out
        assert "start every node with the same --nodes and --gpus" in out


def test_nodes_started_with_different_nodes_under_c10d(tmp_path):
    port = free_port()
    endpoint = ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "20"]
    procs, outs = run_nodes(tmp_path, [["--nodes", "2", "--gpus", "1", *endpoint], ["--nodes", "3", "--gpus", "1", *endpoint]])
    assert [p.returncode for p in procs] == [2, 2], outs
    assert all("--nodes 2" in out and "--nodes 3" in out for out in outs), outs


def test_two_nodes_with_the_same_node_rank_are_named(tmp_path):
    # nodes 0, 1 and 1 of 3: before the job can start, every node learns which rank is taken twice
    port = free_port()
    three = ["--nodes", "3", "--gpus", "1", "--rdzv-timeout", "20"]
    procs, outs = run_nodes(tmp_path, [[*three, *static(k, port)] for k in (0, 1, 1)])
    assert [p.returncode for p in procs] == [2, 2, 2], outs
    assert all("two nodes use --node-rank 1" in out for out in outs), outs
    assert all("give each machine its own --node-rank" in out for out in outs), outs


def test_a_lone_c10d_host_names_how_many_nodes_came(tmp_path):
    port = free_port()
    argv = [*TWO, f"output_dir={tmp_path}", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "3"]
    result = run_launcher(argv, cwd=tmp_path, timeout=40)
    assert result.returncode == 1, result.stderr
    assert f"only 1 of 2 nodes reached 127.0.0.1:{port} within 3s" in result.stderr
