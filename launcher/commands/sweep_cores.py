"""Members that run at once share this machine's cores: each runs on a slice of its own, as `taskset` would give it.

A member plans its threads per worker from the cores it may run on (launcher.plan.detect_hardware reads the
process's affinity). Started with every core, each of N members took them all, and N x cores OpenMP threads
spun against each other at every barrier: a sweep of 3 quick members, 2 at a time on 2 cores, ran 0.1 s a
step where one member alone runs 1.5 ms. A user who exported OMP_NUM_THREADS chose the threads: then no
member is pinned.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, List, Optional


def core_slices(cores: List[int], parallel: int) -> List[List[int]]:
    """parallel slices of cores, as even as they go; more slices than cores share them round-robin."""
    n = len(cores)
    if parallel >= n:
        return [[cores[i % n]] for i in range(parallel)]
    return [cores[i * n // parallel:(i + 1) * n // parallel] for i in range(parallel)]


class CoreSlots:
    """One slice of cores per member running at once; a finished member's slice goes to the next."""

    def __init__(self, parallel: int) -> None:
        cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
        pin = parallel > 1 and len(cores) > 1 and "OMP_NUM_THREADS" not in os.environ
        self.slices = core_slices(cores, parallel) if pin else []
        self.free = list(range(len(self.slices)))
        if pin:
            print(f"sweep: {parallel} members at a time share {len(cores)} cores: each runs on its own "
                  f"{len(self.slices[0])} (export OMP_NUM_THREADS to choose threads yourself)", file=sys.stderr, flush=True)

    def take(self) -> Optional[int]:
        return self.free.pop(0) if self.free else None

    def give_back(self, slot: Optional[int]) -> None:
        if slot is not None:
            self.free = sorted([*self.free, slot])

    def pin(self, slot: Optional[int]) -> Optional[Callable[[], None]]:
        """What the member's process runs before it starts (subprocess's preexec_fn): its slice, or nothing."""
        if slot is None:
            return None
        cores = self.slices[slot]
        return lambda: os.sched_setaffinity(0, cores)
