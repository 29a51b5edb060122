"""The first code of every worker process, and the zygote that forks warm workers. Stdlib only.

Run as a program, never imported by the launcher (a worker must not find the project in its ``sys.modules``):

    python -u launcher/worker/bootstrap.py zygote KIND PARENT_PID FD  # serve fork requests on socket FD
    python -u launcher/worker/bootstrap.py worker SPEC_FD PARENT_PID  # one fresh worker (start method spawn)
    python -u launcher/worker/bootstrap.py KIND --handover FD -m launcher ARGS  # a launch going on, its zygote forked
    (and `KIND --handover FD --path SCRIPT ARGS`, `KIND node MODULE ARGS` the same way: launcher.prestart; `standby
    KIND IDLE_S PARENT FD`: `KIND node launcher ARGS` started ahead, its ARGS later on pipe FD)

The zygote is a fresh, single-threaded interpreter that imports what workers need (``torch`` for scripts; the built-in
trainer's modules for ``KIND=trainer``), then forks one worker per request from the agent (launcher.agent.zygote; its
loop: launcher/worker/forkserver.py). Forking a single-threaded process that has touched no CUDA and started no thread
pool is safe, and the fork costs milliseconds where a fresh ``import torch`` costs seconds. A worker forked from it
looks to a script like one torchrun started with ``python -u script.py``: the same ``sys.argv``, ``sys.path``,
``__main__``, environment, signal dispositions, multiprocessing start method (none chosen) and streams (stdout and
stderr apart), and its traceback shows no frame of this file, nor does a Ctrl-C at any moment of it (run_user_code).

Worker <-> agent: stdout and stderr are pipes the agent reads (launcher.agent.streams); a third, the status
pipe, carries ``done CODE TIME`` once the script has returned: a finished rank hanging at exit is no working one.
"""

import sys

del sys.path[0]  # this file's folder (launcher/worker/): nothing of the project may shadow a script's imports

import json  # noqa: E402  (after the sys.path fix, on purpose)
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402

MAIN_KEYS = tuple(k for k in sys.modules["__main__"].__dict__ if k.startswith("__"))  # a fresh __main__'s names
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
DONE_AT = 1.0  # launcher.runtime.beats: a heartbeat file's mtime once the rank is finished
WORKER_SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # a worker holds them until its rank's code starts


# ---------------------------------------------------------------- the zygote


def zygote(kind: str, parent: int, control_fd: int) -> "tuple":
    """Set up, then serve fork requests (launcher/worker/forkserver.py). Returns only in a worker."""
    # Not killed with its parent (no PR_SET_PDEATHSIG): when the agent dies, even by SIGKILL, the zygote sees its
    # socket close (or its parent change) and kills every process it holds first, the workers' children included
    # (as the subreaper it adopts them once their parents are gone). Killed with the agent, it left them to init.
    if os.getppid() != parent:
        os._exit(1)  # the agent died before this process started
    return serve_forks(kind, parent, control_fd)


def serve_forks(kind: str, parent: int, control_fd: int, forked: bool = False) -> "tuple":
    """The zygote's life. One forked at the launcher's start dies with it until its first fork (forkserver), having
    nothing to clean up: a launcher Ctrl-C'd at once, or refusing what it finds, ends with no wait. Returns in a worker."""
    if forked:
        die_with_parent(parent)
    _set_prctl(PR_SET_CHILD_SUBREAPER, 1)
    ignore_stop_signals()
    found = _load("forkserver")["serve"](preload, control_fd, parent, kind)
    if found is None:  # its agent is done: nothing to flush but the streams, no teardown of torch's modules (0.4 CPU-s)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return found


