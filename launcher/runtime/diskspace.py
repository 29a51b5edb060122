"""Running out of disk: telling it apart from other write errors, and saying how much is left."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import List, Optional, Set

FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """A save ran out of space (ENOSPC, EDQUOT): the half-written checkpoint is gone, the previous one intact."""


def disk_full(error: BaseException) -> Optional[OSError]:
    """The out-of-space OSError inside error (DCP wraps each rank's in `failures`), if there is one."""
    seen: Set[int] = set()
    todo: List[Optional[BaseException]] = [error]  # None: an error without a cause or context
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL:
            return e
        failures = getattr(e, "failures", None)
        for f in (failures.values() if isinstance(failures, dict) else ()):
            todo.append(f[0] if isinstance(f, tuple) else f)
        todo += [e.__cause__, e.__context__]
    return None


def nearly_full(path: Path) -> bool:
    """Under 1 MiB or 1% left: a failed write there ran out of space, whatever its error said."""
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return False
    return usage.free < max(1 << 20, usage.total // 100)


def free_space(path: Path) -> str:
    """Free space on path's file system, e.g. '12.0 KiB'."""
    try:
        free = float(shutil.disk_usage(path).free)
    except OSError:
        return "unknown space"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if free < 1024 or unit == "GiB":
            return f"{free:.0f} {unit}" if unit == "bytes" else f"{free:.1f} {unit}"
        free /= 1024
    return ""


def full_while_writing(what: str, path: Path, full: OSError) -> DiskFullError:
    """The one line for a write that ran out of space outside a checkpoint: what, where, how much is left, the fix."""
    return DiskFullError(full.errno, f"disk full while writing {what} {path} ({free_space(path.parent)} free there): "
                                     "free space or point output_dir elsewhere")
