"""The built-in trainer inside a worker process (launcher.worker.bootstrap starts it; scripts never come here)."""

from __future__ import annotations

import errno
import json
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import time
import traceback
from typing import IO, Any, Dict, NoReturn

from launcher.config.schema import from_dict
from launcher.runtime import beats, safefs
from launcher.runtime.diskspace import DiskFullError
from launcher.trainers.faults.stop import STOP
from launcher.trainers.train import train

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # blocked from the worker's fork (launcher/worker/forkserver.py)


def run_trainer(spec: Dict[str, Any], status: IO[str]) -> NoReturn:
    """Train, write this rank's result where the agent reads it, and leave.

    The exit skips the interpreter's teardown: the trainer has closed its loggers and its process
    group already, and a process-group destructor can block forever (the hang at exit that forked
    tutorial scripts showed), so nothing is left for a normal exit to do but risk that.
    """
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # ignored until here (launcher.worker.bootstrap)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # and blocked: one sent since the fork arrives now
        result = train(from_dict(spec["config"]), spec["run_dir"])
    except SystemExit as e:
        _exit_now(e.code if isinstance(e.code, int) else (0 if e.code is None else 1), status)
    except KeyboardInterrupt:
        _exit_now(128 + signal.SIGINT, status)
    except BaseException as e:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            print(f"error: {e.strerror if isinstance(e, DiskFullError) else e}", file=sys.stderr, flush=True)  # one line
        else:
            traceback.print_exc()
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        try:
            ErrorHandler().record_exception(e)  # the agent reads this to name the error
        except OSError:
            pass  # a full disk: the agent names the exit code, the line above says why
        _exit_now(1, status)
    tmp = spec["result_file"] + ".tmp"
    run_dir = os.path.dirname(os.path.dirname(tmp))  # <run_dir>/logs/.result-rank-K.json: nothing below it followed
    # stopped too: a stop after the last step still finished the run
    with safefs.open_file(tmp, "w", root=run_dir, encoding="utf-8") as f:
        json.dump(result, f)
    safefs.replace(tmp, spec["result_file"], root=run_dir)
    if STOP.signum is not None:  # stopped by Ctrl-C/SIGTERM after a checkpoint: the agent is shutting down
        _exit_now(128 + STOP.signum, status)
    _exit_now(0, status)


def _exit_now(code: int, status: IO[str]) -> NoReturn:
    """Leave without running destructors: a process group whose peer is gone can block forever in
    its destructor, which would keep a failed or interrupted worker alive (and the job hung)."""
    beats.disarm()
    _release_multiprocessing_resources()
    try:
        status.write(f"done {code} {time.time()!r}\n")  # launcher.worker.bootstrap's
        status.close()
    except (OSError, ValueError):
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _release_multiprocessing_resources() -> None:
    """What a normal exit does first, minus anything that can block: unlink this process's named
    semaphores (a DataLoader's queues under the spawn or forkserver method) and stop its daemonic
    children (DataLoader workers). Skipped, the launcher's resource tracker printed 'leaked
    semaphore objects' after the job's one-line error."""
    try:
        # priority >= 0: closes and unlinks, never joins. Private: typeshed does not list it
        multiprocessing.util._run_finalizers(0)  # type: ignore[attr-defined]
        for child in multiprocessing.active_children():
            if child.daemon:
                child.terminate()
    except Exception:  # best effort on the way out; the exit code matters more
        pass
