"""The launcher's own imports: the collector paused while torch loads, and what loaded frozen.

``import torch`` allocates millions of long-lived objects, and Python's cyclic garbage collector
scans them over and over while they load (0.9 s with it, 0.85 s without, torch 2.13, 2 cores).
Paused, they all stay in the youngest generation, and the next collections would scan every one
of them as they age: frozen (gc.freeze), they are never scanned again. A launcher's collections
took 0.09-0.24 CPU-s, frozen 0.01-0.02 (2026-11-27, gc.callbacks).
The workers' imports happen in the zygote (launcher.worker.bootstrap), which does the same.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside (for import-heavy stretches); what was made until its end is frozen
    (modules, long-lived: the collector would otherwise rescan it all); the collector as it was after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()
