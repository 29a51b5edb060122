"""Reading the per-rank step records a script's workers write (launcher/worker/progress.py), trusting none of them.

A record, one JSON line of <run_dir>/steps/rank-<k>.jsonl about once a second:

    {"v": 1, "rank": K, "attempt": A, "launch": "<launcher start, ms>", "t": wall time, "step": steps so far in
     this attempt, "steps": steps in this window, "window_s": its length, "step_time_s" / "step_time_s_median" /
     "step_time_s_max": the window's step intervals, "first_step_at": wall time of the first step (first record),
     "rss_mb", "rss_peak_mb", "cuda_mb", "cuda_peak_mb" (CUDA only), "batch_size", "batches" (batches the training
     loop's DataLoader gave in the window), "samples" (batches x batch_size), "samples_note" (why not),
     "logged": {rank 0's launcher.log values}, "per_rank": {launcher.log(..., per_rank=True) values},
     "wandb": {"id", "project", "name"} (rank 0, when the script has its own W&B run), "final": true (the end)}

A run directory is shared with other users and written by user code's processes: every line is checked (types,
finite numbers, sizes) before it counts, and a file is never opened through a symlink.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from launcher.worker.progress import FORMAT, STEPS_DIR

MAX_LINE = 1 << 16  # a longer line is not a record
MAX_LOGGED = 256  # launcher.log keys kept per record
MAX_KEY = 128
INTEGERS = ("rank", "attempt", "step", "steps", "batch_size")
NUMBERS = ("t", "window_s", "step_time_s", "step_time_s_median", "step_time_s_max", "first_step_at", "rss_mb",
           "rss_peak_mb", "cuda_mb", "cuda_peak_mb", "batches", "samples")
LIMIT = 1 << 53  # integers past this are not counts


def parse(line: bytes) -> Optional[Dict[str, Any]]:
    """One record, checked; None for anything else."""
    if len(line) > MAX_LINE:
        return None
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("v") != FORMAT or not isinstance(data.get("launch"), (str, type(None))):
        return None
    record: Dict[str, Any] = {"launch": data["launch"], "final": data.get("final") is True}
    for key in INTEGERS:
        value = data.get(key)
        if value is None and key == "batch_size":
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < LIMIT:
            return None
        record[key] = value
    for key in NUMBERS:
        value = data.get(key)
        if value is not None:
            if not _finite(value) or value < 0:
                return None
            record[key] = float(value)
    if "t" not in record or "window_s" not in record:
        return None
    for key in ("logged", "per_rank"):
        if key in data:
            record[key] = _numbers(data[key])
    for key in ("samples_note",):
        if isinstance(data.get(key), str):
            record[key] = data[key][:200]
    if isinstance(data.get("wandb"), dict):
        record["wandb"] = {k: str(v)[:200] for k, v in data["wandb"].items() if k in ("id", "project", "name")}
    return record


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(values: Any) -> Dict[str, Optional[float]]:
    """launcher.log values: string keys to finite numbers (None where the script logged nan or inf)."""
    if not isinstance(values, dict):
        return {}
    out: Dict[str, Optional[float]] = {}
    for key, value in list(values.items())[:MAX_LOGGED]:
        if isinstance(key, str) and 0 < len(key) <= MAX_KEY and (value is None or _finite(value)):
            out[key] = None if value is None else float(value)
    return out


class StepFiles:
    """The steps/rank-<k>.jsonl files of a run directory, read as they grow (whole lines only)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.folder = Path(run_dir) / STEPS_DIR
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
        return [r for r in (parse(line) for line in lines if line.strip()) if r is not None]


def read_records(run_dir: str | Path) -> List[Dict[str, Any]]:
    """Every record of this launch, oldest first: steps/ holds this launch's alone (a resume, a requeue or a new Ray
    placement moves the earlier launch's into a folder of their own, launcher.rundir.archive_rank_logs), whichever
    node's launcher wrote them (each names its own start as the record's "launch")."""
    return sorted(StepFiles(run_dir).new_records(), key=lambda r: (r["attempt"], r["t"], r["rank"]))
