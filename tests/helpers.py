"""Shared test helpers: run the launcher for real, bounded in time, leaving no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

import psutil

REPO = Path(__file__).resolve().parent.parent
SESSION_PIDS: Set[int] = set()  # clusters that fixtures keep for several tests: not a test's leftovers (conftest)
QUICK = ["model.hidden=64", "model.depth=2", "model.in_dim=32", "data.dataset_size=1024", "data.batch_size=16"]
# QUICK without W&B's offline run (its service costs a launch ~3 CPU-s and ~3 s, a tenth of the suite's CPU on
# 2 cores): for tests of something else. W&B's own tests (test_metrics_runs, test_script_metrics) and a default
# run in each of several paths (the contract's successful and Ctrl-C'd script jobs on every backend, the restart
# tests' reference and raising-rank runs, the exit stress) keep the default offline run.
QUIET = [*QUICK, "wandb.mode=disabled"]
# The same for a script job (a script run starts W&B's offline run too): for script tests of something else.
NO_WANDB = ["wandb.mode=disabled"]


def launcher_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    torchrun_or_slurm = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "TORCHELASTIC", "SLURM_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(torchrun_or_slurm)}
    env["WANDB_MODE"] = env.get("WANDB_MODE", "offline")
    env.update(extra or {})
    return env


def run_launcher(args: List[str], cwd: Path, timeout: float = 120, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Run `python -m launcher ARGS` to completion; on timeout kill its whole process group and fail."""
    return run_bounded([sys.executable, "-m", "launcher", *args], cwd, timeout, env, "launcher")


