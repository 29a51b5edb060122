"""What a node ships of its run directory to the head's (launcher.backends.mirror), as batches of bytes.

Only the files named in SHIPPED, each by a fixed pattern: a rank's log and its arrival times, its error
file, its step records, launcher.log series and stack dumps, the node's machine's figures and its record
nodes/node-<k>.json (which holds its watchdog's verdict). Heartbeat files are not shipped: the head's watchdog judges the files in its own
heartbeats/ folder by their age, and a copy's age says nothing about the rank.

A batch is one JSON header line, then the bytes its entries name, in order. The receiver trusts no path in
a batch: a name that is not one of SHIPPED's exact shapes is dropped, and it writes through
launcher.runtime.safefs below the run directory only. Pure reading and writing: no store, no thread here.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from launcher.runtime import safefs

# (folder, file name pattern, how: "a" appended bytes | "w" the whole file, rewritten when it changes)
SHIPPED: Tuple[Tuple[str, str, str], ...] = (
    ("logs", r"rank-\d+(\.attempt-\d+)?\.log", "a"),
    ("logs", r"rank-\d+(\.attempt-\d+)?\.log\.times", "a"),
    ("logs", r"rank-\d+(\.attempt-\d+)?\.error\.json", "w"),
    ("steps", r"rank-\d+\.jsonl", "a"),
    ("series", r"rank-\d+\.jsonl", "a"),  # every launcher.log call
    ("nodes", r"system-\d+\.jsonl", "a"),  # the node's machine, for the job's W&B run (launcher.runtime.system)
    ("stacks", r"rank-\d+(\.native)?\.txt", "w"),
    ("nodes", r"node-\d+\.json", "w"),
)
FILE_BYTES = 256 * 1024  # of one file, per batch: a chatty rank cannot starve the others
BATCH_BYTES = 1024 * 1024  # per batch: what the store holds per batch in flight
WHOLE_MAX = 4 * 1024 * 1024  # a "w" file larger than this is not shipped (a stack dump is a few KiB)
Entry = Tuple[str, str, int, int]  # (name, how, offset, length)


def how_shipped(name: str) -> Optional[str]:
    """"a" or "w" for a name of SHIPPED's shapes (folder/file, nothing else); None for anything else."""
    parts = name.split("/")
    if len(parts) != 2:
        return None
    for folder, pattern, how in SHIPPED:
        if parts[0] == folder and re.fullmatch(pattern, parts[1]):
            return how
    return None


def encode(entries: List[Entry], data: List[bytes]) -> bytes:
    return json.dumps({"files": entries}).encode() + b"\n" + b"".join(data)


def decode(blob: bytes) -> List[Tuple[str, str, int, bytes]]:
    """A batch's entries with their bytes; ValueError for one that is not a batch."""
    header, sep, body = bytes(blob).partition(b"\n")
    if not sep:
        raise ValueError("no header line")
    files = json.loads(header).get("files")
    out, at = [], 0
    for name, how, offset, length in files:
        if not (isinstance(name, str) and how in ("a", "w") and isinstance(offset, int) and isinstance(length, int)
                and 0 <= length <= len(body) - at and offset >= 0):
            raise ValueError("a malformed entry")
        out.append((name, how, offset, body[at:at + length]))
        at += length
    return out


