"""Worker side of the hang watchdog: per-rank heartbeat files and an on-demand stack dump.

Each worker registers <run_dir>/heartbeats/rank-<k> at start (who it is, mtime 0 = "never beat")
and installs a faulthandler dump on STACK_SIGNAL into <run_dir>/stacks/rank-<k>.txt. A
heartbeat() only touches the file's mtime, at most every BEAT_INTERVAL_S, so calling it every
step costs a clock read. The agent's watchdog (launcher.watchdog) reads the mtimes.

User scripts call ``from launcher import heartbeat; heartbeat()``; outside the launcher (plain
torchrun, no registration) it does nothing. A rank that never beats is never judged stuck.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import IO, Any, Dict, Optional

BEAT_INTERVAL_S = 0.5  # finer than any sensible timeout, coarse enough to cost nothing per step
# A real-time signal: SIGUSR1/SIGUSR2 are taken by SLURM and submitit (preemption, requeue).
STACK_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR1

TIMEOUT_ENV = "LAUNCHER_WATCHDOG_TIMEOUT_S"  # the job's watchdog.timeout_s, in every worker's environment

_path: Optional[str] = None
_last_beat = 0.0
_stack_file: Optional[IO[str]] = None


def beat_file(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "heartbeats" / f"rank-{rank}"


def stack_file(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "stacks" / f"rank-{rank}.txt"


def register(run_dir: str, rank: int, local_rank: int) -> None:
    """Announce this worker to the node's watchdog and arm the stack dump; call once at worker start."""
    global _path, _last_beat, _stack_file
    path = beat_file(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "local_rank": local_rank, "pid": os.getpid(), "host": socket.gethostname(),
              "thread": threading.get_ident()}  # the main thread, to find it among the dumped ones
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.utime(tmp, (0, 0))  # registered, never beat: not judged until the first heartbeat()
    os.replace(tmp, path)
    stacks = stack_file(run_dir, rank)
    stacks.parent.mkdir(parents=True, exist_ok=True)
    _stack_file = open(stacks, "w", encoding="utf-8")  # kept open: faulthandler writes to its fd
    faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True, chain=False)
    _path, _last_beat = str(path), 0.0


def heartbeat() -> None:
    """Tell the watchdog this rank made progress. Cheap enough to call every step."""
    global _last_beat
    if _path is None:
        return
    now = time.monotonic()
    if now - _last_beat < BEAT_INTERVAL_S:
        return
    _last_beat = now
    try:
        os.utime(_path)
    except OSError:
        pass  # the run directory went away: nothing to watch any more


def disarm() -> None:
    """This rank is done (or tearing down): back to never-beat, so slow shutdowns are not hangs."""
    global _path
    if _path is None:
        return
    try:
        os.utime(_path, (0, 0))
    except OSError:
        pass
    _path = None


def read_beat(path: Path) -> Optional[Dict[str, Any]]:
    """A registration with its last beat time (0 = never), or None if unreadable (being replaced)."""
    try:
        record = json.loads(path.read_text())
        record["beat_at"] = path.stat().st_mtime
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
