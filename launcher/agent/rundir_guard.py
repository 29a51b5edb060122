"""A thread in each node's launcher that notices the run directory going away while the job runs.

Deleted (or moved) or made read-only mid-run, the run directory used to go unnoticed until the end: the
workers wrote on into a re-made folder or failed with tracebacks, and the launcher could write no summary.
Here it is looked at once a second (its identity, and a probe file created and removed in it): on a change
the job is stopped as the watchdog stops a hang (the agent shuts down, the workers are killed) and the run
ends with RunDirLostError: one line, exit 1, saying what is left and where.
"""

from __future__ import annotations

import _thread
import contextlib
import errno
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Iterator, Optional, Tuple

from launcher.agent.watching import watched_by
from launcher.agent.zygote import Zygote
from launcher.errors import RunDirLostError

log = logging.getLogger("launcher")
POLL_S = 1.0
READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)


def identity(run_dir: Path) -> Optional[Tuple[int, int]]:
    try:
        st = os.stat(run_dir, follow_symlinks=False)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def problem(run_dir: Path, expected: Tuple[int, int]) -> Optional[str]:
    """What is wrong with the run directory now, in words; None while it is the same and writable."""
    now = identity(run_dir)
    if now is None:
        return "was deleted or moved"
    if now != expected:
        return "was replaced by another folder"
    probe = run_dir / f".probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # left by a launcher killed mid-probe: ours (this pid), removed below
        fd = None
    except OSError as e:
        if e.errno in READ_ONLY:
            return f"became read-only ({os.strerror(e.errno)})"
        return None  # a full disk and the like: the metrics and checkpoints report those themselves
    if fd is not None:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def what_is_left(run_dir: Path, gone: bool) -> str:
    if gone:
        return ("nothing more could be saved: its checkpoints and logs went with it (if it was moved, they are "
                "where it was moved to); the console above has what the ranks printed")
    try:
        newest = max((p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-")), default=None)
    except OSError:
        newest = None
    kept = f"its newest checkpoint, {run_dir / 'checkpoints' / newest}," if newest else "what it held"
    return (f"{kept} is kept there, but no summary could be written: make it writable again and continue with "
            f"python -m launcher resume {run_dir}")


def verdict(run_dir: Path, found: str) -> str:
    gone = not found.startswith("became read-only")
    return f"the run directory {run_dir} {found} while the job ran: the job was stopped; " + what_is_left(run_dir, gone)


def lost_run_dir(run_dir: Path) -> Optional[str]:
    """The verdict for a run directory that can take no summary now (gone or read-only); None while it can. For a
    worker that failed on it before the guard's next look."""
    now = identity(run_dir)
    found = problem(run_dir, now) if now is not None else "was deleted or moved"
    return verdict(run_dir, found) if found else None


class RunDirGuard(threading.Thread):
    def __init__(self, run_dir: Path, expected: Tuple[int, int]) -> None:
        super().__init__(name="launcher-rundir-guard", daemon=True)
        self.run_dir, self.expected = run_dir, expected
        self.verdict: Optional[str] = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(POLL_S):
            found = problem(self.run_dir, self.expected)
            if found is not None:
                self.fire(found)
                return

    def fire(self, found: str) -> None:
        self.verdict = verdict(self.run_dir, found)
        log.error(f"the run directory {found}; stopping the job")
        # the agent shuts down instead of restarting workers (its main thread takes this before it looks at them
        # again); the workers are killed, not stopped: a stopped trainer would checkpoint into a re-made folder
        _thread.interrupt_main(signal.SIGTERM)
        kill_workers()


def kill_workers() -> None:
    """Every process under this launcher but the zygote (it forks the next attempt's workers; it kills what it
    holds once its agent hangs up)."""
    import psutil

    zygote = Zygote.current()
    spared = {zygote.proc.pid} if zygote is not None else set()
    for p in psutil.Process().children(recursive=True):
        if p.pid not in spared:
            with contextlib.suppress(psutil.Error):
                p.kill()


@contextlib.contextmanager
def run_dir_guarded(run_dir: str) -> Iterator[None]:
    """Watch the run directory while the body runs; once it is lost, whatever the body raised (or returned)
    becomes RunDirLostError."""
    path = Path(run_dir)
    expected = identity(path)
    if expected is None:
        yield
        return
    with watched_by(RunDirGuard(path, expected), RunDirLostError, 5):
        yield
