"""Worker side of the hang watchdog: per-rank heartbeat files and an on-demand stack dump.

Each worker is registered by launcher.worker.bootstrap at start: <run_dir>/heartbeats/rank-<k> (who it
is, mtime 0 = "never beat") and a faulthandler dump on STACK_SIGNAL into
<run_dir>/stacks/rank-<k>.txt (that file repeats the two paths and the signal: it imports nothing
of the project). A
heartbeat() only touches the file's mtime, at most every BEAT_INTERVAL_S, so calling it every
step costs a clock read. The agent's watchdog (launcher.agent.watchdog) reads the mtimes.

User scripts call ``from launcher import heartbeat; heartbeat()``; outside the launcher (plain
torchrun, no registration) it does nothing. Plain scripts beat without it: the worker bootstrap
registers a global optimizer-step hook that touches the same file (launcher.worker.bootstrap).
A rank that never beats is judged only by watchdog.start_timeout_s (launcher.agent.watchdog).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Dict, Optional

from launcher.runtime import env, safefs

BEAT_INTERVAL_S = 0.5  # finer than any sensible timeout, coarse enough to cost nothing per step
# A beat file's mtime: 0 = registered, never beat; DONE_AT = finished (or tearing down), never judged again.
# launcher.worker.bootstrap spells both again (it imports nothing of the project).
DONE_AT = 1.0
# A real-time signal: SIGUSR1/SIGUSR2 are taken by SLURM and submitit (preemption, requeue).
STACK_SIGNAL = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR1

TIMEOUT_ENV = env.WATCHDOG_TIMEOUT_S  # the job's watchdog.timeout_s, in every worker's environment

_path: Optional[str] = None
_looked = False  # whether _path was looked up (launcher.worker.bootstrap registers; the first heartbeat() finds it)
_last_beat = 0.0


def beat_file(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "heartbeats" / f"rank-{rank}"


def stack_file(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / "stacks" / f"rank-{rank}.txt"


def _registered_path() -> Optional[str]:
    """This rank's heartbeat file, if launcher.worker.bootstrap registered this process (read once)."""
    global _looked, _path
    if not _looked:
        _looked = True
        run_dir, rank = os.environ.get(env.RUN_DIR), os.environ.get("RANK")
        if run_dir and rank is not None:
            path = beat_file(run_dir, int(rank))
            record = read_beat(path)
            if record is not None and record.get("pid") == os.getpid():
                _path = str(path)
    return _path


def heartbeat() -> None:
    """Tell the watchdog this rank made progress. Cheap enough to call every step."""
    global _last_beat
    path = _path if _path is not None or _looked else _registered_path()
    if path is None:
        return
    now = time.monotonic()
    if now - _last_beat < BEAT_INTERVAL_S:
        return
    _last_beat = now
    try:
        os.utime(path, follow_symlinks=False)  # a link planted in its place is touched itself, never its target
    except OSError:
        pass  # the run directory went away: nothing to watch any more


def disarm() -> None:
    """This rank is done (or tearing down): marked finished, so slow shutdowns are not hangs."""
    global _path
    if _registered_path() is None:
        return
    try:
        os.utime(_path, (DONE_AT, DONE_AT), follow_symlinks=False)  # type: ignore[arg-type]
    except OSError:
        pass
    _path = None


def read_beat(path: Path) -> Optional[Dict[str, Any]]:
    """A registration with its last beat time (0 = never), or None if unreadable (being replaced)."""
    try:
        record = json.loads(safefs.read_bytes(str(path), root=str(path.parent.parent)))  # <run_dir>/heartbeats/rank-K
        record["beat_at"] = path.lstat().st_mtime
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
