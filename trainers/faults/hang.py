"""Test-only fault: one rank stops making progress at a given step, as a rank stuck in a collective would.

Switched on only by environment variables, so no config or command line can trigger it by accident:
LAUNCHER_TEST_HANG_RANK=1 LAUNCHER_TEST_HANG_STEP=5 makes rank 1 sleep forever after step 5.
"""

from __future__ import annotations

import os
import time

from launcher.runtime import env


def maybe_hang(rank: int, step: int) -> None:
    if os.environ.get(env.TEST_HANG_RANK) != str(rank):
        return
    if step != int(os.environ.get(env.TEST_HANG_STEP, "1")):
        return
    print(f"rank {rank}: hanging at step {step} (LAUNCHER_TEST_HANG_RANK)", flush=True)
    while True:
        time.sleep(3600)
