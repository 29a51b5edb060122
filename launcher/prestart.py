"""The launcher process's start: one ``import torch`` for the launcher and its worker zygote. Standard library only.

A launch whose workers fork here needs torch twice per node: in the launcher (torch's agent) and in
the zygote the workers fork from (launcher.agent.zygote), a process that must hold nothing of the
project. Each import costs about 2 CPU-s, a third of a small job's CPU (docs/architecture.md). So the
launch, once it has parsed its arguments, resolved its config and (on a machine with no GPU, where no
torch is needed for it) built and checked its plan, all once and with no torch, execs this process into

    python -u launcher/worker/bootstrap.py KIND --handover FD -m launcher ARGS

which imports torch and nothing else, forks the zygote from there (the same process a fresh
``bootstrap.py zygote KIND`` is once it has imported torch: workers see no difference), and then runs
``launcher`` here again as the command would have (sys.path, sys.argv and sys.orig_argv as it made them),
where the launch goes on from the handover (exec_launch): FD is an anonymous file holding what the launch had
made (launcher.backends.dispatch.Handover); nothing is parsed, resolved or planned again. The `launcher` command
(``--path SCRIPT``) execs the same way. A child launcher of `sweep`, `scale`, `compare` or the Python API
(``KIND node launcher ARGS``, as launcher.backends.children runs it) and a simulated or Ray node (``KIND node
MODULE ARGS``: zygote_module_command there) start as bootstrap.py already, with no handover: they run once. The
Python API's standby (launcher.api.standby) is ``KIND node launcher ARGS`` started before its ARGS are known.

The stop signals stay blocked from the exec until launcher.__main__ has installed its handlers again
(release()): a Ctrl-C during torch's import is held, then ends the launcher in one line. The zygote
ignores them, and dies with the launcher until it is first asked for a worker. A zygote the launch
does not take (a child launcher whose config needs none, or another kind) is killed at once.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from typing import List, Optional, Tuple

BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker", "bootstrap.py")
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the stop signals launcher.interrupts handles (it imports these)
KINDS = ("trainer", "script")
HANDOVER = "--handover"  # bootstrap.py's flag before the file descriptor exec_launch hands over
# launcher.backends.children's child of the installed package: `python -c RUN_MODULE MODULE ARGS`, as `python -m`
# runs MODULE but with the working folder left out of sys.path (where a user's own launcher.py would shadow ours)
RUN_MODULE = "import runpy, sys; del sys.path[0]; runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"


class _State:
    decided = False  # this process execs no more: it was exec'd already, or runs under bootstrap.py as a child launcher
    zygote: Optional[Tuple[int, int, str]] = None  # (pid, socket fd, kind) of the zygote forked for us, until taken
    handover: Optional[bytes] = None  # what the process before the exec handed over (exec_launch), until taken
    started: Optional[float] = None  # a standby's launch: when its caller asked for it (launcher/worker/standby.py)
    released = False


def can_exec() -> bool:
    """Whether exec_launch can make this process the bootstrap: the first launch of `python -m launcher` or the
    `launcher` command on Linux, not one exec'd already, nor a child launcher started as the bootstrap."""
    return (not _State.decided and sys.platform.startswith("linux") and hasattr(os, "memfd_create")
            and _command_form() is not None)


def stay() -> None:
    """This process execs no more: its caller goes on after the launch returns (`doctor --comm` prints its table)."""
    _State.decided = True


