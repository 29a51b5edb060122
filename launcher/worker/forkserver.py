"""The zygote's loop: preload, then fork one worker per request from the agent until it hangs up. Stdlib only.

launcher/worker/bootstrap.py (`bootstrap.py zygote ...`) loads this file into a module object that is never
put in sys.modules (a worker forked from here must hold nothing of the project: tests/test_torchrun_fidelity.py)
and calls serve() once the process is set up; in a forked worker serve() returns, and bootstrap.py makes it
the rank it was asked for. The agent's side is launcher.agent.zygote.
"""

import json
import os
import select
import signal
import socket
import time

MAX_MESSAGE = 1 << 20


def serve(kind: str, control_fd: int) -> "tuple | None":
    """Preload, then fork workers on request until the agent hangs up. Returns only in a worker: its spec and fds."""
    sock = socket.socket(fileno=control_fd)
    try:
        preload(kind)
    except BaseException as e:  # noqa: BLE001  (reported to the agent, which names it)
        send(sock, {"event": "error", "message": f"{type(e).__name__}: {e}"})
        return None
    send(sock, {"event": "ready", "pid": os.getpid()})
    children = set()
    while True:
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            message, fds = receive(sock)
            if message is None:  # the agent is gone or done
                break
            pid = os.fork()
            if pid == 0:
                sock.close()
                return message["spec"], fds
            for fd in fds:
                os.close(fd)
            children.add(pid)
            send(sock, {"event": "started", "id": message["id"], "pid": pid})
        reap(children, sock)
    kill_every_child(children)
    return None


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


def own_children() -> set:
    """The pids whose parent is this process (Linux /proc; empty elsewhere)."""
    me, found = str(os.getpid()), set()
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


def preload(kind: str) -> None:
    """Imports only: no tensor, no thread pool, no CUDA before the fork.

    Every import in here, and in become_worker, is inside the function on purpose: a script's
    worker must hold nothing of this project or of torch beyond what the script imports itself
    under torchrun (tests/test_fidelity.py), so only the built-in trainer's branch loads them.
    """
    import gc

    gc.disable()  # import-heavy: the collector would rescan millions of new objects (launcher.warmstart)
    import torch  # noqa: F401

    if kind == "trainer":  # the installed package's, never a folder put on sys.path (a user's trainers.py stays theirs)
        import psutil  # noqa: F401
        import torch._dynamo  # noqa: F401  (DDP's constructor imports it: seconds per worker otherwise)
        import torch.nn.parallel  # noqa: F401

        import launcher.trainers.train  # noqa: F401
        import launcher.worker.trainer  # noqa: F401
    gc.freeze()  # never scanned again; the pages stay shared with the forked workers
    gc.enable()


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
            send(sock, {"event": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)})


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
