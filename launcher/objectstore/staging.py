"""The local staging folder of a run whose output_dir is an object-store URL, and the ones a killed launcher left.

A launch writes its run directory in a private staging folder (mkdtemp: 0700, new, ours) under the system's temp
directory, which launcher.objectstore.runrecord uploads; the launch removes it once nothing more is needed from it.
It holds OWNER: the launcher's pid, that process's start time and the URL, so that a folder whose launcher is gone
(SIGKILL, a lost machine, an upload that failed) is named by the next `ls URL` and `resume URL/RUN` on this machine,
where it used to stay in the temp directory named nowhere: what of the run was not uploaded yet is in it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from launcher.clock import started_at, still_running
from launcher.runtime import safefs
from launcher.runtime.objects import is_url

log = logging.getLogger("launcher")
PREFIX = "launcher-staging-"
OWNER = ".owner.json"  # a dot name: no run id, never part of the record
Stat = Tuple[int, int]


def staging_top(output_dir: str, make: bool) -> str:
    """Where runs go on this machine: output_dir itself, or for a URL a new private staging folder."""
    if not is_url(output_dir):
        return output_dir
    if not make:  # a dry run: the plan shows the shape of the path; nothing is made
        return os.path.join(tempfile.gettempdir(), f"{PREFIX}XXXXXXXX")
    return tempfile.mkdtemp(prefix=PREFIX)


class Staging:
    """A launch's staging folder (staging_top), removed by that launch once nothing more is needed from it: on the
    head once the whole record is up, on another node once the job ended and its files reached the head. Only the
    folder made here goes: never a link, nor a folder put in its place (rmtree follows no link below it either)."""

    def __init__(self, output_dir: str, make: bool) -> None:
        self.path = staging_top(output_dir, make)
        self._made: Optional[Stat] = None  # (device, inode) of the folder mkdtemp made, while it is ours to remove
        if make and is_url(output_dir):
            st = os.lstat(self.path)
            self._made = (st.st_dev, st.st_ino)
            owner = {"pid": os.getpid(), "started": started_at(os.getpid()), "url": output_dir.rstrip("/")}
            with safefs.open_file(os.path.join(self.path, OWNER), "x", root=self.path, encoding="utf-8") as f:
                f.write(json.dumps(owner))  # the same pid after launcher.prestart's exec

    def keep(self, why: Optional[str] = None) -> None:
        """Something in it is needed still (an upload failed, files did not reach the head): it stays, named."""
        if self._made is not None and why:
            log.warning(why)
        self._made = None

    def remove(self) -> None:
        """Remove the folder made here, unless kept; a no-op for a local output_dir or a dry run."""
        made, self._made = self._made, None
        try:
            st = os.lstat(self.path) if made is not None else None
        except OSError:
            return
        if st is not None and stat.S_ISDIR(st.st_mode) and (st.st_dev, st.st_ino) == made:
            shutil.rmtree(self.path, ignore_errors=True)


def left_behind(url: str) -> Dict[str, Path]:
    """Run id -> the staging folder that holds it, of every staging folder of this user under the temp directory
    whose launcher is gone and whose URL is url (or a run's under it, url/RUN)."""
    found: Dict[str, Path] = {}
    url = url.rstrip("/")
    try:
        entries = list(os.scandir(tempfile.gettempdir()))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.startswith(PREFIX):
            continue
        owner = _dead_owner(Path(entry.path))
        if owner is None:
            continue
        for run in _runs(Path(entry.path)):
            if url in (owner["url"], f"{owner['url']}/{run}"):
                found[run] = Path(entry.path)
    return found


def _dead_owner(folder: Path) -> Optional[Dict[str, str]]:
    """The folder's owner record, where the folder is this user's own (no link) and its launcher has ended."""
    try:
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return None
        owner = json.loads(safefs.read_bytes(str(folder / OWNER), root=str(folder)))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int) or not isinstance(owner.get("url"), str):
        return None
    started = owner.get("started")
    alive = still_running(owner["pid"], float(started) if isinstance(started, (int, float)) else None)
    return None if alive else {"url": owner["url"].rstrip("/")}


def _runs(folder: Path) -> List[str]:
    try:
        return sorted(e.name for e in os.scandir(folder) if e.is_dir(follow_symlinks=False) and not e.name.startswith("."))
    except OSError:
        return []


def name_left_behind(url: str) -> Dict[str, Path]:
    """Say on stderr which staging folders under the temp directory a launcher of url's runs left when it ended
    without uploading all (killed, or its upload failed); run id -> folder."""
    found = left_behind(url)
    for run, folder in sorted(found.items()):
        print(f"note: run {run}'s launcher ended without uploading all of its record; what it had is left in "
              f"{folder / run} (remove {folder} once you have what you need)", file=sys.stderr)
    return found