def exec_launch(kind: str, handover: bytes) -> None:
    """Exec into bootstrap.py (module docstring), whose workers are of kind "trainer" or "script", handing over
    `handover` (the launch's state, as launcher.backends.dispatch made it) in an anonymous file that the new process
    reads once (handed_over()). Never returns, unless the exec failed: then the launch goes on in this process."""
    form = _command_form()
    if not can_exec() or form is None or kind not in KINDS:
        return
    _State.decided = True
    fd = os.memfd_create("launcher-handover", 0)  # no name on any filesystem; gone with the last process holding it
    try:
        view = memoryview(handover)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        os.set_inheritable(fd, True)
        for stream in (sys.stdout, sys.stderr):  # what the launch printed so far: the exec would drop its buffers
            stream.flush()
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)  # a blocked signal stays pending across exec
        try:
            os.execv(sys.executable, [sys.executable, "-u", BOOTSTRAP, kind, HANDOVER, str(fd), *form, *sys.argv[1:]])
        except OSError:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    finally:
        os.close(fd)


def started_at() -> Optional[float]:
    """When a standby's launch was asked for (launcher.clock: the run's start), None in any other process."""
    return _State.started


def handed_over() -> Optional[bytes]:
    """In the exec'd process: what exec_launch handed over, once (the launch goes on with it); None in any other."""
    found, _State.handover = _State.handover, None
    return found


def _command_form() -> Optional[List[str]]:
    """bootstrap.py's arguments for how this process runs the launcher, with no interpreter option (an option such as
    -X or -W would reach the zygote, and through it every worker): None for any other way."""
    orig, argv = list(getattr(sys, "orig_argv", [])), sys.argv
    if orig[1:3] == ["-m", "launcher"] and orig[3:] == argv[1:]:
        return ["-m", "launcher"]
    if orig[1:4] == ["-c", RUN_MODULE, "launcher"] and orig[4:] == argv[1:]:
        return ["node", "launcher"]
    if argv and orig[1:2] == [argv[0]] and os.path.basename(argv[0]) == "launcher" and orig[2:] == argv[1:]:
        return ["--path", argv[0]]
    return None


def run(kind: str, role: str, target: str, args: List[str], zygote: Optional[Tuple[int, int]],
        handover: Optional[int] = None, started: Optional[float] = None) -> None:
    """In the exec'd process, once bootstrap.py has forked the zygote: run the launcher (or a node) here, as the
    command would have. handover: the file descriptor exec_launch handed over (read here, then closed). started: a
    standby's caller's start time (this process was started before its launch was asked for)."""
    import runpy

    _State.decided = True
    _State.started = started
    _State.zygote = None if zygote is None else (zygote[0], zygote[1], kind)
    if handover is not None:
        with os.fdopen(handover, "rb") as f:
            _State.handover = f.read()
    if role == "node":  # its stop signals were never held (bootstrap.launcher restored its mask)
        release()
    if role == "--path":
        sys.argv, sys.orig_argv = [target, *args], [sys.executable, target, *args]
        runpy.run_path(target, run_name="__main__")
    else:
        sys.argv = [target, *args]
        sys.orig_argv = [sys.executable, *(["-m", target] if role == "-m" else ["-c", RUN_MODULE, target]), *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)


def release() -> None:
    """The launcher's stop handlers are in place (launcher.__main__): the signals held since the exec arrive now,
    and a zygote nobody took is killed at the exit (under launcher.__main__, before launcher.interrupts' last
    handler; it also dies with this process until it is asked for a worker)."""
    if _State.zygote is None or _State.released:
        return
    _State.released = True
    atexit.register(drop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def take(kind: str) -> Optional[Tuple[int, int]]:
    """The forked zygote's (pid, socket fd), once, for workers of this kind (launcher.agent.zygote adopts it); None if
    there is none, or if it imported for another kind (the config changed since the check): that one is dropped."""
    if _State.zygote is not None and _State.zygote[2] != kind:
        drop()
    found, _State.zygote = _State.zygote, None
    return None if found is None else (found[0], found[1])


def drop() -> None:
    """No zygote wanted (or the launch is over before taking it): kill and reap it. It has forked nothing (it forks
    only when the agent asks) and holds nothing but imports."""
    found, _State.zygote = _State.zygote, None
    if found is None:
        return
    pid, fd, _ = found
    os.close(fd)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
