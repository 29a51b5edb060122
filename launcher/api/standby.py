"""A child launcher started ahead of an interactive session's next launch(): its `import torch` is done by then.

A job that runs here starts as `python -m launcher ...` in a process of its own (launcher.api.submit), which imports
torch (about 3 CPU-s, and many seconds of a loaded machine) before any rank starts, where Accelerate's
notebook_launcher forks the notebook's own process, torch already in it. In a Jupyter kernel (or IPython) one
launcher is kept warm instead: `python -u launcher/worker/bootstrap.py standby script IDLE_S PID FD`
(launcher/worker/standby.py) imports torch, forks its zygote and imports the launcher's own modules, as a child
launcher started cold would once started, then waits for its launch on pipe FD; from there it is that launcher.

It is taken only where nothing it started with has changed: the environment, the working folder, the umask, the
CPUs it may run on, the interpreter. Otherwise it is stopped and the launch starts cold, as before. One is started
when the kernel imports launcher (launcher/__init__.py) and when each launch() that ran here has ended, for the
next (none while a job runs, whose CPUs it would take). Until its launch it dies with the process that started it
(and its thread: only the main thread starts one); unused, it ends after IDLE_S seconds, or with stop().
LAUNCHER_STANDBY=0 turns it off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from typing import Any, Dict, List, Optional, Tuple

from launcher.prestart import BOOTSTRAP

IDLE_S = 900.0  # an unused standby (torch's memory, ~300 MB) goes after this long
SWITCH = "LAUNCHER_STANDBY"  # "0": no standby, every launch starts cold
_lock = threading.Lock()
_spare: Optional["Standby"] = None


def enabled() -> bool:
    return os.environ.get(SWITCH, "1") != "0" and sys.platform.startswith("linux")


def _state() -> Tuple[Any, ...]:
    """What a launcher takes from the process that starts it, besides its arguments."""
    with open("/proc/self/status", encoding="ascii", errors="replace") as f:
        umask = next((line for line in f if line.startswith("Umask:")), "")
    return dict(os.environ), os.getcwd(), umask, sorted(os.sched_getaffinity(0)), sys.executable


class Standby:
    """One warm child launcher, waiting for its launch."""

    def __init__(self) -> None:
        self.state = _state()
        theirs, self.pipe = os.pipe()
        try:
            with tempfile.TemporaryFile() as console:  # what it prints before its launch: copied to the launch's console
                self.process = subprocess.Popen(
                    [sys.executable, "-u", BOOTSTRAP, "standby", "script", str(IDLE_S), str(os.getpid()), str(theirs)],
                    stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, pass_fds=(theirs,),
                    start_new_session=True)
        except BaseException:
            os.close(self.pipe)
            raise
        finally:
            os.close(theirs)

    def usable(self) -> bool:
        return self.process.poll() is None and self.state == _state()

    def start(self, args: List[str], console: str, started: float, extra_env: Dict[str, str]) -> Optional[subprocess.Popen]:
        """Launch `python -m launcher ARGS` in it (this environment and extra_env), its console to the file `console`;
        None if it is gone."""
        launch: Dict[str, Any] = {"args": args, "env": {**os.environ, **extra_env}, "cwd": os.getcwd(),
                                  "console": console, "started": started}
        fd, self.pipe = self.pipe, -1
        try:
            with os.fdopen(fd, "wb") as pipe:  # read once its imports are done
                pipe.write(json.dumps(launch).encode() + b"\n")
        except OSError:  # it ended since usable() (killed, out of memory): the launch starts cold
            self.stop()
            return None
        return self.process

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        if self.pipe >= 0:
            os.close(self.pipe)
            self.pipe = -1


def take() -> Optional[Standby]:
    """The warm launcher, where it can run a launch now; None otherwise (one that cannot is stopped)."""
    global _spare
    with _lock:
        found, _spare = _spare, None
    if found is not None and not found.usable():
        found.stop()
        return None
    return found


def prepare() -> None:
    """Start a warm launcher for the next launch, unless one is there, in an interactive Python (a Jupyter kernel,
    IPython) and from its main thread (the standby dies with the thread that started it)."""
    global _spare
    with _lock:
        if _spare is None and enabled() and interactive() and threading.current_thread() is threading.main_thread():
            _spare = Standby()


def interactive() -> bool:
    """A Jupyter kernel or an IPython shell runs here: launch() is called cell after cell."""
    ipython = sys.modules.get("IPython")
    return ipython is not None and getattr(ipython, "get_ipython", lambda: None)() is not None


def stop() -> None:
    """No warm launcher from now (until the next prepare())."""
    found = take()
    if found is not None:
        found.stop()
