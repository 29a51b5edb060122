"""The zygote's loop: preload, then fork one worker per request from the agent until it hangs up. Stdlib only.

launcher/worker/bootstrap.py (`bootstrap.py zygote ...`) loads this file into a module object that is never
put in sys.modules (a worker forked from here must hold nothing of the project: tests/test_torchrun_fidelity.py)
and calls serve() once the process is set up, with the imports to make before the first fork
(bootstrap.preload); in a forked worker serve() returns, and bootstrap.py makes it the rank it was asked
for. The agent's side is launcher.agent.zygote.
"""

import json
import os
import select
import signal
import socket
import time
from collections.abc import Callable  # torch imports it before any fork: a worker holds nothing more

MAX_MESSAGE = 1 << 20
# Ignored here (bootstrap.ignore_stop_signals), held in a worker from its fork until its rank's code can take them:
# a stop the agent sends in between arrives then, where ignored it was lost (bootstrap.take_stop_signals).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def serve(preload: Callable[[str], None], control_fd: int, parent: int, kind: str) -> "tuple | None":
    """preload(kind), then fork workers on request until the agent (process `parent`) hangs up or dies; then kill
    every process this one holds. Returns only in a worker: its spec and fds."""
    sock = socket.socket(fileno=control_fd)
    try:
        preload(kind)
    except BaseException as e:  # noqa: BLE001  (reported to the agent, which names it)
        send(sock, {"event": "error", "message": f"{type(e).__name__}: {e}"})
        return None
    send(sock, {"event": "ready", "pid": os.getpid()})
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([sock], [], [], 0.05)
        if os.getppid() != parent:  # the agent died (its socket may live on in a process it started)
            break
        if readable:
            message, fds = receive(sock)
            if message is None:  # the agent is gone or done
                break
            if not children:
                outlive_parent()
            held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the child keeps them blocked
            pid = os.fork()
            if pid == 0:
                sock.close()
                return message["spec"], fds
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # here: ignored again, any pending one dropped
            for fd in fds:
                os.close(fd)
            children.add(pid)
            send(sock, {"event": "started", "id": message["id"], "pid": pid})
        reap(children, sock)
    kill_every_child(children)
    return None


def outlive_parent() -> None:
    """About to fork: from now on a dying agent no longer kills this process (as bootstrap.serve_forks has it do in a
    zygote forked at the launcher's start, while it has nothing to clean up); it outlives the agent to kill its
    workers first (the end of serve())."""
    import ctypes  # torch has loaded it

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG, none
    except (OSError, AttributeError):
        pass


def kill_every_child(children: set) -> None:
    """Every child, not only the workers: as the subreaper, this process also adopted the orphans of workers
    that died first (a data loader's worker stuck in a read outlived its killed rank, and then the job)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = children | own_children()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        children = set()
        try:
            if os.waitpid(-1, 0)[0] <= 0:
                break
        except ChildProcessError:
            break


def own_children() -> set[int]:
    """The pids whose parent is this process (Linux /proc; empty elsewhere)."""
    me, found = str(os.getpid()), set[int]()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        if stat[stat.rindex(")") + 2:].split()[1] == me:
            found.add(int(entry))
    return found


def reap(children: set, sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in children:
            children.discard(pid)
            send(sock, {"event": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status), "at": time.time()})


def send(sock: socket.socket, message: dict) -> None:
    try:
        sock.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the agent went away; the loop ends on its next read


def receive(sock: socket.socket) -> "tuple":
    """One request: a JSON line and the file descriptors sent with it (None at end of stream)."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 8)
    except OSError:  # the agent died mid-way: nothing more will come
        return None, []
    if not data:
        return None, []
    return json.loads(data), list(fds)
