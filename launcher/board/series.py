"""A script's launcher.log() values for the run page's charts: every call, from series/rank-<k>.jsonl (one line per
call: launcher.runtime.schema.SERIES), downsampled for display only.

Each key is one chart: rank 0's calls, or every rank's line for calls made with per_rank=True, at the step of the
charts' axis (the launch's steps across restarts, as metrics.jsonl counts them); a key logged with step=N is
charted at those steps, on an axis of its own. A series longer than MAX_POINTS is drawn from the smallest and the
largest value of each of MAX_POINTS / 2 runs of neighbouring calls, so a spike stays on the chart; the chart
says how many of how many calls it shows. The files are read incrementally (a poll reads only what was appended
since the last one), each through open_served: never through a symlink.
"""

from __future__ import annotations

import json
import math
import os
import threading
from array import array
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from launcher.board.events import attempt_offsets
from launcher.board.files import open_served, servable
from launcher.runtime.schema import SERIES, SERIES_DIR

MAX_POINTS = 2000
MAX_KEYS = 12  # charts of launcher.log keys on a run page (every key is in the files)
MAX_FILES_KEPT = 64  # series files the board keeps parsed, the least recently read forgotten first

Group = Tuple[Optional[int], bool, int]  # (rank for a per_rank call, else None; own step=; attempt)


class SeriesFile:
    """One rank's series file, parsed so far: per key and group, the calls' steps and values in order."""

    def __init__(self, identity: Tuple[int, int]) -> None:
        self.identity, self.offset, self.partial = identity, 0, b""
        self.calls: Dict[str, Dict[Group, Tuple[array, array]]] = {}

    def feed(self, data: bytes) -> None:
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()  # a line being written: parsed once it is whole
        for line in lines:
            try:
                entry = SERIES.read(json.loads(line))
            except (ValueError, RecursionError):
                continue
            if not entry or not isinstance(entry.get("values"), dict):
                continue
            group = (entry["rank"] if entry.get("per_rank") else None, bool(entry.get("own_step")), entry["attempt"])
            for key, value in entry["values"].items():
                steps, values = self.calls.setdefault(str(key), {}).setdefault(group, (array("q"), array("d")))
                steps.append(entry["step"])
                values.append(float("nan") if value is None else float(value))


_lock = threading.Lock()
_files: Dict[str, SeriesFile] = {}


def read_series(path: Path) -> Optional[SeriesFile]:
    """The file parsed up to its end now: what was appended since the last read is parsed, a file replaced (another
    inode, or shorter) is read again from its start; None for no file or a symlink."""
    try:
        with open_served(path) as f:
            st = os.fstat(f.fileno())
            with _lock:
                known = _files.pop(str(path), None)
                if known is None or known.identity != (st.st_dev, st.st_ino) or st.st_size < known.offset:
                    known = SeriesFile((st.st_dev, st.st_ino))
                _files[str(path)] = known  # the most recently read last
                while len(_files) > MAX_FILES_KEPT:
                    del _files[next(iter(_files))]
                f.seek(known.offset)
                data = f.read(max(0, st.st_size - known.offset))
                known.offset += len(data)
                known.feed(data)
                return known
    except OSError:
        return None


def logged_series(run_dir: Path, metrics: List[Dict[str, Any]]) -> Dict[str, Any]:
    """{key: {own_step, calls (how many), shown, traces: [{name, x, y}]}} for the first MAX_KEYS keys of every
    rank's series file; {} for a run without (the built-in trainer's)."""
    folder = run_dir / SERIES_DIR
    if not (servable(folder) and folder.is_dir()):
        return {}
    offsets = attempt_offsets(metrics)
    files = [f for f in (read_series(p) for p in sorted(folder.glob("rank-*.jsonl"))) if f is not None]
    merged: Dict[str, Dict[Group, Tuple[array, array]]] = {}
    for parsed in files:
        with _lock:
            for key, groups in parsed.calls.items():
                for group, (steps, values) in groups.items():
                    merged.setdefault(key, {})[group] = (array("q", steps), array("d", values))
    return {key: chart(merged[key], offsets) for key in sorted(merged)[:MAX_KEYS]}


def chart(groups: Dict[Group, Tuple[array, array]], offsets: Dict[int, int]) -> Dict[str, Any]:
    """One key's traces: rank 0's line (or each rank's), attempts joined at the launch's step, downsampled."""
    own = any(group[1] for group in groups)
    by_rank: Dict[Optional[int], Tuple[List[int], List[float]]] = {}
    for (rank, own_step, attempt), (steps, values) in sorted(groups.items(), key=lambda g: (g[0][0] or 0, g[0][2])):
        shift = 0 if own_step else offsets.get(attempt, max(offsets.values(), default=0) if attempt else 0)
        xs, ys = by_rank.setdefault(rank, ([], []))
        xs.extend(s + shift for s in steps)
        ys.extend(values)
    traces, calls, shown = [], 0, 0
    for rank, (xs, ys) in sorted(by_rank.items(), key=lambda r: -1 if r[0] is None else r[0]):
        x, y = downsample(xs, ys, MAX_POINTS // max(1, len(by_rank)) if len(by_rank) > 4 else MAX_POINTS)
        calls, shown = calls + len(xs), shown + len(x)
        traces.append({"name": "rank 0" if rank is None else f"rank {rank}", "x": x,
                       "y": [None if math.isnan(v) else v for v in y], "per_rank": rank is not None})
    return {"own_step": own, "calls": calls, "shown": shown, "traces": traces}


def downsample(xs: List[int], ys: List[float], limit: int) -> Tuple[List[int], List[float]]:
    """At most `limit` points: each of limit // 2 runs of neighbouring calls as its smallest and largest value, in
    the order they came (nan, a value not a number, is left out of a run's extremes)."""
    if len(xs) <= limit:
        return list(xs), list(ys)
    buckets = max(1, limit // 2)
    out_x: List[int] = []
    out_y: List[float] = []
    for b in range(buckets):
        start, end = len(xs) * b // buckets, len(xs) * (b + 1) // buckets
        chunk = [v for v in ys[start:end] if not math.isnan(v)]
        if not chunk:
            continue
        first, second = ys.index(min(chunk), start, end), ys.index(max(chunk), start, end)
        for i in sorted({first, second}):
            out_x.append(xs[i])
            out_y.append(ys[i])
    return out_x, out_y
