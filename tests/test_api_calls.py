"""launcher.launch/submit's .call-* folders (the pickled call and its key, beside the run directories): a caller
killed with SIGKILL used to leave its folder forever; the next launch from the same output folder removes it, and
never one whose caller, child launcher or run still goes on (launcher/api/calls.py). Real callers, real kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import kill_group, launcher_env, run_bounded

pytestmark = pytest.mark.timeout(300)
CALLER = """
import sys, time
import launcher

def nap(seconds):
    time.sleep(seconds)
    return seconds

print(launcher.launch(nap, float(sys.argv[2]), gpus=1, output_dir=sys.argv[1], wandb_mode="disabled"))
"""


def caller(tmp_path: Path) -> Path:
    path = tmp_path / "caller.py"
    path.write_text(CALLER)
    return path


def calls_in(out: Path):
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".call-"))


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout}s"
        time.sleep(0.2)


def test_a_killed_callers_call_folder_is_removed_by_the_next_launch_from_that_folder(tmp_path):
    out = tmp_path / "runs"
    first = subprocess.Popen([sys.executable, str(caller(tmp_path)), str(out), "4"], cwd=tmp_path, env=launcher_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for(lambda: out.is_dir() and any((p / "plan.json").is_file() for p in out.iterdir()), 120,
                 "the first call's run")
        os.kill(first.pid, signal.SIGKILL)  # the caller only: its launcher, in a session of its own, goes on
        first.wait(timeout=30)
        [run_dir] = [p for p in out.iterdir() if not p.name.startswith(".")]
        wait_for(lambda: (run_dir / "summary.json").is_file(), 120, "the orphaned run's end")
    finally:
        kill_group(first)
    [left] = calls_in(out)
    assert left.startswith(f".call-{run_dir.name}-") and (out / left / "call.pkl").is_file()
    second = run_bounded([sys.executable, str(caller(tmp_path)), str(out), "0"], tmp_path, timeout=150)
    assert second.returncode == 0 and second.stdout.strip().endswith("[0.0]"), second.stdout + second.stderr
    assert calls_in(out) == [], "the killed caller's folder (or the second call's own) is still there"
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


def test_a_call_folder_is_kept_while_its_caller_or_launcher_lives_or_it_is_not_ours(tmp_path):
    """Units over real folders and processes: a live caller, a live child launcher, a dead pair, a folder being made,
    a link, another user's folder."""
    from launcher.api import calls

    out = tmp_path / "runs"
    out.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        mine = calls.make_folder(out, "r-mine")  # this process is its caller
        child = calls.make_folder(out, "r-child")
        (child / "owner.json").write_text(json.dumps([{"pid": gone.pid, "started": None},
                                                       {"pid": alive.pid, "started": None}]))
        dead = calls.make_folder(out, "r-dead")
        (dead / "owner.json").write_text(json.dumps([{"pid": gone.pid, "started": None}]))
        reused = calls.make_folder(out, "r-reused")  # a pid taken since by another process: gone all the same
        (reused / "owner.json").write_text(json.dumps([{"pid": os.getpid(), "started": 1.0}]))
        young = calls.make_folder(out, "r-young")
        (young / "owner.json").unlink()  # as its caller makes it: no owner record yet
        (out / ".call-r-link-abc").symlink_to(dead)
        removed = calls.remove_abandoned(out)
        assert sorted(p.name for p in removed) == sorted([dead.name, reused.name])
        assert calls_in(out) == sorted([mine.name, child.name, young.name, ".call-r-link-abc"])
        os.utime(young, (time.time() - 120, time.time() - 120))  # a caller killed as it made it, long ago
        assert [p.name for p in calls.remove_abandoned(out)] == [young.name]
        if os.geteuid() == 0:  # another user's folder, whose owners are gone: never removed
            import pwd

            theirs = calls.make_folder(out, "r-theirs")
            (theirs / "owner.json").write_text(json.dumps([{"pid": gone.pid, "started": None}]))
            nobody = pwd.getpwnam("nobody").pw_uid
            os.chown(theirs, nobody, nobody)
            assert calls.remove_abandoned(out) == [] and theirs.is_dir()
    finally:
        alive.kill()
        alive.wait()
