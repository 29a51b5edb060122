"""The first code of every worker process, and the zygote that forks warm workers. Stdlib only.

Run as a program, never imported by the launcher (a worker must not find the project in its
``sys.modules``):

    python -u launcher/worker/bootstrap.py zygote KIND PARENT_PID FD  # serve fork requests on socket FD
    python -u launcher/worker/bootstrap.py worker SPEC_FD PARENT_PID  # one fresh worker (start method spawn)

The zygote is a fresh, single-threaded interpreter that imports what workers need (``torch``
for scripts; the built-in trainer's modules for ``KIND=trainer``), then forks one worker per
request from the agent (launcher.agent.zygote). Forking a single-threaded process that has touched
no CUDA and started no thread pool is safe, and the fork costs milliseconds where a fresh
``import torch`` costs seconds. A worker forked from it looks to a script like one torchrun
started with ``python -u script.py``: the same ``sys.argv``, ``sys.path``, ``__main__``,
environment, signal dispositions, multiprocessing start method (none chosen) and streams
(stdout and stderr apart), and its traceback shows no frame of this file.

Worker <-> agent: the worker's stdout and stderr are pipes the agent reads (launcher.agent.streams);
a third pipe, the status pipe, carries one line when the script has returned: ``done CODE``.
The agent uses it to tell a finished rank whose interpreter hangs at exit from a working one.
"""

import sys

del sys.path[0]  # this file's folder (launcher/worker/): nothing of the project may shadow a script's imports

import json  # noqa: E402  (after the sys.path fix, on purpose)
import os  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

MAIN_KEYS = tuple(k for k in sys.modules["__main__"].__dict__ if k.startswith("__"))  # a fresh __main__'s names
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
DONE_AT = 1.0  # launcher.runtime.beats: a heartbeat file's mtime once the rank is finished
MAX_MESSAGE = 1 << 20
WORKER_SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")


# ---------------------------------------------------------------- the zygote


def zygote(kind: str, parent: int, control_fd: int) -> "tuple | None":
    """Preload, then fork workers on request until the agent hangs up. Returns only in a worker."""
    die_with_parent(parent)
    _set_prctl(PR_SET_CHILD_SUBREAPER, 1)  # a worker's orphaned children come back here, to be killed at the end
    # The agent decides when workers stop; SLURM's USR2 reaches every process of a job step. The agent
    # started this process with SIGINT, SIGTERM and SIGHUP blocked (launcher.agent.zygote): they were held
    # until now, and once ignored, unblocking them drops what is pending.
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
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
    # Every child, not only the workers: as the subreaper, this process also adopted the orphans of workers
    # that died first (a data loader's worker stuck in a read outlived its killed rank, and then the job).
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
    return None


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

    progress()  # the heartbeat's and step records' code, shared by every forked worker

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


# ---------------------------------------------------------------- a worker


def become_worker(spec: dict, fds: list, parent: int) -> None:
    """Turn this process into the rank the spec describes, then run its code. Never returns."""
    die_with_parent(parent)
    for name in WORKER_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    if spec.get("slurm"):  # SLURM's warning signal reaches every process of the step: the trainer handles it
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    stdout_fd, stderr_fd, status_fd = fds
    for fd, target in ((stdout_fd, 1), (stderr_fd, 2)):
        if fd != target:  # a fresh worker got them in place already
            os.dup2(fd, target)
            os.close(fd)
    os.set_inheritable(status_fd, False)
    os.environ.clear()
    os.environ.update(spec["env"])
    os.chdir(spec["cwd"])
    fresh_random_state()
    threads = spec["env"].get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))  # read at import, in the zygote: apply it now
    here = progress()
    beat = here["register_heartbeat"](spec.get("heartbeat"))
    watch = None
    if spec["kind"] != "trainer" and (beat or spec.get("steps")):  # the built-in trainer beats and measures itself
        watch = here["watch_steps"](spec.get("steps"), beat, here["Loader"]())
    status = os.fdopen(status_fd, "w", buffering=1)
    # SIGINT stays ignored, as in the zygote, until the rank's code starts (run_user_code, run_trainer, inside
    # their handling of KeyboardInterrupt): a Ctrl-C to the group during this set-up would print this file's
    # traceback. The agent stops a rank that missed it.
    if spec["kind"] == "trainer":
        from launcher.worker.trainer import run_trainer

        run_trainer(spec["trainer"], status)  # exits the process itself
    code = run_user_code(spec["kind"], spec["target"], spec["args"], spec.get("error_file"))
    if watch is not None:
        watch.close()  # the last window's record
    if beat:
        try:
            os.utime(beat, (DONE_AT, DONE_AT))  # done: a slow exit is no hang for the heartbeat watchdog
        except OSError:
            pass
    status.write(f"done {code}\n")
    status.close()
    sys.exit(code)  # the interpreter's normal exit: atexit handlers, flushed files, as under torchrun


