"""Reading a run folder's files for the board: paths kept under its output directory, never through a symlink.

Anyone who can write the output folder can plant a symlink in a run (docs/board.md): a
file is opened only when its real path is its own path, and with O_NOFOLLOW for one swapped in since.
"""

from __future__ import annotations

import errno
import io
import json
import os
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO, Dict, List, Optional

from launcher.runtime import safefs


def inside(root: Path, rel: str) -> Optional[Path]:
    """root/rel when it is root or lies under it (symlinks followed); None for anything else (.., /abs)."""
    base = root.resolve()
    if not rel or rel in (".", "/"):
        return base
    if rel.startswith("/") or "\x00" in rel:
        return None
    target = (base / rel).resolve()
    return target if target == base or base in target.parents else None


class NotServed(FileNotFoundError):
    """A file of a run folder reached through a symlink: served as absent (404), whatever it points to."""


def servable(path: Path) -> bool:
    return os.path.realpath(path) == os.path.abspath(path)


def open_served(path: Path) -> BinaryIO:
    """path opened for reading only when its real path is itself: a symlink on the way or at the end (anyone
    who can write the output folder can plant one) could lead outside the board's folder (docs/board.md)."""
    if not servable(path):
        raise NotServed(errno.ENOENT, "a symlink: not served", str(path))
    return os.fdopen(safefs.open_regular(str(path)), "rb")  # and one swapped in since; a FIFO is refused, not waited on


def read_json(path: Path) -> Any:
    try:
        with open_served(path) as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    """Every whole line of a JSONL file; a line being written (no newline yet) is left for the next read."""
    try:
        with open_served(path) as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    return safefs.json_rows([line.encode() for line in text.split("\n")[:-1]])


def tail_lines(path: Path, count: int) -> List[str]:
    try:
        with io.TextIOWrapper(open_served(path), encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in deque(f, maxlen=count)]
    except OSError:
        return []