def run_bounded(argv: List[str], cwd: Path, timeout: float, env: Optional[Dict[str, str]] = None,
                what: str = "command") -> subprocess.CompletedProcess:
    """Run argv (in its own session, launcher_env(env)) to completion; on timeout kill its process group and fail."""
    proc = subprocess.Popen(argv, cwd=cwd, env=launcher_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    out, err = communicate_bounded(proc, timeout, what)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def communicate_bounded(proc: subprocess.Popen, timeout: float, what: str = "command") -> tuple:
    """proc's (stdout, stderr) once it has exited; on timeout kill its process group (start_new_session) and fail."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        raise AssertionError(f"{what} timed out after {timeout}s\nstdout:\n{out}\nstderr:\n{err}") from None


def kill_group(proc: subprocess.Popen) -> None:
    """Kill the process group we created for proc (start_new_session), and only that."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for sig (/proc's SigCgt mask): the launcher's first line has run once it
    catches SIGHUP, which Python leaves alone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next((int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:")), 0)
    return bool(mask >> (sig - 1) & 1)


def descendants(pid: int) -> List[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def serves_the_session(p: psutil.Process) -> bool:
    """A process of what a fixture or helper keeps for several tests (SESSION_PIDS: the Ray cluster, the shared
    browser), or one of its children (chromium starts helper processes whenever it likes)."""
    try:
        return bool(SESSION_PIDS) and any(q.pid in SESSION_PIDS for q in [p, *p.parents()])
    except psutil.Error:
        return False


def command_line(p: psutil.Process) -> str:
    """p's command line, or "" where it has gone or is a zombie: a short-lived child of the launcher (the `git`
    it runs to record provenance) can be either between listing the children and reading this."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def worker_processes(pid: int) -> List[psutil.Process]:
    """The launcher's worker processes (and their children): its descendants less the zygote they fork from
    and less the launcher's own helper commands (the `git` it runs to record provenance) with theirs."""
    found = []
    try:
        launcher = psutil.Process(pid)
        children, own = launcher.children(), launcher.cmdline()
    except psutil.NoSuchProcess:
        return []
    for child in children:
        try:
            # a child with the launcher's own command line is forked and not yet exec'ed: the zygote forked at the
            # launcher's start (launcher.prestart), or the `git` on its way (counted as a third worker once,
            # tests/test_watchdog.py under load), which has no children
            if not child.name().startswith("python"):
                continue
            zygote = "zygote" in child.cmdline() or child.cmdline() == own
            found.extend(([] if zygote else [child]) + child.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return found


def group_processes(pgid: int) -> List[psutil.Process]:
    """Live processes of process group pgid (a launch started with start_new_session), zombies left out."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def wait_while_running(check, timeout: float, proc, what: str) -> None:
    """Until check() holds; fails at once, with its output, if the launcher proc ends first, and kills it on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the launcher ended before {what}:\n{proc.communicate()[0]}")
        time.sleep(0.1)
    kill_group(proc)
    raise AssertionError(f"timed out waiting for {what}:\n{proc.communicate()[0]}")


def wait_gone(procs: List[psutil.Process], timeout: float) -> List[psutil.Process]:
    """The processes still alive after timeout (zombies count as gone)."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.1)
    return [p for p in alive if _alive(p)]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def only_run_dir(output_dir: Path) -> Path:
    runs = [p for p in output_dir.iterdir() if p.is_dir()]
    assert len(runs) == 1, f"expected one run directory in {output_dir}, found {runs}"
    return runs[0]


def read_summary(run_dir: Path) -> Dict[str, Any]:
    """summary.json as written; every field declared in launcher/runtime/schema.py and of its declared shape (a field
    left out of the schema is one every reader drops)."""
    from launcher.runtime.schema import SUMMARY

    summary = json.loads((run_dir / "summary.json").read_text())
    assert SUMMARY.undeclared(summary) == [], f"summary.json fields not in the schema: {SUMMARY.undeclared(summary)}"
    SUMMARY.check(summary)  # raises, naming the field, where one has another shape
    return summary


def read_metrics(run_dir: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def start_launcher(args: List[str], cwd: Path, prefix: Optional[List[str]] = None,
                   env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
    """Start `python -m launcher ARGS` in its own process group (prefix: e.g. `ip netns exec NS`)."""
    return subprocess.Popen(
        [*(prefix or []), sys.executable, "-m", "launcher", *args], cwd=cwd, env=launcher_env(env),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )


def finish_all(procs: List[subprocess.Popen], timeout: float) -> List[str]:
    """Wait for every process (each bounded by timeout); kill the groups of those that overrun, then fail."""
    outputs, late = [], []
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            late.append(proc)
            kill_group(proc)
            out, _ = proc.communicate()
        outputs.append(out)
    for proc in procs:
        kill_group(proc)  # whatever a finished launcher might have left in its group
    if late:
        raise AssertionError(f"{len(late)} launcher(s) still running after {timeout}s:\n" + "\n---\n".join(outputs))
    return outputs


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_unavailable() -> str:
    """Why the SLURM tests cannot run here ("" when a SLURM controller answers through SLURM_CONF)."""
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF is not set: bring up cluster/devcluster/up.sh (tests/run.sh does)"
    try:
        done = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return f"sinfo failed ({e.__class__.__name__}): no SLURM client or controller"
    return "" if done.returncode == 0 else f"sinfo failed: {done.stderr.strip()[:200]}"


class Stamped:
    """A process whose stdout and stderr are read as they come (start_stamped): `lines` holds every line as
    (wall time it arrived, "out" | "err", the line), growing while it runs."""

    def __init__(self, argv: List[str], cwd: Path, env: Optional[Dict[str, str]] = None,
                 on_line: Optional[Any] = None) -> None:
        import threading

        self.proc = subprocess.Popen(argv, cwd=cwd, env=launcher_env(env), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: List[Tuple[float, str, str]] = []
        self._on_line = on_line
        self._pumps = [threading.Thread(target=self._pump, args=(s, n), daemon=True)
                       for s, n in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for t in self._pumps:
            t.start()

    def _pump(self, stream: Any, name: str) -> None:
        for line in stream:
            self.lines.append((time.time(), name, line.rstrip("\n")))
            if self._on_line is not None:
                self._on_line(name, line)

    def text(self, stream: str) -> str:
        return "".join(f"{line}\n" for _, s, line in list(self.lines) if s == stream)

    def finish(self, timeout: float) -> int:
        """Its exit code, once it has ended and its output is read; on timeout its group is killed and the test fails."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
            self.proc.wait()
            raise AssertionError(f"timed out after {timeout}s:\n" + "\n".join(text for _, _, text in self.lines[-60:])) from None
        finally:
            for t in self._pumps:
                t.join(timeout=10)
        self.lines.sort(key=lambda item: item[0])
        return self.proc.returncode


def run_stamped(argv: List[str], cwd: Path, timeout: float, env: Optional[Dict[str, str]] = None,
                on_line: Optional[Any] = None) -> Tuple[int, List[Tuple[float, str, str]], int]:
    """Run argv (its own session, launcher_env(env)) reading stdout and stderr as they come: (exit code, every line
    as (wall time it arrived, "out" | "err", the line), its pid). on_line(stream, line), if given, runs as each
    arrives. On timeout the group is killed and the test fails."""
    run = Stamped(argv, cwd, env, on_line)
    return run.finish(timeout), run.lines, run.proc.pid


def log_line_times(log: Path) -> Dict[str, float]:
    """Each line of a rank's log -> when its last byte reached the launcher (wall time, from the log's .times file,
    launcher.agent.streams); a repeated line keeps its first time."""
    import bisect

    entries = [(int(offset), float(at)) for offset, at, _ in
               (line.split() for line in Path(f"{log}.times").read_text().splitlines() if line.strip())]
    offsets = [offset for offset, _ in entries]
    found: Dict[str, float] = {}
    end = 0
    for raw in log.read_bytes().split(b"\n")[:-1]:
        end += len(raw) + 1
        k = bisect.bisect_right(offsets, end - 1) - 1  # the chunk its newline came in
        if k >= 0:
            found.setdefault(raw.decode(errors="replace").rstrip("\r"), entries[k][1])
    return found
