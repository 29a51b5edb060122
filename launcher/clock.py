"""When the user's command started, so start-up time (to the first step) is counted honestly.

IMPORTED_AT (when the launcher's run path was imported) is the fallback where the process's own
creation time is not the command's.
"""

from __future__ import annotations

import time

import psutil

IMPORTED_AT = time.time()
MAX_INTERPRETER_START_S = 5.0  # Python's own start before the launcher's first import takes well under this


def process_start_time() -> float:
    """This process's creation time, or IMPORTED_AT where that creation time is not the command's.

    A process that a shell exec'd into keeps the shell's creation time (`(pip install ... && python
    -m launcher)` counted the install), so a creation time far before our first line is not used.
    """
    try:
        created = psutil.Process().create_time()
    except psutil.Error:
        return IMPORTED_AT
    return created if IMPORTED_AT - created < MAX_INTERPRETER_START_S else IMPORTED_AT
