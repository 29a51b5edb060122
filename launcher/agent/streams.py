"""Workers' output: each rank's stdout and stderr to its log file and to the console, kept apart.

Every worker writes into three pipes (launcher.worker.bootstrap): stdout, stderr and a status pipe. One
thread of the agent reads them all:
- ``logs/rank-<k>.log`` gets both streams, byte for byte, in the order they arrived;
- the console gets whole lines (and ``\\r``-ended progress-bar updates) with a ``[rank<k>]: ``
  prefix, stdout lines on the launcher's stdout and stderr lines on its stderr, as torchrun's
  ``--tee`` would, but never a prefix in the middle of a line and never two (torch's own warnings
  already start with ``[rank<k>]:``);
- a status line ``done CODE`` records when the rank's script returned, and with what code;
- ``logs/rank-<k>.log.times`` records when the log's bytes arrived and from which stream:
  ``OFFSET UNIX_TIME out|err`` per line, at most one every TIMES_EVERY_S unless the stream changes, so
  `logs --all` can interleave the ranks after the fact and keep a print apart from a progress bar
  drawn on the other stream (launcher.agent.ranklog).
"""

from __future__ import annotations

import os
import re
import selectors
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Dict, List, Optional, Sequence, Tuple

from launcher.runtime import safefs

MAX_PENDING = 1 << 16  # a line longer than this is shown in pieces rather than held back
DRAIN_S = 2.0  # after the workers exited, how long to wait for their last bytes (a child may hold a pipe)
TIMES_EVERY_S = 0.01  # arrival times closer than this share one entry: `logs --all` orders ranks to about this
TIMES_SUFFIX = ".times"


@dataclass
class _ArrivalTimes:
    """rank-<k>.log.times: the log's offset, the wall time and the stream whenever bytes arrive after a pause
    or from the other stream."""

    file: Optional[IO[bytes]]
    last: float = 0.0
    kind: str = ""

    def note(self, offset: int, kind: str) -> None:
        now = time.time()
        if self.file is None or (now - self.last < TIMES_EVERY_S and kind == self.kind):
            return
        self.last, self.kind = now, kind
        try:
            self.file.write(f"{offset} {now:.3f} {kind}\n".encode())
        except OSError:  # a full disk: the log matters more than its times
            self.file = None


@dataclass
class _Source:
    rank: int
    kind: str  # out | err | status
    log: Optional[IO[bytes]]
    pending: bytes = b""
    shown: bool = True  # on the console too (launcher.redirects / launcher.local_ranks_filter: the log file only)


def console_streams(redirects: str, ranks_filter: Sequence[int], local_rank: int) -> Tuple[str, ...]:
    """The streams of one local rank the console shows, as torchrun's -r (0 none, 1 stdout, 2 stderr, 3 both, or
    LOCAL_RANK:N,...: those go to the log file only) and --local-ranks-filter (only these local ranks) decide."""
    if ranks_filter and local_rank not in ranks_filter:
        return ()
    per_rank = dict(item.split(":", 1) for item in redirects.split(",")) if ":" in redirects else None
    code = int(per_rank.get(str(local_rank), "0") if per_rank is not None else redirects)
    return tuple(kind for kind, bit in (("out", 1), ("err", 2)) if not code & bit)


@dataclass
class RankStatus:
    done_code: Optional[int] = None  # the exit code the script ended with, once it returned
    done_at: Optional[float] = None  # time.monotonic() of that
    done_wall: Optional[float] = None  # time.time() of that, as the worker read it
    lines: List[bytes] = field(default_factory=list)


