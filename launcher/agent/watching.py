"""A watcher thread for the length of a block: the hang watchdog and the run directory's guard each run one.

A watcher has ``start()``, ``stop()``, ``join(timeout)`` and ``verdict`` (None until it stopped the job, then
what it saw). Once it has a verdict, whatever the block raised, or its normal end, becomes ``error(verdict)``.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from launcher import interrupts


@contextlib.contextmanager
def watched_by(watcher: Any, error: Callable[[str], BaseException], join_s: float) -> Iterator[Any]:
    interrupts.start_thread(watcher)
    try:
        yield watcher
    except BaseException as e:
        if watcher.verdict:
            raise error(watcher.verdict) from e
        raise
    finally:
        watcher.stop()
        watcher.join(timeout=join_s)
    if watcher.verdict:
        raise error(watcher.verdict)
