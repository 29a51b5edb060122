"""When the user's command started, so start-up time (to the first step) is counted honestly.

IMPORTED_AT (when the launcher's run path was imported) is the fallback where the process's own
creation time is not the command's.
"""

from __future__ import annotations

import os
import time
from typing import Optional

import psutil

from launcher import prestart

IMPORTED_AT = time.time()
MAX_INTERPRETER_START_S = 5.0  # Python's own start before the launcher's first import takes well under this


def process_start_time() -> float:
    """This process's creation time, or IMPORTED_AT where that creation time is not the command's.

    A process that a shell exec'd into keeps the shell's creation time (`(pip install ... && python
    -m launcher)` counted the install), so a creation time far before our first line is not used.
    """
    asked = prestart.started_at()
    if asked is not None:  # a launcher started ahead of its launch (launcher.api.standby): the call's time
        return asked
    created = _created_from_proc()
    if created is None:
        try:
            created = psutil.Process().create_time()
        except psutil.Error:
            return IMPORTED_AT
    return created if IMPORTED_AT - created < MAX_INTERPRETER_START_S else IMPORTED_AT


def started_at(pid: int) -> Optional[float]:
    """When process pid was created (psutil's clock), or None where there is no such process (or only its zombie:
    it has ended, its parent has not reaped it yet)."""
    try:
        process = psutil.Process(pid)
        return None if process.status() == psutil.STATUS_ZOMBIE else float(process.create_time())
    except psutil.Error:
        return None


def still_running(pid: int, started: Optional[float]) -> bool:
    """Whether the process recorded as (pid, started_at(pid)) still runs: its pid, not reused by another since."""
    now = started_at(pid)
    return now is not None and (started is None or abs(now - started) < 1.0)


def _created_from_proc() -> Optional[float]:
    """Linux: this process's creation time to a clock tick (10 ms).

    psutil's create_time adds the start tick to /proc/stat's boot time, which is whole seconds: it read
    up to a second early here (0.88 s), and every start-up figure was that much too long.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, starttime: ticks after boot
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return time.time() - since_boot
