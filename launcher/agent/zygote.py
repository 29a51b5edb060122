"""The agent's side of the zygote: one warm, single-threaded process per node that forks the workers.

Why a separate process instead of forking the agent itself: the agent has threads (rendezvous
keep-alive, the store's event loop, the watchdog, the output reader) and has imported the
launcher, omegaconf and ``torch._dynamo``. A fork from it inherited all of that: scripts found
the project's packages shadowing their own, ``multiprocessing.set_start_method`` failed, and
workers hung at exit in a process-group destructor 8 times in 20 (docs/performance.md). The zygote
(launcher.worker.bootstrap) is a fresh interpreter that imports torch (and, for the built-in trainer,
its modules) and nothing else, started at the launcher's first moment so that its imports overlap
the agent's own start and the rendezvous.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from launcher import prestart
from launcher.errors import LaunchError
from launcher.interrupts import blocked_for_child

BOOTSTRAP = prestart.BOOTSTRAP
READY_TIMEOUT_S = 300.0  # importing torch on a loaded machine can take a while; a broken install fails fast


class Zygote:
    """The running zygote of this process (one per node agent)."""

    _current: Optional["Zygote"] = None
    proc: subprocess.Popen[bytes] | ForkedChild  # one it started, or the one forked at the launcher's start (adopt)

    def __init__(self, kind: str, env: Dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.kind = kind
        # It shares our process group, so a terminal's Ctrl-C reaches it too: it starts with the stop
        # signals blocked, ignores them, then unblocks (launcher.worker.bootstrap), or a Ctrl-C during its
        # interpreter's start would print a traceback from there.
        with blocked_for_child():
            self.proc = subprocess.Popen(
                [sys.executable, "-u", BOOTSTRAP, "zygote", kind, str(os.getpid()), str(theirs.fileno())],
                env=env, pass_fds=(theirs.fileno(),), close_fds=True,
            )
        theirs.close()
        self.sock = ours
        self.ready = False
        self.exits: Dict[int, int] = {}  # pid -> exit code (negative: killed by that signal)
        self.exited_at: Dict[int, float] = {}  # pid -> when the zygote reaped it (time.time(), within 50 ms)
        self._next_id = 0

    @classmethod
    def start(cls, kind: str, env: Optional[Dict[str, str]] = None) -> "Zygote":
        """Start this process's zygote (once), or take the one forked at the launcher's start (launcher.prestart);
        it imports while the caller goes on."""
        if cls._current is None or cls._current.proc.poll() is not None:
            forked = prestart.take(kind)
            cls._current = cls.adopt(kind, *forked) if forked else Zygote(kind, dict(os.environ if env is None else env))
            atexit.register(cls._current.stop)
        return cls._current

    @classmethod
    def adopt(cls, kind: str, pid: int, fd: int) -> "Zygote":
        """The zygote launcher/worker/bootstrap.py forked for this launcher before it ran (launcher.prestart),
        importing for `kind` meanwhile. Its environment is the launcher's first one, what it read at torch's import;
        each worker gets its own."""
        zygote = cls.__new__(cls)
        zygote.kind, zygote.proc, zygote.sock = kind, ForkedChild(pid), socket.socket(fileno=fd)
        zygote.ready, zygote.exits, zygote.exited_at, zygote._next_id = False, {}, {}, 0
        return zygote

    @classmethod
    def current(cls) -> Optional["Zygote"]:
        return cls._current

    @classmethod
    def stop_current(cls) -> None:
        if cls._current is not None:
            cls._current.stop()
            cls._current = None

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self.ready:
            message = self._receive(deadline - time.monotonic())
            if message is None:
                raise LaunchError(f"the worker zygote ended before it was ready (exit code {self.proc.poll()}); "
                                  "run with launcher.start_method=spawn to start workers as fresh interpreters")
            if message.get("event") == "error":
                raise LaunchError(f"workers could not import what they need: {message['message']}")

    def fork(self, spec: Dict[str, Any], fds: List[int]) -> int:
        """Ask for one worker; its pid."""
        self.wait_ready()
        self._next_id += 1
        request = json.dumps({"id": self._next_id, "spec": spec}).encode()
        socket.send_fds(self.sock, [request], fds)
        deadline = time.monotonic() + 30
        while True:
            message = self._receive(deadline - time.monotonic())
            if message is None:
                raise LaunchError("the worker zygote stopped answering while starting workers")
            if message.get("event") == "started" and message.get("id") == self._next_id:
                return int(message["pid"])

    def poll(self) -> Dict[int, int]:
        """Exits reported so far: {pid: exit code}."""
        while self._receive(0.0) is not None:
            pass
        return self.exits

    def _receive(self, timeout: float) -> Optional[Dict[str, Any]]:
        readable, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not readable:
            return None
        try:
            data = self.sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            return None
        message = json.loads(data)
        event = message.get("event")
        if event == "ready":
            self.ready = True
        elif event == "exited":
            self.exits[int(message["pid"])] = int(message["code"])
            if isinstance(message.get("at"), (int, float)):
                self.exited_at[int(message["pid"])] = float(message["at"])
        return message

    def stop(self) -> None:
        """Hang up: the zygote kills whatever of its workers is left, and exits."""
        if not self.ready and self.proc.poll() is None:
            self.proc.kill()  # still importing (the launch was stopped early): it has forked nothing yet
        try:
            self.sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)


class ForkedChild:
    """The part of subprocess.Popen the agent uses, for a child this process forked (the prestarted zygote)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        return self._reap(os.WNOHANG)

    def wait(self, timeout: Optional[float] = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._reap(os.WNOHANG) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.01)
        return int(self.returncode or 0)

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _reap(self, flags: int) -> Optional[int]:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, flags)
            except ChildProcessError:  # reaped elsewhere: its code is lost
                self.returncode = -1
                return self.returncode
            if pid == self.pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def die_with_parent(parent: int) -> bool:
    """Linux: this process dies with its parent (PR_SET_PDEATHSIG); False if the parent is already gone."""
    import ctypes
    import signal

    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    return not parent or os.getppid() == parent