def _load(name: str) -> dict:
    """This folder's NAME.py (forkserver, standby) run into a namespace of its own, never a module in sys.modules."""
    return _exec_file(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"), {"__name__": f"launcher_{name}"})


def launcher(kind: str, role: str, target: str, args: list, handover: "int | None", standby: "object" = None) -> "tuple":
    """`KIND --handover FD -m launcher ARGS`, `... --path SCRIPT ARGS`, `KIND node MODULE ARGS` (launcher.prestart): import
    torch, fork the zygote (until then this is a fresh zygote that has imported torch), run the launcher here, with the
    launch handed over in FD, or a standby's ARGS and start time from standby() (launcher/worker/standby.py)."""
    import gc

    gc.disable()  # as preload()
    zygote, theirs_too = None, [fd for fd in map(int, os.listdir("/proc/self/fd"))  # less the listing's, closed since
                                if fd > 2 and os.path.exists(f"/proc/self/fd/{fd}")]
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001  (a broken install: the launcher names it, as it would have)
        pass
    else:
        gc.freeze()  # torch's objects, all still in the youngest generation: the launcher's collector never rescans them
        ours, theirs, me = *socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET), os.getpid()
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the zygote ignores them before it unblocks
        pid = os.fork()
        if pid == 0:  # what the launcher got from its parent is not the zygote's (Popen's close_fds, as before)
            for fd in [ours.detach(), *theirs_too]:
                os.close(fd)
            return serve_forks(kind, me, theirs.detach(), forked=True)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # the launcher's: still blocked (launcher.prestart)
        theirs.close()
        zygote = (pid, ours.detach())
    gc.enable()
    args, started = standby() if callable(standby) else (args, None)
    if role != "node" and not getattr(sys.flags, "safe_path", False):  # what -m and SCRIPT put first, but -P (3.11+); a node: none
        sys.path.insert(0, os.getcwd() if role == "-m" else os.path.dirname(os.path.realpath(target)))
    global LAUNCHER_RUNS
    LAUNCHER_RUNS = True
    __import__("launcher.prestart").prestart.run(kind, role, target, args, zygote, handover, started)
    sys.exit(0)  # the launcher's module returned: `python -m` exits 0 then


def preload(kind: str) -> None:
    """Imports only: no tensor, no thread pool, no CUDA before the fork. Every import in here, and in become_worker,
    is inside the function on purpose: a script's worker must hold nothing of this project or of torch beyond what
    the script imports itself under torchrun (tests/test_fidelity.py); only the built-in trainer's branch loads them.
    """
    import gc

    gc.disable()  # import-heavy: the collector would rescan millions of new objects (launcher.warmstart)
    import torch  # noqa: F401

    progress()  # the heartbeat's and step records' code, shared by every forked worker

    if kind == "trainer":  # the installed package's, never a folder put on sys.path (a user's trainers.py stays theirs)
        import omegaconf  # noqa: F401  (each rank rebuilds its config with it: ~0.08 CPU-s a worker otherwise)
        import psutil  # noqa: F401
        for name in progress()["torch_private"].TRAINER_PRELOAD:  # torch._dynamo: DDP's constructor imports it
            __import__(name)

        import launcher.trainers.train  # noqa: F401
        import launcher.worker.trainer  # noqa: F401
    gc.freeze()  # never scanned again; the pages stay shared with the forked workers
    gc.enable()


