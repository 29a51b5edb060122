"""Reading the per-rank step records a script's workers write (launcher/worker/progress.py), trusting none of them.

A record is one JSON line of <run_dir>/steps/rank-<k>.jsonl about once a second; its fields are
launcher.runtime.schema.STEP's. Every launcher.log call is one line of <run_dir>/series/rank-<k>.jsonl
(schema.SERIES), read the same way. A run directory is shared with other users and written by user code's processes:
every line is checked against the schema (types, finite numbers, sizes) before it counts, a line with any field of
the wrong shape is dropped whole, and a file is never opened through a symlink.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from launcher.runtime.fields import Record
from launcher.runtime.schema import SERIES, SERIES_DIR, STEP, STEP_FORMAT, STEPS_DIR

MAX_LINE = 1 << 16  # a longer line is not a record


def parse(line: bytes, kind: Record = STEP) -> Optional[Dict[str, Any]]:
    """One record of that kind, checked; None for anything else."""
    if len(line) > MAX_LINE:
        return None
    try:
        data = json.loads(line)
        record = kind.check(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if record["v"] != STEP_FORMAT:
        return None
    if kind is STEP:
        record["final"] = record.get("final") is True
    return record


class StepFiles:
    """The steps/rank-<k>.jsonl files of a run directory (series=True: series/rank-<k>.jsonl), read as they grow
    (whole lines only)."""

    def __init__(self, run_dir: str | Path, series: bool = False) -> None:
        self.folder = Path(run_dir) / (SERIES_DIR if series else STEPS_DIR)
        self.kind = SERIES if series else STEP
        self.offsets: Dict[str, int] = {}
        self.partial: Dict[str, bytes] = {}

    def new_records(self) -> List[Dict[str, Any]]:
        """Records written since the last call, every rank's, in file order per rank."""
        found: List[Dict[str, Any]] = []
        for path in self._files():
            found.extend(self._read_new(path))
        return found

    def _files(self) -> Iterator[Path]:
        try:
            if self.folder.is_symlink() or not self.folder.is_dir():
                return iter(())
            return iter(sorted(p for p in self.folder.iterdir() if p.name.startswith("rank-") and p.name.endswith(".jsonl")))
        except OSError:
            return iter(())

    def _read_new(self, path: Path) -> List[Dict[str, Any]]:
        key = path.name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return []
        try:
            os.lseek(fd, self.offsets.get(key, 0), os.SEEK_SET)
            chunks = []
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                chunks.append(chunk)
        except OSError:
            return []
        finally:
            os.close(fd)
        data = self.partial.get(key, b"") + b"".join(chunks)
        self.offsets[key] = self.offsets.get(key, 0) + sum(len(c) for c in chunks)
        *lines, rest = data.split(b"\n")
        self.partial[key] = rest if len(rest) <= MAX_LINE else b""
        return [r for r in (parse(line, self.kind) for line in lines if line.strip()) if r is not None]


def read_records(run_dir: str | Path) -> List[Dict[str, Any]]:
    """Every record of this launch, oldest first: steps/ holds this launch's alone (a resume, a requeue or a new Ray
    placement moves the earlier launch's into a folder of their own, launcher.rundir.archive_rank_logs), whichever
    node's launcher wrote them (each names its own start as the record's "launch")."""
    return sorted(StepFiles(run_dir).new_records(), key=lambda r: (r["attempt"], r["t"], r["rank"]))


def read_series(run_dir: str | Path) -> List[Dict[str, Any]]:
    """Every launcher.log call of this launch, in the order they were made (each rank's own order kept)."""
    return sorted(StepFiles(run_dir, series=True).new_records(), key=lambda r: (r["attempt"], r["t"], r["rank"]))
