"""`python -m launcher sweep`: the grid as ordinary runs of one sweep folder, here (a queue) and on SLURM
(one job array), a failing member, Ctrl-C, `resume SWEEP`, and bad input that leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import psutil
import pytest

from launcher.commands.sweep_plan import expand, is_grid_item, member_argv, member_name, parse_grid, read_list
from launcher.errors import ConfigError
from tests.helpers import (QUICK, QUIET, descendants, kill_group, read_summary, run_launcher, slurm_unavailable,
                           start_launcher, wait_gone)

# A tiny member: records what it got and when it ran; fails on purpose as member m003 (trainer.lr=0.2,
# seed=2: its run id says so) while the file named by its last argument exists (so a test can "fix" it).
SCRIPT = """
import json, os, sys, time
run_dir = os.environ["LAUNCHER_RUN_DIR"]
start = time.time()
time.sleep(1.0)
record = {"name": os.path.basename(run_dir), "args": sys.argv[1:], "start": start, "end": time.time()}
json.dump(record, open(os.path.join(run_dir, "member.json"), "w"))
if record["name"] == "m003-lr=0.2-seed=2" and os.path.exists(sys.argv[-1]):
    sys.exit("this member fails on purpose")
"""


def sweep_json(sweep_dir: Path) -> Dict[str, Any]:
    return json.loads((sweep_dir / "sweep.json").read_text())


def statuses(sweep_dir: Path) -> Dict[str, str]:
    return {m["run_dir"]: m["status"] for m in sweep_json(sweep_dir)["members"]}


# ---- units: what a sweep runs -------------------------------------------------------------------

def test_a_grid_expands_to_every_combination_with_readable_names():
    members = expand(parse_grid(["trainer.lr=0.1,0.01", "data.batch_size=32,64"]), None)
    assert members == [{"trainer.lr": "0.1", "data.batch_size": "32"}, {"trainer.lr": "0.1", "data.batch_size": "64"},
                       {"trainer.lr": "0.01", "data.batch_size": "32"}, {"trainer.lr": "0.01", "data.batch_size": "64"}]
    keys = ["trainer.lr", "data.batch_size"]
    assert member_name(3, members[3], keys) == "m003-lr=0.01-batch_size=64"
    assert member_name(0, {"checkpoint.dir": "/a b/c"}, ["checkpoint.dir"]) == "m000-dir=_a_b_c"
    # the same last part under two sections: the full key keeps the names apart
    assert member_name(1, {"a.lr": "1", "b.lr": "2"}, ["a.lr", "b.lr"]) == "m001-a.lr=1-b.lr=2"


def test_which_items_are_swept():
    assert is_grid_item("trainer.lr=0.1,0.2")
    assert not is_grid_item("trainer.lr=0.1")
    assert not is_grid_item("slurm.extra={a: 1, b: 2}") and not is_grid_item("x=[1,2]")
    assert not is_grid_item("--gpus")


def test_a_list_file_gives_one_member_per_line(tmp_path):
    listed = tmp_path / "members.txt"
    listed.write_text("# lr and seed\ntrainer.lr=0.1 seed=1\n\ntrainer.lr=0.2  # second\n")
    members = expand(parse_grid(["data.batch_size=8,16"]), read_list(str(listed)))
    assert members == [{"trainer.lr": "0.1", "seed": "1", "data.batch_size": "8"},
                       {"trainer.lr": "0.1", "seed": "1", "data.batch_size": "16"},
                       {"trainer.lr": "0.2", "data.batch_size": "8"}, {"trainer.lr": "0.2", "data.batch_size": "16"}]
    listed.write_text("trainer.lr\n")
    with pytest.raises(ConfigError, match="line 1: 'trainer.lr' is not key=value"):
        read_list(str(listed))


def test_a_member_command_puts_its_items_before_a_module_and_its_folder_last():
    member = {"overrides": {"trainer.lr": "0.1"}, "run_dir": "m000-lr=0.1"}
    argv = member_argv((["--gpus", "2", "--output-dir", "x", "-m", "pkg.train"], ["--epochs", "3"]), member, Path("/s"))
    assert argv == ["--gpus", "2", "--output-dir", "x", "trainer.lr=0.1", "run_id=m000-lr=0.1", "--output-dir", "/s",
                    "-m", "pkg.train", "--epochs", "3"]


# ---- bad input: one line, exit 2, nothing made --------------------------------------------------

BAD = [
    (["trainer.lr=0.1,", "seed=1,2"], "trainer.lr=0.1, has an empty value"),
    (["trainer.lr=0.1,0.2", "no_such.key=1,2"], "unknown config key 'no_such'"),
    (["trainer.lr=0.1,0.2", "--parallel", "0"], "--parallel 0: run at least one member at a time"),
    (["trainer.lr=0.1,-1"], "member m001-lr=-1: trainer.lr=-1.0 must be positive"),
    (["seed=1"], "nothing to sweep"),
    (["seed=1,2", "seed=3,4"], "seed is swept twice"),
    (["seed=1,2", "--list", "/no/such/file"], "--list /no/such/file: cannot read it"),
    (["seed=1,2", "--wait"], "--wait follows a SLURM job array"),
    (["seed=1,2,3", "--list", "LIST3", "--max-members", "8"], "9 members is more than --max-members 8"),
]


def test_a_sweep_over_the_cap_is_refused_at_once_and_the_option_raises_the_cap(tmp_path):
    """Over the cap (1,000 by default) a sweep is refused before any member is expanded or its config checked:
    5,000 members took 75 s and printed nothing. --max-members takes a sweep over the cap: its members are checked
    and planned as any others."""
    before = os.times()
    result = run_launcher(["sweep", "--output-dir", str(tmp_path / "out"), f"seed={','.join(map(str, range(50)))}",
                           f"data.batch_size={','.join(map(str, range(1, 101)))}"], cwd=tmp_path, timeout=60)
    after = os.times()
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0] == ("error: sweep: 5,000 members is more than --max-members 1,000: sweep fewer values, or pass "
                        "--max-members 5000 to run them all")
    cpu_s = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    assert cpu_s < 10, f"the refusal took {cpu_s:.1f} CPU-s: it checked members first"  # checking them all: ~75
    result = run_launcher(["sweep", "--dry-run", "--output-dir", str(tmp_path / "out"), "seed=1,2,3", "trainer.lr=0.1,0.2",
                           "--max-members", "5"], cwd=tmp_path, timeout=60)
    assert result.returncode == 2 and "6 members is more than --max-members 5" in result.stderr, result.stderr
    allowed = run_launcher(["sweep", "--dry-run", "--output-dir", str(tmp_path / "out"), "seed=1,2,3",
                            "trainer.lr=0.1,0.2", "--max-members", "6"], cwd=tmp_path, timeout=60)
    assert allowed.returncode == 0, allowed.stderr
    assert len([line for line in allowed.stdout.splitlines() if line.startswith("python -m launcher")]) == 6
    assert "--max-members" not in allowed.stdout  # the sweep's own option, not its members'
    assert not (tmp_path / "out").exists()


def test_a_long_check_of_the_members_says_how_far_it_is(tmp_path, monkeypatch, capsys):
    """Checking each member's config (~15 ms each: 15 s for 1,000) prints how far it is every PROGRESS_S."""
    from launcher.commands import sweep as sweep_command

    monkeypatch.setattr(sweep_command, "PROGRESS_S", 0.0)
    request = sweep_command.parse_request(["--output-dir", str(tmp_path), *QUICK, "seed=1,2,3"])
    sweep = sweep_command.new_sweep("s", time.time(), "local", request.keys, request.base_args, request.members)
    assert len(sweep_command.check_members(sweep, tmp_path / "s")) == 3
    err = capsys.readouterr().err.splitlines()
    assert err == [f"sweep: checking the members' configs: {k}/3" for k in range(3)], err


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_bad_input_is_one_line_exit_2_and_no_sweep_folder(tmp_path):
    (tmp_path / "LIST3").write_text("trainer.lr=0.1\ntrainer.lr=0.2\ntrainer.lr=0.3\n")
    for args, expected in BAD:
        result = run_launcher(["sweep", "--output-dir", str(tmp_path / "out"), *QUICK, *args], cwd=tmp_path, timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (args, result.stderr)
        assert "Traceback" not in result.stderr
        assert not (tmp_path / "out").exists(), args


# ---- real runs here -----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_local_sweep_with_a_failing_member_then_resume_reruns_only_that_member(tmp_path):
    script = tmp_path / "member.py"
    script.write_text(SCRIPT)
    flag = tmp_path / "fail-now"
    flag.write_text("")
    out = tmp_path / "runs"
    args = ["sweep", "trainer.lr=0.1,0.2", "seed=1,2", "--parallel", "2", "--name", "grid", "--output-dir", str(out),
            str(script), "--tag", "x", str(flag)]
    result = run_launcher(args, cwd=tmp_path, timeout=300)
    sweep_dir = out / "grid"
    assert result.returncode == 1, result.stderr[-3000:]  # one member failed: the sweep says so
    assert statuses(sweep_dir) == {"m000-lr=0.1-seed=1": "completed", "m001-lr=0.1-seed=2": "completed",
                                   "m002-lr=0.2-seed=1": "completed", "m003-lr=0.2-seed=2": "failed"}
    record = sweep_json(sweep_dir)
    assert record["kind"] == "sweep" and record["sweep_id"] == "grid" and record["cluster"] == "local"
    assert record["keys"] == ["trainer.lr", "seed"] and record["members"][3]["overrides"] == {"trainer.lr": "0.2", "seed": "2"}
    assert "sweep: m003-lr=0.2-seed=2 failed" in result.stderr and "3/4 members completed" in result.stderr
    assert "this member fails on purpose" in (sweep_dir / "logs" / "m003-lr=0.2-seed=2.log").read_text()
    table = result.stdout.splitlines()
    assert table[0].split() == ["member", "trainer.lr", "seed", "status", "final_loss", "samples/s"]
    assert table[4].split() == ["m003", "0.2", "2", "failed"]
    ran = {m["run_dir"]: json.loads((sweep_dir / m["run_dir"] / "member.json").read_text()) for m in record["members"]}
    assert [r["name"] for r in ran.values()] == list(ran)
    assert all(r["args"] == ["--tag", "x", str(flag)] for r in ran.values())  # the script's own arguments
    # never more than --parallel members at once
    for r in ran.values():
        assert sum(o["start"] <= r["start"] < o["end"] for o in ran.values()) <= 2
    for name, status in statuses(sweep_dir).items():
        assert read_summary(sweep_dir / name)["status"] == status

    done = {name: (sweep_dir / name / "summary.json").stat().st_mtime for name in list(ran)[:3]}
    flag.unlink()  # "fixed": the failed member will pass now
    resumed = run_launcher(["resume", str(sweep_dir)], cwd=tmp_path, timeout=200)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "re-running 1 of 4 members: m003-lr=0.2-seed=2" in resumed.stderr
    assert set(statuses(sweep_dir).values()) == {"completed"}
    assert {name: (sweep_dir / name / "summary.json").stat().st_mtime for name in done} == done  # not run again
    assert read_summary(sweep_dir / "m003-lr=0.2-seed=2")["status"] == "completed"
    assert read_summary(sweep_dir / "previous" / "m003-lr=0.2-seed=2-1")["status"] == "failed"  # the failed attempt, kept
    again = run_launcher(["resume", str(sweep_dir)], cwd=tmp_path, timeout=60)
    assert again.returncode == 0 and "no member to re-run" in again.stdout
    # `ls` shows the sweep as one row with its members and the varied keys
    (row,) = ls_rows(out, tmp_path)
    assert row["kind"] == "sweep" and row["run_id"] == "grid" and row["status"] == "completed"
    assert row["keys"] == ["trainer.lr", "seed"] and (row["step"], row["steps"]) == (4, 4)
    assert [(m["run_id"], m["overrides"], m["status"]) for m in row["members"]] == [
        (m["run_dir"], m["overrides"], "completed") for m in record["members"]]


def parents_and_cores(procs: List[psutil.Process]) -> Dict[psutil.Process, Tuple[int, Set[int]]]:
    """Each process's parent and allowed cores, those that have ended left out: a member launcher's short-lived
    helper (such as the `git` it runs for provenance) can end between listing the tree and reading it."""
    found = {}
    for p in procs:
        try:
            found[p] = (p.ppid(), set(p.cpu_affinity()))
        except psutil.Error:
            continue
    return found


def ls_rows(output_dir: Path, cwd: Path) -> List[Dict[str, Any]]:
    listed = run_launcher(["ls", str(output_dir), "--json"], cwd=cwd, timeout=60)
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


STEPS = 100  # a member's job; each resumed step costs ~8 CPU-ms on a loaded machine (1000 steps: ~24 CPU-s)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ctrl_c_stops_the_running_members_cleanly_and_resume_continues_them_from_their_checkpoints(tmp_path):
    out = tmp_path / "runs"
    # From step 11 on each member sleeps a second a step (LAUNCHER_INJECT_FAULT's action=slow, attempt 0 only), so
    # both are still running when Ctrl-C comes however loaded the machine is, without computing (a 512-wide model's
    # 1000 steps cost ~45 CPU-s here); `resume` below runs without it, the rest of STEPS at full speed.
    proc = start_launcher(["sweep", "seed=1,2,3", "--parallel", "2", "--name", "long", "--output-dir", str(out),
                           *QUIET, f"trainer.steps={STEPS}", "trainer.log_every=10"], cwd=tmp_path,
                          env={"LAUNCHER_INJECT_FAULT": "rank=0,step=11,action=slow"})
    sweep_dir = out / "long"
    logs = [sweep_dir / name / "logs" / "rank-0.log" for name in ("m000-seed=1", "m001-seed=2")]
    try:
        deadline = time.monotonic() + 150
        while not all(p.is_file() and "step 10/" in p.read_text(errors="replace") for p in logs):
            assert proc.poll() is None and time.monotonic() < deadline, "the first two members did not start training"
            time.sleep(0.5)
        members = descendants(proc.pid)
        alive = parents_and_cores(members)
        launchers = [p for p, (parent, _) in alive.items() if parent == proc.pid]
        assert len(launchers) == 2  # two member launchers, the third waits
        # each on its own share of the cores, its workers too: N members x all cores of threads once spun 65x slower
        cores = [alive[p][1] for p in launchers]
        assert not cores[0] & cores[1] and cores[0] | cores[1] == set(os.sched_getaffinity(0)), cores
        assert all(mine <= cores[0] | cores[1] for _, mine in alive.values())
        (row,) = ls_rows(out, tmp_path)  # live: the sweep's runner holds it, two members run
        assert row["kind"] == "sweep" and row["status"] == "running"
        assert [m["status"] for m in row["members"]][:2] == ["running", "running"]
        os.kill(proc.pid, signal.SIGINT)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            kill_group(proc)
            proc.communicate()
    assert proc.returncode == 130, output[-3000:]
    assert wait_gone(members, 10) == [], "member processes outlived the sweep"
    assert statuses(sweep_dir) == {"m000-seed=1": "pending", "m001-seed=2": "pending", "m002-seed=3": "pending"}
    assert read_summary(sweep_dir / "m000-seed=1")["status"] == "interrupted"
    assert not (sweep_dir / "m002-seed=3").exists()  # never started
    assert f"python -m launcher resume {sweep_dir}" in output
    (row,) = ls_rows(out, tmp_path)
    assert row["status"] != "running" and row["command"] == f"python -m launcher resume {sweep_dir}"
    dry = run_launcher(["resume", str(sweep_dir), "--dry-run"], cwd=tmp_path, timeout=60)
    assert dry.returncode == 0 and "would re-run 3 of 3 members" in dry.stdout
    assert "m000-seed=1 (from step " in dry.stdout and "m002-seed=3" in dry.stdout
    # the two stopped members continue from the checkpoint Ctrl-C made; the third starts
    resumed = run_launcher(["resume", str(sweep_dir)], cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert set(statuses(sweep_dir).values()) == {"completed"}
    for name in ("m000-seed=1", "m001-seed=2"):
        summary = read_summary(sweep_dir / name)
        assert summary["steps"] == STEPS and 10 <= summary["resumed_from_step"] < STEPS, summary
    assert read_summary(sweep_dir / "m002-seed=3").get("resumed_from_step") in (None, 0)
    assert not (sweep_dir / "previous").exists()  # nothing had to start afresh


def test_members_at_once_get_slices_of_the_cores_as_even_as_they_go():
    from launcher.commands.sweep_cores import core_slices

    assert core_slices([0, 1], 2) == [[0], [1]]
    assert core_slices(list(range(8)), 3) == [[0, 1], [2, 3, 4], [5, 6, 7]]
    assert core_slices([0, 1], 3) == [[0], [1], [0]]  # more members than cores: they share, round-robin


# ---- SLURM: one job array -----------------------------------------------------------------------

@pytest.fixture
def slurm_out(tmp_path):
    """The output dir of a SLURM sweep test; every array it submitted is cancelled afterwards."""
    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    yield tmp_path
    for record in tmp_path.glob("*/sweep.json"):
        job = json.loads(record.read_text()).get("slurm_job_id")
        if job:
            subprocess.run(["scancel", str(job)], capture_output=True, timeout=30)


def sacct_tasks(array_id: str) -> List[str]:
    out = subprocess.run(["sacct", "-j", array_id, "-X", "-n", "-P", "-o", "JobID,State"], capture_output=True,
                         text=True, timeout=30).stdout
    return sorted(line for line in out.splitlines() if line.strip())


@pytest.mark.slurm
@pytest.mark.timeout(540)
def test_a_slurm_sweep_is_one_job_array_and_a_failing_member_does_not_stop_the_others(slurm_out):
    listed = slurm_out / "members.txt"
    # two lines x two seeds: two members that complete, two that fail (a checkpoint dir that cannot be made)
    listed.write_text("trainer.lr=0.01\ntrainer.lr=0.03 checkpoint.dir=/dev/null/ckpt\n")
    env = {"SLURM_CONF": os.environ["SLURM_CONF"]}
    result = run_launcher(["sweep", "--cluster", "slurm", "--list", str(listed), "seed=1,2", "--parallel", "2", "--wait",
                           "--name", "arr", "--output-dir", str(slurm_out), *QUIET, "trainer.steps=10",
                           "slurm.time_min=5"], cwd=slurm_out, timeout=300, env=env)
    sweep_dir = slurm_out / "arr"
    assert result.returncode == 1, result.stderr[-3000:]
    record = sweep_json(sweep_dir)
    array_id = record["slurm_job_id"]
    assert record["cluster"] == "slurm" and f"submitted SLURM job array {array_id}: 4 members, 2 at a time" in result.stdout
    # one array, at most --parallel tasks at once, one task per member
    assert "#SBATCH --array=0-3%2" in (sweep_dir / "slurm" / f"{array_id}_submission.sh").read_text()
    assert [t.split("|")[0] for t in sacct_tasks(array_id)] == [f"{array_id}_{i}" for i in range(4)]
    assert [m["status"] for m in record["members"]] == ["completed"] * 2 + ["failed"] * 2
    assert [m["job_id"] for m in record["members"]] == [f"{array_id}_{i}" for i in range(4)]
    for member in record["members"]:
        run_dir = sweep_dir / member["run_dir"]
        assert json.loads((run_dir / "job.json").read_text())["job_id"] == member["job_id"]
        summary = read_summary(run_dir)
        assert summary["status"] == member["status"] and summary["world_size"] == 1
    assert read_summary(sweep_dir / "m000-lr=0.01-seed=1")["steps"] == 10
    # a member is an ordinary SLURM run: status and logs work on it
    status = run_launcher(["status", str(sweep_dir / "m002-lr=0.03-seed=1-dir=_dev_null_ckpt")], cwd=slurm_out,
                          timeout=60, env=env)
    assert status.returncode == 1 and "NotADirectoryError" in status.stdout
    # the rendezvous secret went through the environment, never into the folder
    for path in sweep_dir.rglob("*"):
        if path.is_file() and path.suffix in (".sh", ".json", ".yaml", ".out"):
            assert "RDZV_SECRET=" not in path.read_text(errors="replace"), path
    # resume submits the two failed members again, as a new array of two
    resumed = run_launcher(["resume", str(sweep_dir)], cwd=slurm_out, timeout=120, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = sweep_json(sweep_dir)
    new_id = again["slurm_job_id"]
    assert new_id != array_id and f"submitted SLURM job array {new_id}: 2 members" in resumed.stdout
    assert [m["job_id"] for m in again["members"]] == [f"{array_id}_{i}" for i in range(2)] + [f"{new_id}_0", f"{new_id}_1"]
    deadline = time.monotonic() + 150
    while not all(t.split("|")[1] in ("COMPLETED", "FAILED", "CANCELLED") for t in sacct_tasks(new_id) or ["x|PENDING"]):
        assert time.monotonic() < deadline, sacct_tasks(new_id)
        time.sleep(2)
    assert len(sacct_tasks(new_id)) == 2
    assert (sweep_dir / "previous" / "m002-lr=0.03-seed=1-dir=_dev_null_ckpt-1" / "job.json").is_file()
    assert read_summary(sweep_dir / "m002-lr=0.03-seed=1-dir=_dev_null_ckpt")["status"] == "failed"  # still a bad dir

