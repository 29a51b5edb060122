"""A worker's record writes, off its training thread. Stdlib only; executed into a worker's progress namespace before
progress.py (launcher.worker.progress.WORKER_FILES), as loaders.py is.

The step watch (progress.py) hands each window's work (its step record, goodput record and launcher.log series,
as a function) to one daemon thread of the worker, `launcher-records`, started at the first such work: the
training step never waits for JSON or the disk. close() runs what is queued and ends the thread (the script has
returned); work queued when a process dies with a signal is lost with it, as its unflushed stdout is.
"""

import collections
import sys
import threading

WRITER_THREAD = "launcher-records"  # docs/torchrun.md names it: the one thread of ours in a script's worker
CLOSE_WAIT_S = 10.0  # at the script's end, how long the last writes may take (a slow disk) before they are dropped


class Writer:
    """submit(work) from any thread; the writer thread runs each work() in order, any exception its own to report."""

    def __init__(self) -> None:
        self.work: "collections.deque" = collections.deque()
        self.ready = threading.Condition(threading.Lock())
        self.thread: "threading.Thread | None" = None
        self.closed = False

    def submit(self, work: "object") -> None:
        with self.ready:
            if self.closed:
                return
            self.work.append(work)
            if self.thread is None:
                self.thread = threading.Thread(target=self.run, name=WRITER_THREAD, daemon=True)
                self.thread.start()
            self.ready.notify()

    def run(self) -> None:
        while True:
            with self.ready:
                while not self.work and not self.closed:
                    self.ready.wait()
                if not self.work:
                    return
                work = self.work.popleft()
            try:
                work()
            except Exception as e:  # noqa: BLE001  (a record's bug must not end the records after it, nor the step)
                print(f"launcher: a step record was not written ({type(e).__name__}: {e})", file=sys.stderr)

    def close(self) -> None:
        """Run what is queued, then end the thread (at most CLOSE_WAIT_S)."""
        with self.ready:
            self.closed = True
            self.ready.notify()
            thread = self.thread
        if thread is not None:
            thread.join(CLOSE_WAIT_S)
