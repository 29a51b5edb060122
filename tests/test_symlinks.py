"""No write or read through a link the launcher did not make (docs/security.md): a symlink planted in a run
directory (by anyone who can write the output folder) is refused in one line, exit 2, and what it points to
is unchanged; the board never serves a file through one; a planted checkpoint temp is cleared and the save
goes on. Real launcher runs, a real board, and a second real user where the tests run as root.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests.board_helpers import board, get
from tests.helpers import QUICK, QUIET, communicate_bounded, kill_group, run_bounded, run_launcher, start_launcher

pytestmark = pytest.mark.timeout(180)
WHY = "a symlink the launcher did not make"
VICTIM_TEXT = b"the victim's own bytes\n"


def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM_TEXT)
    return path


def quick_run(out: Path, run_id: str, *extra: str, wandb: bool = False) -> subprocess.CompletedProcess:
    """A 4-step run; W&B's offline run (~3 CPU-s) only where W&B's own links are what the test checks."""
    return run_launcher(["--gpus", "1", f"output_dir={out}", f"run_id={run_id}", "trainer.steps=4",
                         "trainer.log_every=1", *(QUICK if wandb else QUIET), *extra], cwd=out.parent, timeout=150)


def assert_refused(done: subprocess.CompletedProcess, link: Path) -> None:
    """One line naming the link and why, exit 2, no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and WHY in lines[0] and str(link) in lines[0], lines
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize("planted", ["locks/node-0.lock", "logs/rank-0.log", "metrics.jsonl", "logs/rank-0.log.times",
                                     "env"])
def test_a_link_planted_in_the_run_directory_is_refused_and_its_target_unchanged(tmp_path, planted):
    target = victim(tmp_path)
    out = tmp_path / "runs"
    link = out / "r" / planted
    link.parent.mkdir(parents=True)
    link.symlink_to(target if planted != "env" else tmp_path)  # env/: a folder link, files written inside
    before = sorted(os.listdir(tmp_path))
    done = quick_run(out, "r")
    assert_refused(done, link)
    assert target.read_bytes() == VICTIM_TEXT
    assert sorted(os.listdir(tmp_path)) == before, "nothing written beside the victim"
    assert not (out / "r" / "plan.json").exists(), "refused before the run directory was written"


@pytest.mark.parametrize("planted", ["link", "fifo"])
def test_a_link_planted_mid_run_is_refused_when_met_and_never_written_through(tmp_path, planted):
    """Planted once the run has started (after the pre-start check): the restart's rank log meets it. A FIFO there
    is refused the same way, where the open used to wait for a reader forever (docs/security.md)."""
    target = victim(tmp_path)
    out = tmp_path / "runs"
    link = out / "r" / "logs" / "rank-0.attempt-1.log"
    args = ["--gpus", "1", f"output_dir={out}", "run_id=r", "trainer.steps=40", "launcher.max_restarts=1", *QUIET]
    proc = start_launcher(args, cwd=tmp_path, env={"LAUNCHER_INJECT_FAULT": "rank=0,step=30"})
    try:
        deadline = time.monotonic() + 120
        while not (out / "r" / "plan.json").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        link.symlink_to(target) if planted == "link" else os.mkfifo(link)
        output, _ = communicate_bounded(proc, 150, "launcher")  # stderr is merged into it
    finally:
        kill_group(proc)
    last = output.strip().splitlines()[-1]  # the injected fault's own traceback is rank 0's, above it
    why = WHY if planted == "link" else "is a FIFO, not a regular file the launcher made"
    assert last.startswith("error: ") and why in last and str(link) in last, output[-2000:]
    assert proc.returncode == 2, (proc.returncode, output[-2000:])
    assert target.read_bytes() == VICTIM_TEXT


