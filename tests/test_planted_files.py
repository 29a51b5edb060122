"""A run directory's files are the launcher's own (docs/security.md): a FIFO, socket or folder planted where a file
belongs is refused in one line, as a planted link is, and never waited on (an open() of a FIFO waits for a peer,
deaf to SIGTERM: a launcher sat 13 minutes in it; one planted mid-run: tests/test_symlinks.py); a run directory or
output folder owned by another user is refused unless launcher.allow_other_owner=true says to use it. Real launchers;
the other owner is a second real user where the tests run as root.
"""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path

import pytest

from tests.helpers import QUIET, run_launcher

pytestmark = pytest.mark.timeout(240)
FIFO = "a FIFO, not a regular file the launcher made"


def quick_run(out: Path, *extra: str, timeout: float = 90):
    return run_launcher(["--gpus", "1", f"output_dir={out}", "trainer.steps=4", *QUIET, *extra], cwd=out.parent,
                        timeout=timeout)


def one_line(done, *words: str) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines
    assert "Traceback" not in done.stdout + done.stderr
    return lines[0]


# --- FIFOs ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("planted", ["logs/launcher.log", "metrics.jsonl", "summary.json"])
def test_a_fifo_planted_in_a_named_run_directory_is_refused_before_anything_starts(tmp_path, planted):
    """As logs/launcher.log the launcher used to wait in open() before its first line; as metrics.jsonl rank 0 did."""
    out = tmp_path / "runs"
    fifo = out / "r" / planted
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    started = time.monotonic()
    done = quick_run(out, "run_id=r", timeout=60)
    one_line(done, str(fifo), FIFO)
    assert time.monotonic() - started < 50
    assert not (out / "r" / "plan.json").exists() and not (out / "r" / "locks").exists(), "refused before it was written"


def test_every_opener_refuses_a_fifo_or_a_folder_without_waiting(tmp_path):
    """The openers of run-directory files (launcher.runtime.safefs and the readers that walk no root: `ls`, the board,
    the commands' records, checkpoint checks, the launcher's log handler): one PlantedFileError, at once."""
    from launcher.backends.base import read_record
    from launcher.logs import setup_launcher_logging
    from launcher.rundir import read_json
    from launcher.runindex import entry_or_damaged
    from launcher.runtime import safefs
    from launcher.runtime.checkpoints import latest_valid

    run = tmp_path / "r"
    (run / "logs").mkdir(parents=True)
    for name in ("logs/launcher.log", "summary.json", "plan.json", "metrics.jsonl", "job.json"):
        os.mkfifo(run / name)
    (run / "config.yaml").mkdir()  # a folder where a file belongs
    for flags in (os.O_RDONLY, os.O_WRONLY | os.O_APPEND | os.O_CREAT, os.O_RDWR):
        with pytest.raises(safefs.PlantedFileError, match="is a FIFO"):
            safefs.open_fd(str(run / "metrics.jsonl"), flags, root=str(run))
    with pytest.raises(safefs.PlantedFileError, match="is a folder"):
        safefs.read_bytes(str(run / "config.yaml"), root=str(run))
    with pytest.raises(safefs.PlantedFileError, match="is a FIFO"):
        setup_launcher_logging(run / "logs" / "launcher.log")
    with pytest.raises(safefs.PlantedFileError):
        read_json(run / "summary.json")
    assert read_record(run / "job.json") == {}
    assert (entry_or_damaged(run, time.time()) or {}).get("run_id") == "r"  # listed, not waited on
    step = tmp_path / "ckpt" / "step-00000002"
    step.mkdir(parents=True)
    os.mkfifo(step / "manifest.json")
    assert latest_valid(tmp_path / "ckpt", warn=lambda _: None) is None
    fd = safefs.open_fd(str(run / "logs" / "plain.log"), os.O_WRONLY | os.O_CREAT, root=str(run))
    try:  # a regular file opened for good: O_NONBLOCK was for the open only
        import fcntl

        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    finally:
        os.close(fd)


def test_ls_and_the_board_pass_a_fifo_by(tmp_path):
    out = tmp_path / "runs"
    run = out / "r"
    run.mkdir(parents=True)
    (run / "plan.json").write_text(json.dumps({"run_id": "r"}))
    (run / "config.yaml").write_text("trainer:\n  steps: 4\n")
    os.mkfifo(run / "summary.json")
    os.mkfifo(run / "metrics.jsonl")
    listed = run_launcher(["ls", str(out), "--json"], cwd=tmp_path, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert [row["run_id"] for row in json.loads(listed.stdout)] == ["r"]
    from launcher.board.files import open_served

    with pytest.raises(OSError, match="is a FIFO"):
        open_served(run / "summary.json")


def test_nccls_own_debug_pipes_are_no_refusal(tmp_path):
    """torch makes stacks/nccl-pipe-rank-K.pipe (NCCL's flight recorder, on GPU runs): a resumed GPU run meets them."""
    from launcher.backends.dispatch import refuse_planted_links_in
    from launcher.runtime import safefs

    (tmp_path / "r" / "stacks").mkdir(parents=True)
    os.mkfifo(tmp_path / "r" / "stacks" / "nccl-pipe-rank-0.pipe")
    refuse_planted_links_in(str(tmp_path / "r"))
    os.mkfifo(tmp_path / "r" / "stacks" / "rank-0.txt")
    with pytest.raises(safefs.PlantedFileError):
        refuse_planted_links_in(str(tmp_path / "r"))


# --- another user's folders ---------------------------------------------------------------------------------------

def other_uid() -> int:
    """A second real user's uid (nobody's); the tests that chown need root."""
    if os.geteuid() != 0:
        pytest.skip("needs root: only root can give a folder to another user")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user nobody on this machine")


OWNED = "belongs to user nobody"


def test_a_run_directory_another_user_owns_is_refused_with_nothing_written_in_it(tmp_path):
    """Root used to write locks/, logs and plan.json into it, which its owner could rename or delete."""
    uid, out = other_uid(), tmp_path / "runs"
    (out / "r").mkdir(parents=True)
    os.chown(out / "r", uid, uid)
    line = one_line(quick_run(out, "run_id=r", timeout=60), str(out / "r"), OWNED, "launcher.allow_other_owner=true")
    assert "output_dir=PATH" in line
    assert os.listdir(out / "r") == []


@pytest.mark.parametrize("where", ["output_dir", "its parent"])
def test_an_output_folder_another_user_owns_is_refused_with_nothing_made(tmp_path, where):
    """output_dir itself, or (where it is not made yet) the folder it would be made in."""
    uid = other_uid()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, uid, uid)
    out = theirs if where == "output_dir" else theirs / "runs"
    one_line(quick_run(out, timeout=60), str(theirs), OWNED)
    assert os.listdir(theirs) == []


def test_allow_other_owner_uses_another_users_folder(tmp_path):
    uid, out = other_uid(), tmp_path / "runs"
    out.mkdir()
    os.chown(out, uid, uid)
    done = quick_run(out, "launcher.allow_other_owner=true", timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    [run_dir] = [p for p in out.iterdir() if p.is_dir()]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
