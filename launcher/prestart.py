"""The launcher process's start: one ``import torch`` for the launcher and its worker zygote. Standard library only.

A launch that starts workers on this machine needs torch twice per node: in the launcher (torch's
agent) and in the zygote the workers fork from (launcher.agent.zygote), a fresh interpreter that must
hold nothing of the project. Each import costs about 2 CPU-s, a third of a small job's CPU (FACTS.md).
So `python -m launcher ARGS`, when ARGS look like such a launch, execs itself at its first line into

    python -u launcher/worker/bootstrap.py -m launcher ARGS

which imports torch and nothing else, forks the zygote from there (the same process a fresh
``bootstrap.py zygote`` is once it has imported torch: workers see no difference), and then runs
``launcher`` here as ``python -m`` would: sys.path, sys.argv and sys.orig_argv as the user's command
made them. A simulated node starts the same way (``bootstrap.py node launcher.backends.node ...``).

The stop signals stay blocked from the exec until launcher.__main__ has installed its handlers
(release()): a Ctrl-C during torch's import is held, then ends the launcher in one line. The zygote
ignores them (launcher.worker.bootstrap). A zygote the launch turns out not to need (a bad value in
the config, a SLURM job, start method spawn) ends at once when dropped, and with the launcher at the latest.

Where the command does not look like a launch on this machine (a subcommand, --help, --dry-run, a
simulated multi-node job's coordinator, which imports no torch), nothing changes: no exec.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from typing import List, Optional, Tuple

BOOTSTRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker", "bootstrap.py")
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # launcher.interrupts.HELD (not imported: it loads errors)
LAUNCHER_ROLES = ("-m", "node", "--path")  # bootstrap.py's first argument for a launcher with its zygote forked
# Subcommands that never start workers here (launcher.cli.COMMANDS less resume; tests/test_prestart.py keeps the two
# in step). A first word that is none of these, no option, no KEY=VALUE and no script is a typo: no exec either.
NOT_LAUNCHES = frozenset({"board", "cancel", "compare", "doctor", "logs", "ls", "scale", "status", "sweep"})
NO_LAUNCH_FLAGS = frozenset({"-h", "--help", "--version", "--dry-run", "--show-config"})
ANOTHER_MACHINE = ("--node-rank", "--node_rank", "--master-addr", "--master_addr", "--rdzv-endpoint",
                   "--rdzv_endpoint", "rdzv.node_rank=", "rdzv.master_addr=", "rdzv.endpoint=")


class _State:
    decided = False  # exec_with_zygote() ran once (or this process is the exec'd one)
    zygote: Optional[Tuple[int, int, str]] = None  # (pid, socket fd, kind guessed) of our forked zygote, until taken
    released = False


def exec_with_zygote() -> None:
    """At the first line of `python -m launcher` (or the `launcher` command): exec into bootstrap.py when ARGS look
    like a launch on this machine; otherwise return at once. Never returns after a successful exec."""
    if _State.decided:
        return
    _State.decided = True
    form = _command_form()
    if form is None or not worth_forking(sys.argv[1:]) or not sys.platform.startswith("linux"):
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)  # a blocked signal stays pending across exec
    try:
        os.execv(sys.executable, [sys.executable, "-u", BOOTSTRAP, *form, *sys.argv[1:]])
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _command_form() -> Optional[List[str]]:
    """bootstrap.py's arguments for this command's form: `python -m launcher` or the `launcher` command with no
    interpreter option (an option such as -X or -W would reach the zygote, and through it every worker)."""
    orig = list(getattr(sys, "orig_argv", []))
    if orig[1:3] == ["-m", "launcher"] and orig[3:] == sys.argv[1:]:
        return ["-m", "launcher"]
    script = sys.argv[0] if sys.argv else ""
    if orig[1:2] == [script] and os.path.basename(script) == "launcher" and orig[2:] == sys.argv[1:]:
        return ["--path", script]
    return None


def worth_forking(args: List[str]) -> bool:
    """Whether a command with these arguments starts workers on this machine (a guess from the words alone: a wrong
    guess costs one torch import, or saves none; the launch is the same either way)."""
    if args:
        first = args[0]
        if first in NOT_LAUNCHES:
            return False
        if first != "resume" and not first.startswith("-") and "=" not in first and "/" not in first \
                and not first.endswith(".py"):
            return False  # a mistyped subcommand: "did you mean ...?" needs no torch
    nodes, elsewhere = 1, False
    for i, token in enumerate(args):
        if token in NO_LAUNCH_FLAGS or token in ("launcher.start_method=spawn", "--cluster=slurm", "--cluster=ray",
                                                 "cluster=slurm", "cluster=ray"):
            return False
        following = args[i + 1] if i + 1 < len(args) else ""
        if token == "--cluster" and following in ("slurm", "ray"):
            return False
        if token.startswith(ANOTHER_MACHINE):
            elsewhere = True
        for flag in ("--nodes", "--nnodes", "nodes="):
            if token == flag or token.startswith(flag.rstrip("=") + "="):
                value = token.split("=", 1)[1] if "=" in token else following
                nodes = max(nodes, _most_nodes(value))
    return nodes == 1 or elsewhere  # a simulated multi-node job's coordinator starts no worker itself


def _most_nodes(value: str) -> int:
    try:
        return max(int(part) for part in value.split(":"))
    except ValueError:
        return 1


def run(role: str, target: str, args: List[str], zygote: Optional[Tuple[int, int, str]]) -> None:
    """In the exec'd process, once bootstrap.py has forked the zygote: run the launcher (or a node) here, as the
    user's command would have."""
    import runpy

    _State.decided, _State.zygote = True, zygote
    if role == "node":  # launcher.backends.children: the node's own stop handling; its mask was never changed
        release()
    if role == "--path":
        sys.argv, sys.orig_argv = [target, *args], [sys.executable, target, *args]
        runpy.run_path(target, run_name="__main__")
    else:
        sys.argv, sys.orig_argv = [target, *args], [sys.executable, "-m", target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)


def release() -> None:
    """The launcher's stop handlers are in place (launcher.__main__): the signals held since the exec arrive now,
    and a zygote nobody took ends before this process does (this runs before launcher.interrupts' last handler)."""
    if _State.zygote is None or _State.released:
        return
    _State.released = True
    atexit.register(drop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def take(kind: str) -> Optional[Tuple[int, int]]:
    """The forked zygote's (pid, socket fd) for a job of this kind, once: launcher.agent.zygote adopts it. None if
    there is none, or if it guessed the built-in trainer and imported it (bootstrap.launcher): a script's workers must
    not hold it, so that one is dropped and a fresh zygote starts."""
    if _State.zygote is not None and _State.zygote[2] == "trainer" and kind != "trainer":
        drop()
    found, _State.zygote = _State.zygote, None
    return None if found is None else (found[0], found[1])


def drop() -> None:
    """This launch needs no zygote (or is over before taking it): kill and reap it. It has forked nothing (it forks
    only when the agent asks) and holds nothing but imports: a hang-up would leave it finishing them first."""
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
