"""The .call-* folders of launcher.launch and launcher.submit, beside the run directories: made, and removed once
abandoned.

Each holds one call's pickled function and key (launcher.api.payload) and its child launcher's console, and OWNER:
the pids (with their start times) of the caller and of the child launcher it started. A job that ends under its
caller's eye has its folder removed by the caller (launcher.api.job); a caller killed with SIGKILL used to leave it
forever. The next launch from the same output folder removes each folder of this user whose caller and child
launcher are both gone and whose run is not going on (a SLURM or Ray job can still be queued or running after the
launcher that submitted it ended: its ranks read the call from there).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.clock import started_at, still_running

PREFIX = ".call-"
OWNER = "owner.json"
SETTING_UP_S = 60.0  # a folder without OWNER this young is one being made now


def make_folder(output_dir: Path, run_id: str) -> Path:
    """A new 0700 folder for one call, recording this process as its caller."""
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{run_id}-", dir=output_dir))  # `ls` skips dot folders
    record_owners(folder, None)
    return folder


def record_owners(folder: Path, child: Optional[int]) -> None:
    """OWNER: the caller (this process) and, once started, the child launcher; replaced whole (a rename)."""
    owners = [(pid, started_at(pid)) for pid in (os.getpid(), child) if pid is not None]
    temporary = folder / f".{OWNER}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps([{"pid": pid, "started": started} for pid, started in owners]))
    os.replace(temporary, folder / OWNER)


def remove_abandoned(output_dir: Path) -> List[Path]:
    """Remove the call folders in output_dir that nothing needs any more (see the module's docstring); those removed."""
    removed: List[Path] = []
    try:
        entries = [e for e in os.scandir(output_dir) if e.name.startswith(PREFIX)]
    except OSError:
        return removed
    for entry in entries:
        folder = Path(entry.path)
        if _abandoned(folder, output_dir / entry.name[len(PREFIX):].rsplit("-", 1)[0]):
            shutil.rmtree(folder, ignore_errors=True)  # which follows no link inside it
            removed.append(folder)
    return removed


def _abandoned(folder: Path, run_dir: Path) -> bool:
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False  # a link, a file, another user's: never ours to remove
    try:
        with os.fdopen(os.open(folder / OWNER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)) as f:
            owners: Any = json.loads(f.read(1 << 16))
    except FileNotFoundError:
        return time.time() - st.st_mtime > SETTING_UP_S  # its caller was killed as it made the folder
    except (OSError, ValueError, RecursionError):
        return False  # unreadable: left as it is
    if not isinstance(owners, list) or not all(_is_owner(o) for o in owners):
        return False
    if any(still_running(o["pid"], o.get("started")) for o in owners):
        return False
    return not _run_goes_on(run_dir)


def _is_owner(owner: Dict[str, Any]) -> bool:
    return isinstance(owner, dict) and isinstance(owner.get("pid"), int) and \
        isinstance(owner.get("started"), (int, float, type(None)))


def _run_goes_on(run_dir: Path) -> bool:
    """Whether the call's run is still going on, as its engine tells (a SLURM job queued after its launcher ended)."""
    from launcher.backends import registry

    if not ((run_dir / "job.json").is_file() or (run_dir / "plan.json").is_file()):
        return False
    try:
        return not registry.backend_of_run(run_dir).describe(run_dir).final
    except Exception:  # an engine that cannot tell (sacct unreachable): keep the call, the job may need it
        return True
