"""Ctrl-C, SIGTERM and SIGHUP at any moment of the launcher's life. Standard library only, and little of
it: launcher.__main__ installs this first, before anything else loads.

Why not Python's KeyboardInterrupt from the start: one raised inside an import escapes as a traceback
from wherever it lands (importlib, a class body, numpy's C extension, which turns it into an
ImportError), and one raised between "run directory made" and "summary written" leaves a run nobody
can read. So, in order:

- ``hold()``: while the launcher imports and plans, nothing of it exists on disk; a stop signal ends
  the process at once (one line, exit 128+signal). Its zygote dies with it (PR_SET_PDEATHSIG).
- ``deferred()``: while it makes the run directory, a signal is recorded, not raised.
- ``release()``: from here the backends clean up after an Interrupted (a KeyboardInterrupt) themselves;
  a signal recorded before is raised now.
- ``recording()``: once torch's agent has returned, a signal is recorded again: the handlers it leaves
  behind (torch's, raising its SignalException) would raise anywhere, in the middle of summary.json or
  in an atexit handler, as a traceback.
- ``settled()``: the run's summary says "completed": a stop signal, recorded before or coming later, is
  dropped (the one recorded is returned, to be named): the job is done, and an exit of 130 or 143 would
  contradict summary.json and send a resume that has nothing left to train.
- ``conclude()``: the command has its exit code; a signal recorded before is raised now, to end in the
  one "interrupted" line, and any later one is dropped: the exit only waits for the zygote to end.
  Through the interpreter's own teardown too: it resets the handlers to the default first, and a
  SIGTERM there would end a completed run's launcher with -15; the signals are ignored for it instead.
- ``end(code)``: the launcher process's own end (``python -m launcher``, the ``launcher`` command): after
  its threads and every atexit handler, it exits with code at once. The interpreter's teardown (a
  garbage collection, then clearing torch's thousands of modules) would cost about 0.4 CPU-s more in
  every launcher process, nodes' included, and hold nothing of ours to flush but stdout and stderr.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator  # not typing: it would add to what loads before the hold

from launcher.errors import Interrupted
from launcher.prestart import HELD  # the stop signals: one tuple, kept blocked across prestart's exec

TYPE_CHECKING = False  # typing's, without importing typing (see above); type checkers read it as true
if TYPE_CHECKING:
    import threading


class _State:
    mode = "off"  # off: raise | exit: end the process at once | record: keep for release() | quiet: drop
    pending: int | None = None  # the first signal that came while recording
    teardown_guarded = False
    exit_code: int | None = None  # set by end(): the process ends with it after the last atexit handler


def _held(signum: int, _frame: object) -> None:
    if _State.mode == "exit":
        os.write(2, b"interrupted\n")
        os._exit(128 + signum)  # not sys.exit: SystemExit inside an import is as bad as KeyboardInterrupt
    if _State.pending is None and _State.mode == "record":
        _State.pending = signum


def _interrupt(signum: int, _frame: object) -> None:
    raise Interrupted(signum)


def hold() -> None:
    """From now on until release(), a stop signal ends the process at once (nothing to undo yet)."""
    if _State.mode not in ("off", "quiet"):
        return
    _State.mode = "exit"
    for sig in HELD:
        signal.signal(sig, _held)
    if not _State.teardown_guarded:  # registered first, so it runs last of the atexit handlers
        _State.teardown_guarded = True
        atexit.register(_at_the_end)


def _at_the_end() -> None:
    """After conclude(), the stop signals stay dropped through the interpreter's teardown; after end(), there
    is none (module docstring)."""
    if _State.mode == "quiet":
        for sig in HELD:  # ignored, not blocked: a mask is one thread's, and torch's threads would take it
            signal.signal(sig, signal.SIG_IGN)  # the teardown resets Python's own handlers, never SIG_IGN
    if _State.exit_code is not None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed, or gone (a reader that went away)
                pass
        os._exit(_State.exit_code)


def end(code: int) -> None:
    """End the launcher process with code: threads joined and atexit handlers run, as sys.exit does, then no
    interpreter teardown (module docstring). Only for the process's entry point, never a library call."""
    if _State.teardown_guarded and 0 <= code <= 255:
        _State.exit_code = code
    sys.exit(code)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside, a stop signal is recorded: what is made inside is made whole; release() raises it after."""
    hold()
    _State.mode = "record"
    yield


def release() -> None:
    """Signals raise again (SIGTERM and SIGHUP like Ctrl-C, exit 128+signal); one recorded before, now."""
    if _State.mode != "off":
        _State.mode = "off"
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in HELD[1:]:
            signal.signal(sig, _interrupt)
    signum, _State.pending = _State.pending, None
    if signum is not None:
        raise Interrupted(signum)


def recording() -> None:
    """From now on a stop signal is recorded, for conclude() to raise (see the module's docstring)."""
    _State.mode = "record"
    late = _handle_with(_held)
    if _State.pending is None:
        _State.pending = late


def settled() -> int | None:
    """The run completed and its summary is written: from now on a stop signal is dropped; the one recorded
    before is returned (see the module's docstring)."""
    _State.mode = "quiet"
    late = _handle_with(_held)
    signum, _State.pending = _State.pending, None
    return signum or late


def conclude() -> None:
    """The command has its exit code: a signal recorded before is raised now; from now on one is dropped."""
    signum = settled()
    if signum is not None:
        raise Interrupted(signum)


def _handle_with(handler: Callable[[int, object], None]) -> int | None:
    """Install handler for every stop signal; a signal pending under the handler before it (whose raise
    signal.signal runs first, Python's KeyboardInterrupt or torch's SignalException) is returned, not raised."""
    caught = None
    for sig in HELD:
        try:
            signal.signal(sig, handler)
        except (KeyboardInterrupt, Exception) as e:  # noqa: BLE001  (the one before, raised by its handler)
            signal.signal(sig, handler)
            caught = caught or int(getattr(e, "sigval", signal.SIGINT))
    return caught


def start_thread(thread: threading.Thread) -> None:
    """thread.start() with a stop signal kept over it, then raised. One raised inside start() (torch's agent handler
    raises SignalException, an Exception) made threading undo its record of the thread, which had started: a
    KeyError traceback from the new thread ("Exception ignored in thread started by"), beside the one-line stop."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        thread.start()
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: caught.append(signum)) for sig in HELD}
    try:
        thread.start()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if caught:
            signal.raise_signal(caught[0])  # to the handler before, now that the thread is whole


@contextlib.contextmanager
def blocked_for_child() -> Iterator[None]:
    """A child started inside begins with the stop signals blocked (it unblocks them once it has set its
    own handlers: launcher.worker.bootstrap); here they stay pending, not lost, and arrive on exit."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