def fresh_random_state() -> None:
    """Seeds from the OS, as a fresh interpreter's (each of torchrun's workers is one), for every generator a fork shares.

    A forked worker starts with the zygote's generator states: without this, every rank of a node draws the
    same ``torch.rand``, dropout masks and shuffles. Each is seeded the way its own import seeds it:
    - torch's default CPU generator, from the OS (what ``import torch`` does: a non-deterministic seed, so
      ``torch.initial_seed()`` differs per rank as under torchrun). CUDA's generators are left alone: the zygote
      never initialises CUDA, so a worker creates them on first use, seeded as in any fresh process;
    - Python's ``random``, from the OS (it also reseeds itself after a fork, through os.register_at_fork);
    - NumPy's global generator, from the OS, where numpy.random was imported (torch does not import it).
    A script that seeds them itself gets exactly its seeds: this runs before its first line.
    """
    import random

    random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].default_generator.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


_progress: "dict | None" = None


def progress() -> dict:
    """launcher/worker/loaders.py and progress.py (heartbeat, stack dumps, step records) executed into one namespace
    of their own: nothing of the project enters sys.modules (see progress.py). The zygote loads it for every worker."""
    global _progress
    if _progress is None:
        _progress = {"__name__": "launcher_worker_progress", "__builtins__": __builtins__}
        for name in ("loaders.py", "progress.py"):  # launcher.worker.progress.WORKER_FILES
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
            with open(path, "rb") as f:
                exec(compile(f.read(), path, "exec"), _progress)
    return _progress


def run_user_code(kind: str, target: str, args: list, error_file: "str | None") -> int:
    """Run a script (or module) as `python -u script.py ARGS` would; its exit code."""
    main = types.ModuleType("__main__")
    for key in MAIN_KEYS:
        if key not in main.__dict__ and key not in ("__file__", "__cached__"):
            main.__dict__[key] = {} if key == "__annotations__" else None
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python starts a script (see become_worker)
        if kind == "module":
            import runpy

            sys.path.insert(0, os.getcwd())
            sys.argv = ["-m", *args]
            sys.orig_argv = [sys.executable, "-u", "-m", target, *args]
            runpy._run_module_as_main(target, alter_argv=True)  # what `python -m` calls
        else:
            from importlib.machinery import SourceFileLoader

            path = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)  # as Python makes __file__: not normalised
            sys.path.insert(0, os.path.dirname(os.path.realpath(path)))
            sys.argv = [target, *args]
            sys.orig_argv = [sys.executable, "-u", target, *args]
            main.__dict__.update(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path))
            with open(path, "rb") as f:
                code = compile(f.read(), path, "exec")
            exec(code, main.__dict__)
    except SystemExit as e:
        return exit_code(e)
    except KeyboardInterrupt as e:
        print_exception(e)
        return 128 + signal.SIGINT
    except BaseException as e:  # noqa: BLE001  (reported as Python reports an uncaught exception)
        record_error(e, error_file)
        print_exception(e)
        return 1
    return 0


def exit_code(e: SystemExit) -> int:
    """What Python makes of an uncaught SystemExit."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def print_exception(e: BaseException) -> None:
    """sys.excepthook on the traceback from the user's first frame on: no frame of this file."""
    tb = e.__traceback__
    here = os.path.abspath(__file__)
    while tb is not None and (tb.tb_frame.f_code.co_filename in (here, __file__)
                              or tb.tb_frame.f_globals.get("__name__") == "runpy"):
        tb = tb.tb_next
    sys.excepthook(type(e), e.with_traceback(tb), tb)
    sys.stderr.flush()


def record_error(e: BaseException, error_file: "str | None") -> None:
    """torch's error-file format (what ``@record`` writes), unless the script recorded its own."""
    if not error_file or os.path.exists(error_file):
        return
    import traceback

    data = {"message": {"message": f"{type(e).__name__}: {e}",
                        "extraInfo": {"py_callstack": "".join(traceback.format_exception(e)),
                                      "timestamp": str(int(time.time()))}}}
    try:
        with open(error_file, "w") as f:
            json.dump(data, f)
    except OSError:
        pass


def die_with_parent(parent: int) -> None:
    """Linux: when the parent dies (even by SIGKILL), so does this process: no orphans."""
    if _set_prctl(PR_SET_PDEATHSIG, signal.SIGKILL) and os.getppid() != parent:
        os._exit(1)  # the parent died before prctl took effect


def _set_prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def fresh_worker(spec_fd: int, parent: int) -> "tuple":
    """start method spawn: this interpreter is one worker; its spec comes on a pipe."""
    with os.fdopen(spec_fd, "rb") as f:
        message = json.loads(f.read())
    return message["spec"], message["fds"]


if __name__ == "__main__":
    role, parent_pid = sys.argv[1], int(sys.argv[3])
    if role == "zygote":
        found = zygote(sys.argv[2], parent_pid, int(sys.argv[4]))
        if found is None:
            sys.exit(0)
        parent_pid = os.getppid()
    else:
        found = fresh_worker(int(sys.argv[2]), parent_pid)
    become_worker(found[0], found[1], parent_pid)
