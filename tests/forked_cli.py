"""`python -m launcher ARGS` for the bad-input tables, each case a real process forked from one that imported the
launcher's command line once.

A bad invocation ends in the launcher's argument and config checks, before torch or any run directory: a fresh
interpreter spent ~0.4 CPU-s a case on its own start and imports, ~30 CPU-s for tests/test_bad_input.py's table
alone, on a 2-core machine whose suite is bounded by its CPU time. Here a server process imports `launcher.__main__`
(its module-level steps, interrupts.hold and prestart.release, run there once, as in any fresh launcher) and forks
a child per case. The child is what a fresh `python -m launcher ARGS` is after its imports: its own session, the
case's working directory, environment, argv and sys.orig_argv, stdin from /dev/null, stdout and stderr to files;
it runs launcher.__main__.entry() and ends as that process ends (SystemExit, atexit handlers, a traceback for an
uncaught exception). The server never runs a case itself, so no case sees another's state. An invocation that is
not bad after all execs into a real launch (launcher.prestart reads sys.orig_argv), as the real command would.

tests/test_bad_input.py checks a sample of its table against real `python -m launcher` processes too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from tests.helpers import kill_group, launcher_env

SERVER = r"""
import json, os, sys
import launcher.__main__ as entry_module
requests, replies = sys.stdin, os.fdopen(int(sys.argv[1]), "w")
for line in requests:
    case = json.loads(line)
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        replies.close()
        os.setsid()
        os.chdir(case["cwd"])
        os.environ.clear(); os.environ.update(case["env"])
        for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, case["out"], os.O_WRONLY), (2, case["err"], os.O_WRONLY)):
            opened = os.open(path, mode)
            os.dup2(opened, fd); os.close(opened)
        sys.stdin = open(0, closefd=False)
        sys.path[0] = case["cwd"]  # as -m puts it
        sys.modules["__main__"] = entry_module
        sys.argv = [entry_module.__file__, *case["argv"]]
        sys.orig_argv = [sys.executable, "-m", "launcher", *case["argv"]]
        entry_module.entry()  # ends this process as `python -m launcher` ends: nothing below runs in the child
        sys.exit(0)
    replies.write(json.dumps(pid) + "\n"); replies.flush()  # first the child's pid: a case that hangs is killed by it
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n"); replies.flush()
"""


class ForkedCli:
    """One server per use (a context manager); run() is run_launcher's contract for an invocation that ends early."""

    def __init__(self, cwd: Path) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="forked-cli-"))
        read_end, write_end = os.pipe()
        self.replies = os.fdopen(read_end)
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(write_end)], cwd=cwd, env=launcher_env(),
                                     stdin=subprocess.PIPE, text=True, start_new_session=True, pass_fds=(write_end,))
        os.close(write_end)
        self.count = 0

    def run(self, args: List[str], cwd: Path, env: Optional[Dict[str, str]] = None,
            timeout: float = 60) -> subprocess.CompletedProcess:
        self.count += 1
        out, err = self.tmp / f"{self.count}.out", self.tmp / f"{self.count}.err"
        out.touch()
        err.touch()
        case = {"argv": list(args), "cwd": str(cwd), "env": launcher_env(env), "out": str(out), "err": str(err)}
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        child = json.loads(self.reply(10))
        try:
            code = json.loads(self.reply(timeout))
        except TimeoutError:
            os.killpg(child, signal.SIGKILL)  # its own session (setsid): the case, and only it
            raise AssertionError(f"launcher {args} timed out after {timeout}s\nstdout:\n{out.read_text()}\n"
                                 f"stderr:\n{err.read_text()}") from None
        return subprocess.CompletedProcess(args, code, out.read_text(), err.read_text())

    def reply(self, timeout: float) -> str:
        if not select.select([self.replies], [], [], timeout)[0]:
            raise TimeoutError
        line = self.replies.readline()
        assert line, f"the forked-CLI server ended with {self.proc.wait()}"
        return line

    def __enter__(self) -> "ForkedCli":
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                kill_group(self.proc)
                self.proc.wait()
            self.replies.close()
            for f in self.tmp.iterdir():
                f.unlink()
            self.tmp.rmdir()
