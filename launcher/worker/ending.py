"""How a launch()/submit() rank's process ends (launcher.api.worker's: launcher/worker/bootstrap.py calls this once
the function returned and the rank's status is written). Stdlib only.

As multiprocessing's children end (mp.spawn's, Accelerate's notebook_launcher's): without the interpreter's
teardown of torch's modules, 0.5-0.9 s a rank. A script's ranks, or any other module's, exit as under torchrun.
"""

import atexit
import gc
import io
import os
import signal
import sys
import threading


def end_as_a_child(code: int) -> None:
    """Exit as multiprocessing's Process does after its target: non-daemon threads joined; then, unlike it, what a
    user sees of an interpreter's exit: the atexit handlers (wandb.finish, a logger's), every open file flushed
    (one the function left open keeps what it wrote); then os._exit. Objects' __del__ at teardown do not run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the function's work is done: a Ctrl-C now is the launcher's
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter's exit calls first (private)
        atexit._run_exitfuncs()
    finally:
        # (the zygote's objects were frozen before the fork: these are the worker's own, a few hundred thousand)
        files = [o for o in gc.get_objects() if isinstance(o, (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom))]
        for stream in [*files, sys.stdout, sys.stderr]:
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed, or a pipe gone
                pass
        os._exit(code)
