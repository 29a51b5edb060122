"""Agent side of the hang watchdog: a thread in each node's launcher that catches stuck ranks.

When a local rank that has beaten at least once (launcher.runtime.beats) stops beating for
watchdog.timeout_s, it dumps every local rank's Python stack into <run_dir>/stacks/, names the
stuck ranks and where they are, stops the job (the agent shuts down, hung workers are killed)
and the run ends with HangError: exit 1, summary status "hung".
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import re
import signal
import socket
import sys
import sysconfig
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar

from launcher.runtime.beats import STACK_SIGNAL, read_beat, stack_file
from launcher.errors import HangError

log = logging.getLogger("launcher")
T = TypeVar("T")

DUMP_WAIT_S = 3.0  # how long to wait for the ranks' stack dumps to land
KILL_AFTER_S = 0.3  # let the agent's shutdown start first, so it does not restart the killed workers
_THREAD_HEADER = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<func>.+)$')
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")})


@dataclass(frozen=True)
class RankBeat:
    rank: int
    local_rank: int
    pid: int
    thread: int  # ident of the worker's main thread
    beat_at: float  # wall-clock time of the last beat; 0 = never beat


def local_ranks(run_dir: Path, children: set[int]) -> List[RankBeat]:
    """The registered ranks that are live worker processes of this launcher, on this host."""
    host, found = socket.gethostname(), []
    for path in sorted((run_dir / "heartbeats").glob("rank-*")):
        record = read_beat(path)
        if record is None or record.get("host") != host or record.get("pid") not in children:
            continue
        found.append(RankBeat(int(record["rank"]), int(record["local_rank"]), int(record["pid"]),
                              int(record["thread"]), float(record["beat_at"])))
    return found


def stuck_ranks(ranks: List[RankBeat], silent_s: float, now: float) -> List[RankBeat]:
    """Ranks that have beaten and then been silent for longer than silent_s, longest first."""
    stuck = [r for r in ranks if r.beat_at > 0 and now - r.beat_at > silent_s]
    return sorted(stuck, key=lambda r: r.beat_at)


def main_thread_frames(dump: str, thread: int) -> List[Tuple[str, int, str]]:
    """(file, line, function) of one thread in a faulthandler dump, innermost first."""
    frames: List[Tuple[str, int, str]] = []
    inside = False
    for line in dump.splitlines():
        header = _THREAD_HEADER.match(line)
        if header:
            if inside:
                break
            inside = int(header.group(2), 16) == thread
            continue
        frame = _FRAME.match(line)
        if inside and frame:
            frames.append((frame["file"], int(frame["line"]), frame["func"]))
    return frames


def where(frames: List[Tuple[str, int, str]]) -> str:
    """'all_reduce (trainers/train.py:80)': the innermost function, and the innermost line of user code."""
    if not frames:
        return "an unknown place (no stack dump)"
    func = frames[0][2]
    user = next((f for f in frames if not f[0].startswith(_LIBRARY_DIRS)), frames[0])
    return f"{func} ({_short(user[0])}:{user[1]})"


def _short(path: str) -> str:
    """A path as the user knows it: relative to the working directory or to the import root it came from."""
    roots = [os.getcwd()] + sorted((p for p in sys.path if p and os.path.isabs(p)), key=len, reverse=True)
    for root in roots:
        if root.rstrip(os.sep) and path.startswith(root.rstrip(os.sep) + os.sep):
            return os.path.relpath(path, root)
    return path


class Watchdog(threading.Thread):
    """Polls this node's heartbeat files; on a hang, explains it and stops the job."""

    def __init__(self, run_dir: str, timeout_s: float) -> None:
        super().__init__(name="launcher-watchdog", daemon=True)
        self.run_dir = Path(run_dir)
        self.timeout_s = timeout_s
        self.verdict: Optional[str] = None  # the explanation, once it fired
        self._stop_event = threading.Event()
        self._poll_s = min(1.0, max(0.1, timeout_s / 10))

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self._poll_s):
            ranks = local_ranks(self.run_dir, _children())
            if stuck_ranks(ranks, self.timeout_s, time.time()):
                self._fire(ranks)
                return

    def _fire(self, ranks: List[RankBeat]) -> None:
        now = time.time()
        places = dump_stacks(self.run_dir, ranks)
        # One stuck rank soon stalls the rest in their next collective, and beats are coarse: every
        # rank silent for half the timeout counts as stuck; the odd place out is usually the cause.
        silent = stuck_ranks(ranks, self.timeout_s / 2, now)
        named = ", ".join(f"rank {r.rank} stuck {now - r.beat_at:.0f}s in {places[r.rank]}" for r in silent)
        others = [r for r in ranks if r not in silent]
        also = "; still beating: " + ", ".join(f"rank {r.rank} in {places[r.rank]}" for r in others) if others else ""
        self.verdict = (f"hang: no progress for over {self.timeout_s:g}s (watchdog.timeout_s): {named}{also}; "
                        f"stacks in {self.run_dir / 'stacks'}")
        log.error(f"watchdog: ranks made no progress for {self.timeout_s:g}s; stacks dumped, stopping the job")
        log.debug(self.verdict)  # the launcher's log file; the console gets it as the run's error line
        _thread.interrupt_main(signal.SIGTERM)  # the agent shuts down instead of restarting workers
        time.sleep(KILL_AFTER_S)
        for r in ranks:
            _kill_tree(r.pid)  # hung in a collective, a worker may never act on SIGTERM


def dump_stacks(run_dir: Path, ranks: List[RankBeat]) -> Dict[int, str]:
    """Signal every rank to dump its stacks; {rank: where its main thread is}."""
    for r in ranks:
        stack_file(run_dir, r.rank).write_text("")  # only this dump, not an older one
        with contextlib.suppress(ProcessLookupError):
            os.kill(r.pid, STACK_SIGNAL)
    deadline = time.monotonic() + DUMP_WAIT_S
    places: Dict[int, str] = {}
    while time.monotonic() < deadline and len(places) < len(ranks):
        time.sleep(0.1)
        for r in ranks:
            frames = main_thread_frames(_read(stack_file(run_dir, r.rank)), r.thread)
            if frames:
                places[r.rank] = where(frames)
    return {r.rank: places.get(r.rank, where([])) for r in ranks}


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = proc.children(recursive=True) + [proc]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


@contextlib.contextmanager
def node_watchdog(run_dir: str, timeout_s: float) -> Iterator[Optional[Watchdog]]:
    """Watch this node's ranks while the body runs; a hang turns whatever the body raised into HangError."""
    if timeout_s <= 0:
        yield None
        return
    dog = Watchdog(run_dir, timeout_s)
    dog.start()
    try:
        yield dog
    except BaseException as e:
        if dog.verdict:
            raise HangError(dog.verdict) from e
        raise
    finally:
        dog.stop()
        dog.join(timeout=DUMP_WAIT_S + 2)
    if dog.verdict:
        raise HangError(dog.verdict)


def run_watched(run_dir: str, config: Dict[str, Any], launch: Callable[[], T]) -> T:
    """launch() (this node's agent) under the watchdog configured by config["watchdog"]["timeout_s"]."""
    with node_watchdog(run_dir, float(config.get("watchdog", {}).get("timeout_s", 0))):
        return launch()
