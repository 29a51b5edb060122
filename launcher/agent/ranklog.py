"""A rank's log read back as lines with their arrival times, as `logs --all` interleaves them.

logs/rank-<k>.log holds a rank's stdout and stderr bytes in the order they arrived; logs/rank-<k>.log.times
(launcher.agent.streams) says when each run of them arrived and from which stream. Read together:
- each stream's lines stay apart, so a print is never glued to a progress bar the rank draws on the other
  stream (in the file they share one line, since a bar's updates end in ``\\r``, not ``\\n``);
- a bar's ``\\r`` updates are dropped but for its last state, the line it ends with, as a terminal leaves it;
- every line carries exactly one ``[rank<k>]: `` prefix (none added where torch's own is there already);
- a line's time is the arrival of its first byte, never earlier than the rank's line before it.
A log without a times file (a run from before them) is one stream, timed after every other rank's lines;
one whose times name no stream (older runs) is one stream, timed.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

from launcher.agent.streams import MAX_PENDING, TIMES_SUFFIX, rank_prefixed, split_segments

READ_BYTES = 1 << 20
STREAMS = ("out", "err")
Timed = Tuple[float, int, str]  # (arrival time, rank, line with its newline)


@dataclass
class _Pending:
    """A stream's bytes after its last whole line, and when the first of them arrived."""

    data: bytes = b""
    at: float = 0.0


@dataclass
class Times:
    offsets: List[int]
    times: List[float]
    streams: List[str]


class RankLog:
    """One log file of one rank, read on from where the last read stopped (`logs -f` reads again and again).

    as_console: lines as above; otherwise the file's own lines, byte for byte (`logs --rank K`)."""

    def __init__(self, path: Path, rank: int, as_console: bool = True) -> None:
        self.path, self.rank, self.as_console = path, rank, as_console
        self._start()

    def _start(self) -> None:
        self.position = 0
        self.pending: Dict[str, _Pending] = {name: _Pending() for name in STREAMS}

    def read(self, finished: bool) -> Iterator[Tuple[float, str]]:
        """(arrival time, line) for every line completed since the last read; finished: nothing more will be
        written, so what is left without a newline is a line too."""
        size = _size(self.path)
        if size < self.position:  # a new file of that name (a SLURM requeue moved the old one away)
            self._start()
        times = read_times(self.path)  # after the size: the agent notes a run's time before its bytes
        try:
            f = self.path.open("rb")
        except OSError:
            return
        with f:
            f.seek(self.position)
            while self.position < size:
                i = bisect.bisect_right(times.offsets, self.position) - 1
                ends = min(times.offsets[i + 1], size) if i + 1 < len(times.offsets) else size
                chunk = f.read(min(READ_BYTES, ends - self.position))
                if not chunk:
                    break
                self.position += len(chunk)
                at = times.times[i] if i >= 0 else (0.0 if times.offsets else float("inf"))
                yield from self._feed(times.streams[i] if i >= 0 and self.as_console else "out", chunk, at)
        if finished:
            for pending in self.pending.values():
                if pending.data:
                    yield pending.at, self._line(pending.data)
                pending.data = b""

    def _feed(self, stream: str, chunk: bytes, at: float) -> Iterator[Tuple[float, str]]:
        pending = self.pending[stream]
        if not pending.data:
            pending.at = at
        segments, rest = (split_segments if self.as_console else _whole_lines)(pending.data + chunk)
        if len(rest) > MAX_PENDING:  # a line longer than this is shown in pieces rather than held back
            segments, rest = segments + [rest], b""
        for n, segment in enumerate(segments):
            if segment.endswith(b"\r"):
                continue  # a progress bar's update: only its last state, ended by a newline, is shown
            yield (pending.at if n == 0 else at), self._line(segment)
        pending.data, pending.at = rest, (at if segments else pending.at)

    def _line(self, segment: bytes) -> str:
        if not self.as_console:
            return segment.decode("utf-8", errors="replace") + ("" if segment.endswith(b"\n") else "\n")
        body = segment[:-2] if segment.endswith(b"\r\n") else segment.rstrip(b"\n")
        return rank_prefixed(self.rank, body).decode("utf-8", errors="replace") + "\n"


def rank_lines(logs: List[RankLog], finished: bool) -> Iterator[Timed]:
    """One rank's lines from its log files in attempt order, never earlier than the line before them."""
    last = 0.0
    for log in logs:
        for at, line in log.read(finished):
            last = max(last, at)
            yield last, log.rank, line


def _whole_lines(data: bytes) -> Tuple[List[bytes], bytes]:
    *lines, rest = data.split(b"\n")
    return [line + b"\n" for line in lines], rest


def read_times(log: Path) -> Times:
    found = Times([], [], [])
    try:
        text = (log.parent / (log.name + TIMES_SUFFIX)).read_text(encoding="ascii", errors="replace")
    except OSError:
        return found
    for line in text.split("\n")[:-1]:  # not the last, unless ended: it may be being written
        parts = line.split()
        if len(parts) not in (2, 3) or not parts[0].isdigit() or (len(parts) == 3 and parts[2] not in STREAMS):
            continue
        try:
            found.times.append(float(parts[1]))
        except ValueError:
            continue
        found.offsets.append(int(parts[0]))
        found.streams.append(parts[2] if len(parts) == 3 else "out")
    return found


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