def test_the_links_wandb_makes_in_its_own_folder_are_no_refusal(tmp_path):
    out = tmp_path / "runs"
    (out / "r" / "wandb" / "offline-run-1").mkdir(parents=True)
    (out / "r" / "wandb" / "latest-run").symlink_to("offline-run-1")  # as W&B leaves it, for a resume to meet
    done = quick_run(out, "r", wandb=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_run_directory_that_is_a_symlink_is_refused_with_nothing_created(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "runs"
    out.mkdir()
    (out / "r").symlink_to(elsewhere)
    done = quick_run(out, "r")
    assert_refused(done, out / "r")
    assert os.listdir(elsewhere) == [] and os.listdir(out) == ["r"]


@pytest.fixture(scope="module")
def linked_out_run(tmp_path_factory):
    """One real 2-rank run through an output_dir that is a symlink, with a link planted as its first checkpoint's
    temp: shared by the three tests below (each reads what it checks; the board's plants its links in a copy of
    the run), as each setup is untouched by the others."""
    tmp_path = tmp_path_factory.mktemp("linked-out")
    real = tmp_path / "real-out"
    link = tmp_path / "out-link"
    link.symlink_to(real)
    target_dir = tmp_path / "victim-dir"
    target_dir.mkdir()
    (target_dir / "keep.txt").write_bytes(VICTIM_TEXT)
    ckpts = real / "r" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / ".tmp-step-00000002").symlink_to(target_dir)
    done = quick_run(link, "r", "checkpoint.every_steps=2", "--gpus", "2")
    return real, target_dir, done


def test_an_output_dir_that_is_a_symlink_is_resolved_once_and_recorded(linked_out_run):
    real, _, done = linked_out_run
    assert done.returncode == 0, done.stderr[-2000:]
    plan = json.loads((real / "r" / "plan.json").read_text())
    assert plan["run_dir"] == str(real.resolve() / "r")  # the resolved path, as every later write uses it
    assert json.loads((real / "r" / "summary.json").read_text())["status"] == "completed"


def test_a_link_planted_as_a_checkpoint_temp_is_removed_and_the_save_goes_on(linked_out_run):
    real, target_dir, done = linked_out_run
    ckpts = real / "r" / "checkpoints"
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stdout + done.stderr
    assert sorted(os.listdir(ckpts)) == ["step-00000002", "step-00000004"]
    assert (ckpts / "step-00000002" / "manifest.json").is_file() and not (ckpts / "step-00000002").is_symlink()
    assert os.listdir(target_dir) == ["keep.txt"] and (target_dir / "keep.txt").read_bytes() == VICTIM_TEXT


def test_the_board_serves_nothing_through_a_planted_link(tmp_path, linked_out_run):
    pytest.importorskip("flask")
    secret = tmp_path / "secret.log"
    secret.write_text("SECRET-LINE\n")
    secret_json = tmp_path / "secret.json"
    secret_json.write_text(json.dumps({"status": "SECRET-STATUS"}) + "\n")
    real, _, done = linked_out_run
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "runs"
    shutil.copytree(real / "r", out / "r", symlinks=True)  # a real 2-rank run's files, the links planted in them
    logs = out / "r" / "logs"
    (logs / "rank-0.log").unlink()
    (logs / "rank-0.log").symlink_to(secret)
    (out / "r" / "summary.json").unlink()
    (out / "r" / "summary.json").symlink_to(secret_json)
    with board(out) as b:
        status, body = get(b.url("/api/logs?path=r&rank=0"))
        assert status == 404 and b"SECRET" not in body, status
        status, body = get(b.url("/api/logs?path=r&rank=all"))
        assert status == 200 and b"SECRET" not in body and b"[rank1]: " in body
        status, body = get(b.url("/api/run?path=r"))
        assert status == 200 and b"SECRET" not in body


# --- a second, real user plants the link -------------------------------------------------------------------

@pytest.fixture
def other_user() -> Iterator[str]:
    """A temporary local user (removed after); needs root and useradd."""
    if os.geteuid() != 0:
        pytest.skip("needs root: it adds a temporary user")
    if not all(map(shutil.which, ("useradd", "userdel", "setpriv"))):
        pytest.skip("no useradd, userdel or setpriv on this machine")
    name = f"lnk{uuid.uuid4().hex[:8]}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True, timeout=30)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False, timeout=30)


def test_roots_run_does_not_write_through_a_link_another_user_planted(tmp_path, other_user):
    shared = Path(tempfile.mkdtemp(prefix="shared-out-", dir="/tmp"))  # a world-writable output folder
    try:
        shared.chmod(0o1777)
        target = victim(tmp_path)  # root's own file, which the other user cannot write
        uid = pwd.getpwnam(other_user).pw_uid
        plant = 'mkdir -p "$1/r/logs" && ln -s "$2" "$1/r/logs/rank-0.log"'
        planted = run_bounded(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sh", "-c", plant, "sh",
                               str(shared), str(target)], Path("/"), timeout=30)
        assert planted.returncode == 0, planted.stderr
        link = shared / "r" / "logs" / "rank-0.log"
        assert link.is_symlink() and link.lstat().st_uid == uid
        done = quick_run(shared, "r")
        assert_refused(done, link)
        assert target.read_bytes() == VICTIM_TEXT
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_an_error_as_a_file_object_is_made_is_the_one_raised(tmp_path):
    """What failed once the file object existed (here its encoding; in a launch, a Ctrl-C's exception raised just
    after it was made) is what the caller sees: a second close of its descriptor raised EBADF in its place, and a
    Ctrl-C as the workers started ended in exit 1 with a traceback."""
    from launcher.runtime import safefs

    with pytest.raises(LookupError):
        safefs.open_file(str(tmp_path / "logs" / "rank-0.log"), "w", root=str(tmp_path), encoding="no-such-codec")
    with safefs.open_file(str(tmp_path / "logs" / "rank-0.log"), "ab", root=str(tmp_path), buffering=0) as f:
        f.write(b"still opens")
    assert (tmp_path / "logs" / "rank-0.log").read_bytes() == b"still opens"


def test_a_node_record_read_back_follows_no_link_and_keeps_only_well_shaped_fields(tmp_path):
    """A multi-node job's verdict reads the other nodes' records (nodes/node-K.json) back from a shared folder
    (launcher.rundir.read_node_record, the Ray driver's and the simulated supervisor's): a planted link reads as no
    record, and a status, error or root cause of the wrong shape is left out."""
    from launcher.rundir import read_node_record

    nodes = tmp_path / "nodes"
    nodes.mkdir()
    target = victim(tmp_path)
    target.write_text(json.dumps({"status": "failed", "error": "rank 1 failed: planted"}))
    (nodes / "node-1.json").symlink_to(target)
    assert read_node_record(tmp_path, 1) == {}
    (nodes / "node-2.json").write_text(json.dumps({"status": 3, "error": ["x"], "root_cause": {"rank": True},
                                                   "host": "h", "node_rank": 2}))
    assert read_node_record(tmp_path, 2) == {"host": "h", "node_rank": 2}
    good = {"status": "failed", "error": "rank 5 failed: boom", "root_cause": {"rank": 5, "log": "logs/rank-5.log"}}
    (nodes / "node-3.json").write_text(json.dumps(good))
    assert read_node_record(tmp_path, 3) == good
    assert read_node_record(tmp_path, 4) == {}