@dataclass
class Tails:
    """The sending side: how far each file has been shipped (appended files) or which version (whole files)."""

    run_dir: str
    offsets: Dict[str, int] = field(default_factory=dict)
    versions: Dict[str, Tuple[int, int]] = field(default_factory=dict)

    def changed(self) -> List[Tuple[str, str, int]]:
        """(name, how, size) of every shipped file with something not shipped yet."""
        found = []
        for folder in sorted({f for f, _, _ in SHIPPED}):
            try:
                with os.scandir(os.path.join(self.run_dir, folder)) as it:
                    names = [(f"{folder}/{e.name}", e.stat(follow_symlinks=False)) for e in it
                             if e.is_file(follow_symlinks=False)]
            except OSError:
                continue
            for name, st in names:
                how = how_shipped(name)
                if how == "a" and st.st_size != self.offsets.get(name, 0):
                    found.append((name, how, st.st_size))
                elif how == "w" and (st.st_size, st.st_mtime_ns) != self.versions.get(name) and st.st_size <= WHOLE_MAX:
                    found.append((name, how, st.st_size))
        return found

    def batch(self) -> Optional[bytes]:
        """The next batch (at most BATCH_BYTES of new bytes), marked shipped; None when nothing is new."""
        entries: List[Entry] = []
        data: List[bytes] = []
        room = BATCH_BYTES
        for name, how, size in self.changed():
            if room <= 0:
                break
            chunk, offset = self._read(name, how, size, room)
            if chunk is None:
                continue
            entries.append((name, how, offset, len(chunk)))
            data.append(chunk)
            room -= len(chunk)
        return encode(entries, data) if entries else None

    def _read(self, name: str, how: str, size: int, room: int) -> Tuple[Optional[bytes], int]:
        path = os.path.join(self.run_dir, name)
        try:
            with safefs.open_file(path, "rb", root=self.run_dir) as f:
                if how == "w":
                    st = os.fstat(f.fileno())
                    if st.st_size > room and room < BATCH_BYTES:  # a whole file waits for a batch with room for it
                        return None, 0
                    self.versions[name] = (st.st_size, st.st_mtime_ns)
                    return f.read(WHOLE_MAX), 0
                offset = self.offsets.get(name, 0)
                if size < offset:  # truncated: not one of ours (ours only grow); start it again
                    offset = 0
                f.seek(offset)
                chunk = f.read(min(FILE_BYTES, room, size - offset))
        except (OSError, ValueError):
            return None, 0
        self.offsets[name] = offset + len(chunk)
        return chunk, offset


class SharedFolder(Exception):
    """A file the receiver did not write is being written in its run directory: the nodes share it after all."""


@dataclass
class Copies:
    """The receiving side: appends and replaces in the head's run directory, through safefs, names checked."""

    run_dir: str
    started: float = field(default_factory=time.time)
    lengths: Dict[str, int] = field(default_factory=dict)  # appended files this receiver made: their length
    made: Set[str] = field(default_factory=set)  # whole files this receiver wrote

    def apply(self, blob: bytes) -> int:
        """Write a batch's entries; the number dropped (a name of another shape). Raises SharedFolder."""
        dropped = 0
        for name, how, offset, chunk in decode(blob):
            if how_shipped(name) != how:
                dropped += 1
                continue
            path = os.path.join(self.run_dir, *name.split("/"))
            if how == "w":
                self._replace(name, path, chunk)
            else:
                self._append(name, path, offset, chunk)
        return dropped

    def _fresh_stranger(self, name: str, path: str) -> bool:
        """The file is there, not ours, and written since this receiver started: someone else writes it."""
        try:
            return os.lstat(path).st_mtime >= self.started - 1.0 and name not in self.lengths and name not in self.made
        except FileNotFoundError:
            return False

    def _replace(self, name: str, path: str, chunk: bytes) -> None:
        if self._fresh_stranger(name, path):
            raise SharedFolder(name)
        tmp = f"{path}.mirror.tmp"
        with safefs.open_file(tmp, "wb", root=self.run_dir) as f:
            f.write(chunk)
        safefs.replace(tmp, path, root=self.run_dir)
        self.made.add(name)

    def _append(self, name: str, path: str, offset: int, chunk: bytes) -> None:
        known = self.lengths.get(name)
        if known is None:
            if self._fresh_stranger(name, path):
                raise SharedFolder(name)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC  # a copy left by an earlier launch starts again
            known = 0
        else:
            flags = os.O_WRONLY | os.O_APPEND
        if offset < known:  # sent again (the sender restarted a truncated file): keep what is new
            chunk = chunk[known - offset:] if offset + len(chunk) > known else b""
        fd = safefs.open_fd(path, flags, root=self.run_dir)
        try:
            os.lseek(fd, 0, os.SEEK_END)
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        self.lengths[name] = known + len(chunk)
