"""`python -m launcher ls`: every run under an output directory, with a live status.

Real runs: a run seen as running while it runs and completed after, a failing script, a launcher
killed with SIGKILL seen as dead, the built-in trainer's progress and goodput. Synthetic run
directories (the files real runs leave) for a sweep, a resumed run that died, filters and bad input.
"""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import (QUIET, wait_while_running, free_port, group_processes, kill_group, launcher_env, run_launcher,
                           run_stamped, start_launcher, wait_gone)
from launcher.commands.ls import filter_rows, parse_since
from launcher.runindex import list_runs

WAITING_SCRIPT = """
import pathlib, sys, time
go = pathlib.Path(sys.argv[1])
print("waiting for", go, flush=True)
while not go.exists():
    time.sleep(0.05)
"""


def ls_json(root, *more):
    result = run_launcher(["ls", str(root), "--json", *more], cwd=root, timeout=60)
    assert result.returncode == 0, result.stderr
    return {row["run_id"]: row for row in json.loads(result.stdout)}


def started_script(tmp_path, run_id):
    script = tmp_path / "wait_for_go.py"
    script.write_text(WAITING_SCRIPT)
    go = tmp_path / f"go-{run_id}"
    proc = start_launcher(["--gpus", "1", f"output_dir={tmp_path / 'runs'}", f"run_id={run_id}", str(script), str(go)],
                          cwd=tmp_path)
    log = tmp_path / "runs" / run_id / "logs" / "rank-0.log"
    wait_while_running(lambda: log.is_file() and "waiting for" in log.read_text(), 120, proc, "the script to start")
    return proc, go


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_is_running_while_it_runs_then_completed_and_a_failing_script_is_failed(tmp_path):
    runs = tmp_path / "runs"
    proc, go = started_script(tmp_path, "live")
    try:
        rows = ls_json(runs)
        assert rows["live"]["status"] == "running" and rows["live"]["kind"] == "local"
        assert rows["live"]["command"].endswith("logs " + str(runs / "live") + " -f")
        assert rows["live"]["steps"] is None  # a script's own loop decides its length
        table = run_launcher(["ls", str(runs)], cwd=tmp_path, timeout=60).stdout
        assert "live" in table and "running" in table
        go.write_text("go")
        assert proc.wait(timeout=120) == 0
    finally:
        kill_group(proc)
    assert ls_json(runs)["live"]["status"] == "completed"

    failing = run_launcher(["--gpus", "2", f"output_dir={runs}", "run_id=boom",
                            str(os.path.join(os.path.dirname(__file__), "scripts", "fail_rank1.py"))], cwd=tmp_path, timeout=180)
    assert failing.returncode == 1, failing.stderr
    rows = ls_json(runs)
    assert rows["boom"]["status"] == "failed" and "boom" in (rows["boom"]["error"] or "")
    assert set(ls_json(runs, "--status", "failed")) == {"boom"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_launcher_killed_with_sigkill_is_dead_not_running(tmp_path):
    runs = tmp_path / "runs"
    proc, go = started_script(tmp_path, "killed")
    try:
        assert ls_json(runs)["killed"]["status"] == "running"
        os.kill(proc.pid, signal.SIGKILL)  # the launcher only: its workers follow by PR_SET_PDEATHSIG
        proc.wait(timeout=30)
        assert not wait_gone(group_processes(proc.pid), 60), "workers outlived their launcher"
        row = ls_json(runs)["killed"]
        assert row["status"] == "dead", row
        assert row["holders"] == []
    finally:
        kill_group(proc)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_built_in_trainer_shows_progress_throughput_and_goodput(tmp_path):
    runs = tmp_path / "runs"
    done = run_launcher(["--gpus", "1", f"output_dir={runs}", "run_id=quick", "trainer.steps=10", "trainer.log_every=5",
                         *QUIET], cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr
    row = ls_json(runs)["quick"]
    assert (row["status"], row["step"], row["steps"], row["kind"]) == ("completed", 10, 10, "local")
    assert row["throughput"] > 0 and 0 < row["goodput"] <= 1 and row["restarts"] == 0
    assert ls_json(runs, "--since", "1h") and ls_json(runs, "--since", "2000-01-01") and not ls_json(runs, "--status", "dead")


# Synthetic run directories: the files a run leaves, written by hand.

def make_run(run_dir, status=None, steps=100, step=None, mode="single", plan_after_summary=False):
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(f"nodes: 1\ngpus: 2\ntrainer:\n  strategy: ddp\n  steps: {steps}\n"
                                         f"  pipeline:\n    stages: 0\nscript:\n  path: null\n")
    (run_dir / "plan.json").write_text(json.dumps({"run_id": run_dir.name, "mode": mode, "world_size": 2}))
    if step is not None:
        lines = [json.dumps({"step": s, "samples_per_s": 100.0 + s}) for s in range(5, step + 1, 5)]
        (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n" + '{"step": 99')  # a line being written now
    if status:
        (run_dir / "summary.json").write_text(json.dumps({"status": status, "steps": steps, "samples_per_s": 500.0,
                                                          "goodput": 0.5, "restarts": 1, "model": "mlp"}))
    if plan_after_summary:
        later = time.time() + 5
        os.utime(run_dir / "plan.json", (later, later))


def test_statuses_from_the_files_a_run_leaves(tmp_path):
    make_run(tmp_path / "done", "completed", step=100)
    make_run(tmp_path / "hung", "hung", step=40)
    make_run(tmp_path / "stopped", "interrupted", step=40)
    make_run(tmp_path / "vanished", None, step=40, mode="simulated")
    make_run(tmp_path / "resumed-then-killed", "failed", step=60, plan_after_summary=True)
    (tmp_path / "not-a-run").mkdir()
    rows = {r["run_id"]: r for r in list_runs(tmp_path)}
    assert set(rows) == {"done", "hung", "stopped", "vanished", "resumed-then-killed"}
    assert rows["done"]["status"] == "completed" and rows["done"]["step"] == 100 and rows["done"]["steps"] == 100
    assert rows["hung"]["status"] == "failed" and rows["stopped"]["status"] == "interrupted"
    assert rows["vanished"]["status"] == "dead" and rows["vanished"]["kind"] == "simulated"
    assert rows["vanished"]["step"] == 40 and rows["vanished"]["throughput"] == 140.0  # the last whole line
    assert rows["resumed-then-killed"]["status"] == "dead"


def test_a_held_lock_means_running_even_over_an_old_summary(tmp_path):
    run_dir = tmp_path / "resumed"
    make_run(run_dir, "completed", step=50)
    (run_dir / "locks").mkdir()
    fd = os.open(run_dir / "locks" / "node-0.lock", os.O_RDWR | os.O_CREAT)
    try:
        os.write(fd, json.dumps({"host": "here", "pid": os.getpid(), "job": "single"}).encode())
        fcntl.flock(fd, fcntl.LOCK_EX)
        row = list_runs(tmp_path)[0]
        assert row["status"] == "running" and row["holders"] == [f"here:{os.getpid()}"]
    finally:
        os.close(fd)
    assert list_runs(tmp_path)[0]["status"] == "completed"


def test_a_sweep_is_one_row_with_its_members_and_varied_keys(tmp_path):
    sweep = tmp_path / "sweep-1"
    make_run(sweep / "m0", "completed", step=100)
    make_run(sweep / "m1", "failed", step=20)
    members = [{"index": 0, "overrides": {"trainer.lr": "0.1"}, "run_dir": "m0", "status": "completed"},
               {"index": 1, "overrides": {"trainer.lr": "0.2"}, "run_dir": "m1", "status": "failed"},
               {"index": 2, "overrides": {"trainer.lr": "0.3"}, "run_dir": "m2", "status": "pending"}]
    (sweep / "sweep.json").write_text(json.dumps({"kind": "sweep", "sweep_id": "sweep-1", "created": time.time(),
                                                  "cluster": "local", "keys": ["trainer.lr"], "base_args": [],
                                                  "members": members}))
    make_run(tmp_path / "solo", "completed")
    rows = {r["run_id"]: r for r in list_runs(tmp_path)}
    row = rows["sweep-1"]
    assert (row["kind"], row["status"], row["keys"], row["step"], row["steps"]) == ("sweep", "failed", ["trainer.lr"], 1, 3)
    assert [m["overrides"]["trainer.lr"] for m in row["members"]] == ["0.1", "0.2", "0.3"]
    assert [m["status"] for m in row["members"]] == ["completed", "failed", "unknown"]
    assert row["command"] == f"python -m launcher resume {sweep}"
    assert [r["run_id"] for r in list_runs(sweep)] == ["sweep-1"]  # ls SWEEP: the sweep alone
    only_failed = filter_rows(list(rows.values()), ["failed"], None)
    assert [r["run_id"] for r in only_failed] == ["sweep-1"]
    assert [m["run_id"] for m in only_failed[0]["members"]] == ["m0", "m1", "m2"]  # the sweep itself failed: all shown


def test_since_takes_durations_and_iso_dates():
    assert parse_since("2h", 10_000.0) == 10_000.0 - 7200
    assert parse_since("1d", 100_000.0) == 100_000.0 - 86400
    assert parse_since("2026-11-23T10:00+00:00", 0) == 1795428000.0


@pytest.mark.parametrize("argv, words", [
    (["ls", "/no/such/dir"], "no directory /no/such/dir"),
    (["ls", ".", "--status", "sleeping"], "--status sleeping: choose from"),
    (["ls", ".", "--since", "yesterday"], "--since yesterday: expected a duration"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, words):
    result = run_launcher(argv, cwd=tmp_path, timeout=60)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr
    assert list(tmp_path.iterdir()) == []


def read_loss(run_dir):
    from launcher.runtime.formatting import loss

    return loss(json.loads((run_dir / "summary.json").read_text())["final_loss"])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_comparison_is_one_row_with_its_strategy_runs_and_simulated_nodes_are_their_kind(tmp_path):
    """Also: compare says each strategy's run as it starts and as it ends (it said nothing for ~30 s a strategy)."""
    runs = tmp_path / "runs"
    code, lines, _ = run_stamped([sys.executable, "-m", "launcher", "compare", "--gpus", "1", "strategies=ddp,fsdp",
                                  f"output_dir={runs}", "run_id=cmp", "trainer.steps=5", *QUIET], tmp_path, 300)
    err = [(at, line) for at, stream, line in lines if stream == "err"]
    assert code == 0, err
    assert err[0][1].startswith("compare compare-cmp: 2 strategies (ddp, fsdp), one run at a time"), err
    for strategy in ("ddp", "fsdp"):
        started = next(at for at, line in err if line.startswith(f"compare: {strategy}: starting ("))
        ended = next(at for at, line in err if line.startswith(f"compare: {strategy}: completed in "))
        written = (runs / "compare-cmp" / "runs" / strategy / "summary.json").stat().st_mtime
        assert started < written <= ended, (started, written, ended)  # said before its run started, and once it ended
    assert next(line for _, line in err if line.startswith("compare: ddp: completed")).endswith(" samples/s, loss " +
        read_loss(runs / "compare-cmp" / "runs" / "ddp"))
    simulated = run_launcher(["--nodes", "2", "--gpus", "1", f"output_dir={runs}", "run_id=sim", "trainer.steps=5", *QUIET],
                             cwd=tmp_path, timeout=300)
    assert simulated.returncode == 0, simulated.stderr
    rows = ls_json(runs)
    assert set(rows) == {"compare-cmp", "sim"}
    group = rows["compare-cmp"]
    assert (group["kind"], group["status"], group["keys"], group["step"], group["steps"]) == \
        ("compare", "completed", ["trainer.strategy"], 2, 2)
    assert [(m["run_id"], m["overrides"], m["status"]) for m in group["members"]] == \
        [("ddp", {"trainer.strategy": "ddp"}, "completed"), ("fsdp", {"trainer.strategy": "fsdp"}, "completed")]
    assert (rows["sim"]["kind"], rows["sim"]["status"], rows["sim"]["world_size"]) == ("simulated", "completed", 2)
    table = run_launcher(["ls", str(runs)], cwd=tmp_path, timeout=60).stdout
    assert "  ddp [trainer.strategy=ddp]" in table and "2 run(s): 2 completed" in table


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path):
    for i in range(200):
        make_run(tmp_path / f"r{i:03d}", "completed", step=10)
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "ls", str(tmp_path), "--json"], cwd=tmp_path,
                            env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline() == b"[\n"
        proc.stdout.close()  # like `ls --json | head -1`
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=60) == 0 and "Traceback" not in err, err
    finally:
        kill_group(proc)


def test_a_node_whose_summary_another_node_wrote_ends_as_its_node_record_says(tmp_path):
    run_dir = tmp_path / "node1-of-2"
    make_run(run_dir, None, step=20, mode="static")  # no summary.json here: node 0 wrote it on its own machine
    (run_dir / "nodes").mkdir()
    (run_dir / "nodes" / "node-1.json").write_text(json.dumps({"status": "completed", "node_rank": 1}))
    row = list_runs(tmp_path)[0]
    assert (row["kind"], row["status"]) == ("multinode", "completed")


def test_ls_of_one_run_or_one_comparison_folder_lists_just_that(tmp_path):
    group = tmp_path / "compare-x"
    make_run(group / "runs" / "ddp", "completed", step=100)
    make_run(group / "runs" / "fsdp", "failed", step=10)
    (group / "logs").mkdir()
    (group / "compare.json").write_text("{}")
    rows = list_runs(group)
    assert [(r["run_id"], r["kind"], r["status"]) for r in rows] == [("compare-x", "compare", "completed")]
    assert [(m["run_id"], m["status"]) for m in rows[0]["members"]] == [("ddp", "completed"), ("fsdp", "failed")]
    assert [r["run_id"] for r in list_runs(group / "runs" / "fsdp")] == ["fsdp"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_node_launchers_on_one_run_are_one_multinode_row_running_then_completed(tmp_path):
    runs, port, script, go = tmp_path / "runs", free_port(), tmp_path / "wait_for_go.py", tmp_path / "go"
    script.write_text(WAITING_SCRIPT)
    common = ["--nodes", "2", "--gpus", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
              f"output_dir={runs}", "run_id=mn", str(script), str(go)]
    nodes = [start_launcher(["--node-rank", str(rank), *common], cwd=tmp_path) for rank in (0, 1)]
    try:
        logs = [runs / "mn" / "logs" / f"rank-{rank}.log" for rank in (0, 1)]
        wait_while_running(lambda: all(log.is_file() and "waiting for" in log.read_text() for log in logs), 180, nodes[0],
                   "both ranks to start")
        row = ls_json(runs)["mn"]
        assert (row["kind"], row["status"], len(row["holders"])) == ("multinode", "running", 2)
        go.write_text("go")
        assert [node.wait(timeout=120) for node in nodes] == [0, 0]
    finally:
        for node in nodes:
            kill_group(node)
    row = ls_json(runs)["mn"]
    assert (row["kind"], row["status"], row["world_size"], row["holders"]) == ("multinode", "completed", 2, [])


def damaged_runs(root):
    """A finished run beside runs whose files cannot be read: config.yaml not UTF-8, a summary field of a wrong type."""
    for name in ("good", "not-utf8", "wrong-type"):
        (root / name).mkdir(parents=True)
        (root / name / "config.yaml").write_text("trainer:\n  steps: 5\n")
        (root / name / "plan.json").write_text("{}\n")
        (root / name / "summary.json").write_text(json.dumps({"status": "completed", "steps": 5}) + "\n")
    (root / "not-utf8" / "config.yaml").write_bytes(b"\xff\xfe trainer")
    (root / "wrong-type" / "summary.json").write_text(json.dumps({"status": "completed", "restarts": "many"}) + "\n")


@pytest.mark.timeout(120)
def test_a_damaged_run_is_shown_damaged_and_the_rest_listed(tmp_path):
    damaged_runs(tmp_path / "runs")
    result = run_launcher(["ls", str(tmp_path / "runs")], cwd=tmp_path, timeout=60)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert "damaged: UnicodeDecodeError" in result.stdout and "damaged: ValueError" in result.stdout, result.stdout
    assert "3 run(s): 1 completed, 2 damaged" in result.stdout, result.stdout
    # the board's list is the same index
    from launcher.board.runlist import board_runs
    rows = {r["run_id"]: r for r in board_runs(tmp_path / "runs")}
    assert rows["good"]["status"] == "completed"
    assert rows["not-utf8"]["status"] == rows["wrong-type"]["status"] == "damaged"
    assert rows["not-utf8"]["error"].startswith("damaged: UnicodeDecodeError")
