"""The launcher process's start: one ``import torch`` for the launcher and its worker zygote. Standard library only.

A launch whose workers fork here needs torch twice per node: in the launcher (torch's agent) and in
the zygote the workers fork from (launcher.agent.zygote), a process that must hold nothing of the
project. Each import costs about 2 CPU-s, a third of a small job's CPU (FACTS.md). So the launcher,
once it knows its command is such a launch (launcher.cli.zygote_kind: the arguments parsed and the
config resolved, quietly; a bad input is refused as before, with no torch), execs itself into

    python -u launcher/worker/bootstrap.py KIND -m launcher ARGS

which imports torch and nothing else, forks the zygote from there (the same process a fresh
``bootstrap.py zygote KIND`` is once it has imported torch: workers see no difference), and then runs
``launcher`` here again as the command would have: sys.path, sys.argv and sys.orig_argv as it made them.
The `launcher` command (``KIND --path SCRIPT ARGS``), a child launcher of `sweep`, `scale`, `compare` or the
Python API (``KIND node launcher ARGS``, as launcher.backends.children runs it) and a simulated or Ray
node (``KIND node MODULE ARGS``: zygote_module_command there) start the same way.

The stop signals stay blocked from the exec until launcher.__main__ has installed its handlers again
(release()): a Ctrl-C during torch's import is held, then ends the launcher in one line. The zygote
ignores them, and dies with the launcher until it is first asked for a worker. A zygote the launch
does not take (its config changed in between) is killed at once.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
from typing import Callable, List, Optional, Tuple

BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker", "bootstrap.py")
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the stop signals launcher.interrupts handles (it imports these)
KINDS = ("trainer", "script")
# launcher.backends.children's child of the installed package: `python -c RUN_MODULE MODULE ARGS`, as `python -m`
# runs MODULE but with the working folder left out of sys.path (where a user's own launcher.py would shadow ours)
RUN_MODULE = "import runpy, sys; del sys.path[0]; runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"


class _State:
    decided = False  # exec_with_zygote() ran once (or this process is the exec'd one)
    zygote: Optional[Tuple[int, int, str]] = None  # (pid, socket fd, kind) of the zygote forked for us, until taken
    released = False


def exec_with_zygote(kind_of: Callable[[List[str]], Optional[str]]) -> None:
    """Exec into bootstrap.py when kind_of(ARGS) names the workers' kind of a launch whose workers fork here (asked
    quietly: its output is dropped, as the launcher says it all again); otherwise return. Once per process."""
    if _State.decided:
        return
    _State.decided = True
    form = _command_form()
    if form is None or not sys.platform.startswith("linux"):
        return
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
            kind = kind_of(sys.argv[1:])
    except (Exception, SystemExit):  # noqa: BLE001  (bad input: the launcher reports it itself, with no torch)
        return
    if kind not in KINDS:
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)  # a blocked signal stays pending across exec
    try:
        os.execv(sys.executable, [sys.executable, "-u", BOOTSTRAP, str(kind), *form, *sys.argv[1:]])
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


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


def run(kind: str, role: str, target: str, args: List[str], zygote: Optional[Tuple[int, int]]) -> None:
    """In the exec'd process, once bootstrap.py has forked the zygote: run the launcher (or a node) here, as the
    command would have."""
    import runpy

    _State.decided = True
    _State.zygote = None if zygote is None else (zygote[0], zygote[1], kind)
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
