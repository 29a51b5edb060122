"""Warm workers: the agent imports what they need once, and forks them from itself.

Two measured costs shape this module (torch 2.13, 2 cores):
- ``import torch`` and ``import torch._dynamo`` (which DDP's constructor pulls in) allocate
  millions of long-lived objects, and Python's cyclic garbage collector scans them over and over
  while they load: 0.9 + 0.9 s with it, 0.85 + 0.63 s without. The agent pauses the collector
  while it imports, then freezes what it loaded (``gc.freeze``: never scanned again, and the pages
  stay shared with forked workers instead of being copied when the collector touches them) and
  turns it back on before any worker starts.
- The imports take a second; the agent's own start (run directory, rendezvous) mostly waits on
  files and sockets. ``Preload`` runs the imports in a thread alongside it.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator, Optional


def preload_for_workers() -> None:
    """Import what every worker needs once, in the agent, so forked workers start warm.

    Imports only: no tensor is created and no thread pool started before the fork.
    """
    import psutil  # noqa: F401  (the step meter's)
    import torch._dynamo  # noqa: F401  (DDP's constructor imports it: seconds per worker otherwise)
    import torch.nn.parallel  # noqa: F401
    import trainers.train  # noqa: F401


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection inside (for import-heavy stretches); back as it was after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was and not Preload.running():  # the preload thread turns it back on when it is done
            gc.enable()


class Preload:
    """preload_for_workers in a thread of the agent, overlapping the agent's own start.

    ``wait()`` joins it: the agent calls it just before it forks its workers (RunDirLogsSpecs.reify),
    because a fork must never happen while another thread is importing (the child would inherit a
    held import lock). Whatever the agent itself imports is imported before the thread starts, so
    the two threads never import the same modules. The collector stays paused while it runs.
    """

    _thread: Optional[threading.Thread] = None
    _error: Optional[BaseException] = None
    _collector_was_on = True

    @classmethod
    def start(cls) -> None:
        if cls._thread is not None:
            return
        import torch.distributed.elastic.agent.server.local_elastic_agent  # noqa: F401  (the agent's own
        import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend  # noqa: F401  imports, made here
        import torch.distributed.elastic.rendezvous.dynamic_rendezvous  # noqa: F401  before the thread runs)
        import torch.distributed.elastic.rendezvous.static_tcp_rendezvous  # noqa: F401
        import torch.distributed.launcher.api  # noqa: F401

        def load() -> None:
            try:
                preload_for_workers()
            except BaseException as e:  # raised again by wait(), on the agent's main thread
                cls._error = e

        cls._collector_was_on = gc.isenabled()
        gc.disable()
        cls._thread = threading.Thread(target=load, name="launcher-preload", daemon=True)
        cls._thread.start()

    @classmethod
    def running(cls) -> bool:
        return cls._thread is not None and cls._thread.is_alive()

    @classmethod
    def wait(cls) -> None:
        """Join the imports; freeze what they loaded and turn the collector back on (before a fork)."""
        if cls._thread is None:
            return
        cls._thread.join()
        if cls._collector_was_on and not gc.isenabled():
            gc.freeze()
            gc.enable()
        if cls._error is not None:
            raise cls._error