def ignore_stop_signals() -> None:
    """The zygote's: the agent decides when workers stop; SLURM's USR2 reaches every process of a job step. This
    process started (or was forked) with SIGINT, SIGTERM and SIGHUP blocked: held until now, and once ignored,
    unblocking drops what is pending. A worker inherits them ignored, and blocked until take_stop_signals(); USR1 and
    USR2 unblocked (a SLURM node agent starts with USR2 blocked, launcher.backends.slurm.task, and the trainer's
    USR2 handler must hear it)."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (*STOP_SIGNALS, signal.SIGUSR1, signal.SIGUSR2))


def take_stop_signals() -> None:
    """The rank's code starts, its SIGINT handler set: the stop signals, blocked since the worker's fork (or its
    interpreter's start), are delivered again, and one the agent sent meanwhile arrives now. Ignored instead, a
    stop sent in that instant was lost: the agent's one SIGINT, sent as the workers started, left a rank training
    on (until the agent's SIGKILL, or to its last step, which made a Ctrl-C'd run 'completed', exit 0)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


# ---------------------------------------------------------------- a worker


def become_worker(spec: dict, fds: list, parent: int) -> None:
    """Turn this process into the rank the spec describes, then run its code. Never returns."""
    die_with_parent(parent)
    # Its own session, as torchrun's workers have (start_new_session): a terminal's Ctrl-C reaches the launcher
    # (and the zygote, which ignores it), whose agent then sends each rank's process group one SIGINT, as
    # torchrun's agent does; in the launcher's group a rank got two, the second in its KeyboardInterrupt handling.
    try:
        os.setsid()
    except OSError:
        pass  # a spawned worker that already leads its own group
    for name in WORKER_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    for signum in spec.get("ignored_signals", ()):  # a scheduler's warning to every process of the step (SLURM's
        signal.signal(signum, signal.SIG_IGN)  # USR2): the trainer handles it
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
    # SIGINT, SIGTERM and SIGHUP stay blocked until the rank's code starts (run_main, run_trainer, inside their
    # handling of KeyboardInterrupt: take_stop_signals), and SIGINT is ignored again once it ended: in this file's
    # code Python's handler would print its frames. Blocked, not ignored: the agent's stop waits for the rank.
    if spec["kind"] == "trainer":
        from launcher.worker.trainer import run_trainer

        run_trainer(spec["trainer"], status)  # exits the process itself
    code = run_user_code(spec["kind"], spec["target"], spec["args"], spec.get("error_file"))
    if watch is not None:
        watch.close()  # the last window's record
    if beat:
        try:
            os.utime(beat, (DONE_AT, DONE_AT), follow_symlinks=False)  # done: a slow exit is no hang for the heartbeat watchdog
        except OSError:
            pass
    status.write(f"done {code} {time.time()!r}\n")  # when, by this machine's clock: the first rank to fail is the cause
    status.close()
    if spec["kind"] == "module" and spec["target"] == "launcher.api.worker":  # launch()'s function: as mp's ranks end
        __import__("launcher.worker.ending").worker.ending.end_as_a_child(code)  # (its process holds launcher already)
    # The interpreter's normal exit, as under torchrun: atexit handlers, flushed files, and Python's Ctrl-C (its
    # traceback names threading or an atexit handler). One in the instant before is this file's: __main__ is quiet.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(code)


def fresh_random_state() -> None:
    """Seeds from the OS, as a fresh interpreter's (each of torchrun's workers is one), for every generator a fork shares.

    A forked worker starts with the zygote's generator states: without this, every rank of a node draws the same
    ``torch.rand``, dropout masks and shuffles. Each is seeded as its own import seeds it, from the OS: torch's CPU
    generator (so ``torch.initial_seed()`` differs per rank as under torchrun; CUDA's are made on first use, the
    zygote never touched CUDA), Python's ``random`` (which also reseeds at fork), NumPy's global one where
    numpy.random was imported. A script that seeds them itself gets its seeds: this runs before its first line.
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
        here = os.path.dirname(os.path.abspath(__file__))
        found = {name: types.ModuleType(f"launcher_worker_{name}") for name in ("safefs", "schema", "torch_private")}
        for name, file in (("safefs", "safefs"), ("schema", "fields"), ("schema", "schema"), ("torch_private",) * 2):
            _exec_file(os.path.join(os.path.dirname(here), "runtime", f"{file}.py"), found[name].__dict__)  # runtime/'s
        _progress = {"__name__": "launcher_worker_progress", "__builtins__": __builtins__, **found}
        for name in ("loaders.py", "writer.py", "waits.py", "progress.py"):  # launcher.worker.progress.WORKER_FILES
            _exec_file(os.path.join(here, name), _progress)
    return _progress


def _exec_file(path: str, namespace: dict) -> dict:
    with open(path, "rb") as f:
        exec(compile(f.read(), path, "exec"), namespace)
    return namespace


def run_user_code(kind: str, target: str, args: list, error_file: "str | None") -> int:
    """Run a script (or module) as `python -u script.py ARGS` would; its exit code.

    Only the script's own code runs with Python's SIGINT handler: this file's code before it (become_worker)
    and after it (here, first thing) ignores SIGINT, so that Ctrl-C raises KeyboardInterrupt in the script's
    frames only, where its traceback is the script's, as under torchrun.
    """
    ended = None
    try:
        run_main(kind, target, args)
    except BaseException as e:  # noqa: BLE001  (reported below as Python reports an uncaught exception)
        ended = e
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except KeyboardInterrupt:  # pending as the script ended, where Python would be exiting: not the script's
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if ended is None:
        return 0
    if isinstance(ended, SystemExit):
        return exit_code(ended)
    if not isinstance(ended, KeyboardInterrupt):
        record_error(ended, error_file)
    print_exception(ended)
    return 128 + signal.SIGINT if isinstance(ended, KeyboardInterrupt) else 1


def run_main(kind: str, target: str, args: list) -> None:
    """The script (or module) as __main__, with Python's SIGINT handler from its first line on."""
    main = types.ModuleType("__main__")
    for key in MAIN_KEYS:
        if key not in main.__dict__ and key not in ("__file__", "__cached__"):
            main.__dict__[key] = {} if key == "__annotations__" else None
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    if kind == "module":
        import runpy

        sys.path.insert(0, os.getcwd())
        sys.argv = ["-m", *args]
        sys.orig_argv = [sys.executable, "-u", "-m", target, *args]
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python starts a script (see run_user_code)
        take_stop_signals()
        runpy._run_module_as_main(target, alter_argv=True)  # type: ignore[attr-defined]  # what `python -m` calls (private)
        return
    from importlib.machinery import SourceFileLoader

    path = target if os.path.isabs(target) else os.path.join(os.getcwd(), target)  # as Python makes __file__: not normalised
    sys.path.insert(0, os.path.dirname(os.path.realpath(path)))
    sys.argv = [target, *args]
    sys.orig_argv = [sys.executable, "-u", target, *args]
    main.__dict__.update(__file__=path, __cached__=None, __loader__=SourceFileLoader("__main__", path))
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python starts a script (see run_user_code)
    take_stop_signals()
    exec(code, main.__dict__)


def exit_code(e: SystemExit) -> int:
    """What Python makes of an uncaught SystemExit."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    print(e.code, file=sys.stderr)
    return 1


def print_exception(e: BaseException) -> None:
    """sys.excepthook on the script's traceback."""
    tb = script_frames(e)
    sys.excepthook(type(e), e.with_traceback(tb), tb)
    sys.stderr.flush()


def script_frames(e: BaseException) -> "types.TracebackType | None":
    """e's traceback from the user's first frame on: no frame of this file or of runpy."""
    tb = e.__traceback__
    here = os.path.abspath(__file__)
    while tb is not None and (tb.tb_frame.f_code.co_filename in (here, __file__)
                              or tb.tb_frame.f_globals.get("__name__") == "runpy"):
        tb = tb.tb_next
    return tb


def record_error(e: BaseException, error_file: "str | None") -> None:
    """torch's error-file format (what ``@record`` writes), unless the script recorded its own."""
    if not error_file or os.path.exists(error_file):
        return
    import traceback

    data = {"message": {"message": f"{type(e).__name__}: {e}",
                        "extraInfo": {"py_callstack": "".join(traceback.format_exception(type(e), e, script_frames(e))),
                                      "timestamp": str(int(time.time()))}}}
    try:
        run_dir = os.path.dirname(os.path.dirname(error_file))  # <run_dir>/logs/rank-K.error.json
        with progress()["safefs"].open_file(error_file, "w", root=run_dir) as f:  # never through a planted link
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


def main(argv: list) -> None:
    role = argv[0]
    if role in ("trainer", "script"):  # launcher.prestart (its HANDOVER flag, then the file descriptor)
        handover, rest = (int(argv[2]), argv[3:]) if argv[1] == "--handover" else (None, argv[1:])
        found = launcher(role, rest[0], rest[1], rest[2:], handover)
    elif role == "standby":  # a child launcher started ahead, torch imported (launcher/worker/standby.py)
        found = launcher(argv[1], "node", "launcher", [], None, _load("standby")["ahead"](*argv[2:]))
    elif role == "zygote":
        found = zygote(argv[1], int(argv[2]), int(argv[3]))
    else:  # start method spawn: started with the stop signals blocked (blocked_for_child), kept so (become_worker)
        with os.fdopen(int(argv[1]), "rb") as f:  # this interpreter is one worker; its spec comes on a pipe
            found = ((message := json.loads(f.read()))["spec"], message["fds"])
    become_worker(found[0], found[1], os.getppid() if role != "worker" else int(argv[2]))


LAUNCHER_RUNS = False  # the launcher's own code runs in this process: its exceptions are its own

if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except KeyboardInterrupt:  # in the instant between become_worker giving Ctrl-C back to Python and its exit
        if LAUNCHER_RUNS:
            raise
        os._exit(128 + signal.SIGINT)  # quietly: its traceback would be this file's