class OutputRouter(threading.Thread):
    """Reads every worker pipe of one attempt; see the module docstring."""

    def __init__(self, console: bool = True) -> None:
        super().__init__(name="launcher-output", daemon=True)
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._logs: List[IO[bytes]] = []
        self._halt = threading.Event()
        self._console = console
        self.status: Dict[int, RankStatus] = {}
        self._times: Dict[int, _ArrivalTimes] = {}  # by id() of the log file object
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._row = ConsoleRow()

    def add(self, rank: int, stdout_fd: int, stderr_fd: int, status_fd: int, log_path: str,
            shown: Tuple[str, ...] = ("out", "err")) -> None:
        run_dir = os.path.dirname(os.path.dirname(log_path))  # <run_dir>/logs/rank-K.log: nothing below it followed
        log = safefs.open_file(log_path, "ab", root=run_dir, buffering=0)
        times = safefs.open_file(log_path + TIMES_SUFFIX, "ab", root=run_dir, buffering=0)
        with self._lock:
            self._logs += [log, times]
            self._times[id(log)] = _ArrivalTimes(times)
            self.status[rank] = RankStatus()
            for fd, kind in ((stdout_fd, "out"), (stderr_fd, "err"), (status_fd, "status")):
                os.set_blocking(fd, False)
                source = _Source(rank, kind, log if kind != "status" else None, shown=kind in shown)
                self._selector.register(fd, selectors.EVENT_READ, source)
        os.write(self._wake_w, b"x")

    def run(self) -> None:
        while not self._halt.is_set():
            with self._lock:
                if not self._selector.get_map():
                    break
            for key, _ in self._selector.select(timeout=0.5):
                if key.data is None:
                    os.read(self._wake_r, 4096)
                    continue
                self._read(key.fd, key.data)

    def _read(self, fd: int, source: _Source) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:  # end of stream: the worker and everything it started closed this pipe
            with self._lock:
                self._selector.unregister(fd)
            os.close(fd)
            self._flush_pending(source)
            return
        if source.kind == "status":
            self._on_status(source, chunk)
            return
        if source.log is not None:
            try:
                self._times[id(source.log)].note(source.log.tell(), source.kind)
                source.log.write(chunk)
            except OSError:  # a full disk: the console still shows the rank, and its error names the disk
                source.log = None
        if self._console and source.shown:
            self._show(source, chunk)

    def _on_status(self, source: _Source, chunk: bytes) -> None:
        source.pending += chunk
        *lines, source.pending = source.pending.split(b"\n")
        for line in lines:
            word, _, rest = line.decode(errors="replace").partition(" ")
            value, _, wall = rest.partition(" ")
            if word == "done" and value.lstrip("-").isdigit():
                status = self.status[source.rank]
                status.done_code, status.done_at = int(value), time.monotonic()
                status.done_wall = _seconds(wall)

    def _show(self, source: _Source, chunk: bytes) -> None:
        data = source.pending + chunk
        pieces, rest = split_segments(data)
        if len(rest) > MAX_PENDING:
            pieces.append(rest)
            rest = b""
        source.pending = rest
        if pieces:
            self._emit(source, pieces)

    def _flush_pending(self, source: _Source) -> None:
        if source.kind != "status" and source.pending and self._console and source.shown:
            self._emit(source, [source.pending + b"\n"])
        source.pending = b""

    def _emit(self, source: _Source, pieces: List[bytes]) -> None:
        for piece in pieces:
            self._row.show(source.kind, rank_prefixed(source.rank, piece))
        self._row.write()

    def finish(self, timeout: float = DRAIN_S) -> None:
        """Wait (bounded) for the pipes to end, then stop reading and close the log files."""
        deadline = time.monotonic() + timeout
        while self.is_alive() and time.monotonic() < deadline:
            with self._lock:
                if len(self._selector.get_map()) <= 1:  # only the wake-up pipe is left
                    break
            time.sleep(0.02)
        self._halt.set()
        os.write(self._wake_w, b"x")
        self.join(timeout=2)
        with self._lock:
            for key in list(self._selector.get_map().values()):
                if key.data is not None:
                    self._flush_pending(key.data)
                    os.close(key.fd)
            self._selector.close()
            for log in self._logs:
                log.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


class ConsoleRow:
    """Writes the ranks' pieces to the console so that a progress bar's row never mixes with what follows.

    A bar's update ends in \\r: the terminal's cursor goes back to the start of the row the bar still fills,
    and whatever comes next (another rank's line or bar, this rank's print on the other stream) would overwrite
    it only as far as it reaches, leaving the rest of the bar behind it. So the next piece is padded with spaces
    to the bar's width (on the bar's stream, as tqdm pads its own updates), or, on the other stream, the row is
    blanked first on the bar's stream. Under torchrun the next piece is glued to the bar instead.
    """

    def __init__(self) -> None:
        self.stream = ""  # the stream of the row a bar left open ("" when none is)
        self.width = 0  # how many characters of it are showing
        self._queued: List[Tuple[str, List[bytes]]] = []  # (stream, pieces) in order, for write()

    def show(self, kind: str, piece: bytes) -> None:
        """Queue piece for its stream (write() writes the queue: one write per run of one stream's pieces)."""
        if self.width and kind == self.stream:
            piece = _padded(piece, self.width)
        elif self.width:
            self._queue(self.stream, b" " * self.width + b"\r")
        ends_row = piece.endswith(b"\n")
        self.stream, self.width = ("", 0) if ends_row else (kind, _shown_width(piece))
        self._queue(kind, piece)

    def _queue(self, kind: str, data: bytes) -> None:
        if self._queued and self._queued[-1][0] == kind:
            self._queued[-1][1].append(data)
        else:
            self._queued.append((kind, [data]))

    def write(self) -> None:
        for kind, pieces in self._queued:
            _write(kind, b"".join(pieces))
        self._queued = []


_ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")  # colours and cursor moves take no room on the row


def _shown_width(piece: bytes) -> int:
    return len(_ESCAPE.sub(b"", piece.rstrip(b"\r\n")).decode("utf-8", errors="replace"))


def _padded(piece: bytes, width: int) -> bytes:
    body = piece.rstrip(b"\r\n")
    return body + b" " * max(0, width - _shown_width(body)) + piece[len(body):]


def _write(kind: str, data: bytes) -> None:
    stream = sys.stdout if kind == "out" else sys.stderr
    try:
        stream.flush()
        target = getattr(stream, "buffer", None)
        if target is not None:
            target.write(data)
            target.flush()
        else:
            stream.write(data.decode(errors="replace"))
            stream.flush()
    except (OSError, ValueError):
        pass  # the console went away (a closed pipe): the log file still has everything


def rank_prefixed(rank: int, line: bytes) -> bytes:
    """The console's ``[rank<k>]: `` before a line, unless it starts with torch's own ``[rank<k>]:`` already."""
    return line if line.startswith(b"[rank%d]:" % rank) else b"[rank%d]: " % rank + line


_SEGMENT = re.compile(rb"[^\r\n]*(?:\r\n|\n|\r(?=[^\n]))")


def split_segments(data: bytes) -> Tuple[List[bytes], bytes]:
    """Whole lines (ending in \\n) and carriage-return updates (ending in \\r), and what is left over."""
    found = [m.group(0) for m in _SEGMENT.finditer(data) if m.group(0)]
    used = sum(len(p) for p in found)
    return [p for p in found if p != b"\r"], data[used:]  # a bare \r (tqdm starts updates so) shows nothing


def _seconds(text: str) -> Optional[float]:
    """A worker's time.time() as it wrote it; None for anything else (a worker's pipe is its own to write)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 < value < 1e11 else None
