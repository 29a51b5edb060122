"""This node's worker processes for one attempt: started, watched, stopped (torch's PContext contract).

torch's elastic agent keeps its rendezvous, restarts and monitoring; the processes are ours:
forked from the warm zygote (launcher.agent.zygote) or started as fresh interpreters (start method
spawn), each running launcher.worker.bootstrap. Compared with torch's own process contexts:
- results: a worker's exit code is the truth; the built-in trainer's result dict comes back
  through a file, not a multiprocessing queue (a queue the agent never drained left every worker
  waiting at exit, about 1 launch in 13 at 4 workers);
- a rank whose script returned but whose interpreter does not exit within
  launcher.exit_timeout_s (a destructor deadlock in torch, say) is named, its stacks dumped, and
  killed; the job keeps the exit code the script ended with;
- failures name only ranks that failed on their own: once one failed, the ranks this class stops
  (or that had finished) are not blamed.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from torch.distributed.elastic.multiprocessing.api import RunProcsResult
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from launcher.agent.failures import readable_error_file
from launcher.agent.spec import WorkerKind
from launcher.plan import StartMethod
from launcher.agent.streams import OutputRouter, console_streams
from launcher.agent.zygote import BOOTSTRAP, Zygote
from launcher.interrupts import blocked_for_child, start_thread
from launcher.runtime import safefs, torch_private
from launcher.runtime.beats import STACK_SIGNAL, stack_file
from launcher.runtime.env import ATTEMPT

log = logging.getLogger("launcher")
STACK_WAIT_S = 2.0
STATUS_WAIT_S = 0.2  # for a rank's last status line, once its exit is seen


def result_file(run_dir: str, rank: int) -> Path:
    """Where the built-in trainer's rank leaves its result dict for the agent (launcher.worker.trainer)."""
    return Path(run_dir) / "logs" / f".result-rank-{rank}.json"


@dataclass
class WorkerJob:
    """What every worker of this node runs, whatever the attempt."""

    kind: WorkerKind
    target: Optional[str]  # the script path or module name
    args: tuple
    run_dir: str
    added_env: Dict[str, str]  # what the launcher adds to the agent's environment (plan.worker_env)
    dropped_env: tuple  # the agent's own variables, which workers do not get
    start_method: StartMethod
    exit_timeout_s: float
    heartbeat: bool  # register each rank with the hang watchdog (stack dumps, heartbeat files)
    config: Dict[str, Any] = field(default_factory=dict)  # the built-in trainer's config
    cwd: str = field(default_factory=os.getcwd)
    ignored_signals: tuple = ()  # signals a scheduler sends every process of its job step (SLURM's warning USR2)
    # a script's step records (launcher/worker/progress.py): {"launch": launch key, "wandb": bool}; None = off
    steps: Optional[Dict[str, Any]] = None
    redirects: str = "0"  # launcher.redirects: streams the console leaves out (torchrun's -r)
    ranks_filter: tuple = ()  # launcher.local_ranks_filter: the local ranks the console shows; () = all


@dataclass
class _Worker:
    local_rank: int
    rank: int
    pid: int
    popen: Optional[subprocess.Popen] = None
    code: Optional[int] = None  # exit code once it ended
    ended_at: Optional[float] = None
    failed_at: Optional[float] = None  # time.time() it ended (its own word where it said, else when it was reaped)
    on_its_own: bool = True  # False: it ended after we started stopping the attempt
    hung_at_exit: bool = False


class WorkerProcesses(torch_private.process_context_class()):  # type: ignore[misc]
    """One attempt's workers on this node: torch's PContext (start, wait, close, pids) for its agent."""

    latest: Optional["WorkerProcesses"] = None  # this node's current attempt (SLURM's checkpoint signal needs it)

    def __init__(self, name: str, entrypoint: Any, args: Dict[int, tuple], envs: Dict[int, Dict[str, str]],
                 logs_specs: Any, log_line_prefixes: Optional[Dict[int, str]], job: WorkerJob) -> None:
        super().__init__(name, entrypoint, args, envs, logs_specs, log_line_prefixes)
        self.job = job
        self.workers: Dict[int, _Worker] = {}
        self.router = OutputRouter()
        self.stopping = False
        self._closed = False

    # ---- start

    def base_env(self) -> Dict[str, str]:
        """The agent's environment as it is now (torch's launch_agent adds to it), less its own variables."""
        env = {k: v for k, v in os.environ.items() if k not in self.job.dropped_env}
        env.update(self.job.added_env)
        return env

    def start_all(self) -> None:
        base = self.base_env()
        zygote = Zygote.current() if self.job.start_method == "fork" else None
        if zygote is not None and zygote.proc.poll() is not None:  # killed: its workers went with it
            log.warning(f"the worker zygote (pid {zygote.proc.pid}) is gone (exit code {zygote.proc.returncode}): "
                        "starting a new one for this attempt's workers")
            zygote = None
        if self.job.start_method == "fork" and zygote is None:
            zygote = Zygote.start("trainer" if self.job.kind == "trainer" else "script", base)
        for local_rank in range(self.nprocs):
            env = {**base, **self.envs[local_rank]}
            rank = int(env["RANK"])
            attempt = int(env.get(ATTEMPT) or env.get("TORCHELASTIC_RESTART_COUNT") or 0)
            if self.job.kind != "trainer":  # a script's environment stays torchrun's
                env.pop(ATTEMPT, None)
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            status_r, status_w = os.pipe()
            spec = self._spec(local_rank, rank, env, attempt)
            if zygote is not None:
                pid, popen = zygote.fork(spec, [out_w, err_w, status_w]), None
            else:
                popen = spawn_worker(spec, env, self.job.cwd, out_w, err_w, status_w)
                pid = popen.pid
            for fd in (out_w, err_w, status_w):
                os.close(fd)
            shown = console_streams(self.job.redirects, self.job.ranks_filter, local_rank)
            self.router.add(rank, out_r, err_r, status_r, self.stdouts[local_rank], shown)
            self.workers[local_rank] = _Worker(local_rank, rank, pid, popen)
        start_thread(self.router)  # a Ctrl-C right now: after it has started
        WorkerProcesses.latest = self

    def _spec(self, local_rank: int, rank: int, env: Dict[str, str], attempt: int) -> Dict[str, Any]:
        spec: Dict[str, Any] = {"kind": self.job.kind, "target": self.job.target, "args": list(self.job.args),
                                "env": env, "cwd": self.job.cwd, "error_file": self.error_files.get(local_rank),
                                "ignored_signals": list(self.job.ignored_signals)}
        if self.job.heartbeat:
            spec["heartbeat"] = {"run_dir": self.job.run_dir, "rank": rank, "local_rank": local_rank}
        if self.job.steps is not None:
            spec["steps"] = {**self.job.steps, "run_dir": self.job.run_dir, "rank": rank, "attempt": attempt}
        if self.job.kind == "trainer":
            spec["trainer"] = {"config": self.job.config, "run_dir": self.job.run_dir,
                               "result_file": self._result_file(rank)}
        return spec

    def _result_file(self, rank: int) -> str:
        return str(result_file(self.job.run_dir, rank))

    # ---- watch

    def pids(self) -> Dict[int, int]:
        return {w.local_rank: w.pid for w in self.workers.values()}

    def _collect_exits(self) -> None:
        zygote = Zygote.current()
        exits = zygote.poll() if zygote is not None and self.job.start_method == "fork" else {}
        zygote_gone = zygote is not None and self.job.start_method == "fork" and zygote.proc.poll() is not None
        now = time.monotonic()
        for w in self.workers.values():
            if w.code is not None:
                continue
            code = w.popen.poll() if w.popen is not None else exits.get(w.pid)
            if code is None and zygote_gone and w.popen is None:
                code = -signal.SIGKILL  # the zygote's death took its workers (PR_SET_PDEATHSIG)
            if code is not None:
                w.code, w.ended_at, w.on_its_own = code, now, not self.stopping
                w.failed_at = self._ended_when(w, zygote.exited_at if zygote is not None and w.popen is None else {})

    def _ended_when(self, w: _Worker, reaped: Dict[int, float]) -> float:
        """When the worker's script ended (the worker says, to the millisecond), else when its process was reaped: for
        the rank that failed first, which the others' failures follow (launcher.agent.failures.root_cause)."""
        deadline = time.monotonic() + (STATUS_WAIT_S if w.code is not None and w.code > 0 else 0.0)
        while True:  # an exit with a code came after its `done` line: the router thread may not have read it yet
            status = self.router.status.get(w.rank)
            if status is not None and status.done_wall is not None:
                return status.done_wall
            if time.monotonic() >= deadline:
                return reaped.get(w.pid, time.time())
            time.sleep(0.01)

    def failure_times(self) -> Dict[int, float]:
        """{global rank: when it failed} of the ranks that failed on their own this attempt."""
        return {w.rank: w.failed_at for w in self.workers.values()
                if w.failed_at is not None and w.code not in (None, 0) and w.on_its_own}

    def _check_exit_hangs(self) -> None:
        """A rank whose script returned but whose process lingers past the bound: name it, kill it."""
        now = time.monotonic()
        for w in self.workers.values():
            status = self.router.status.get(w.rank)
            if w.code is not None or status is None or status.done_at is None:
                continue
            if now - status.done_at < self.job.exit_timeout_s:
                continue
            where = self._dump_stacks(w)
            log.warning(f"rank {w.rank} finished its script (exit code {status.done_code}) but its process did not "
                        f"exit within {self.job.exit_timeout_s:g}s (launcher.exit_timeout_s){where}; killed it, "
                        f"the rank's result stands. A process group destroyed while a DDP model is alive can do this.")
            _kill(w.pid)
            w.hung_at_exit = True
            self._wait_for(lambda w=w: w.code is not None, 10.0)  # type: ignore[misc]
            w.code = status.done_code

    def _dump_stacks(self, w: _Worker) -> str:
        if not self.job.heartbeat:
            return ""
        path = stack_file(self.job.run_dir, w.rank)
        try:
            os.kill(w.pid, STACK_SIGNAL)
        except ProcessLookupError:
            return ""
        deadline = time.monotonic() + STACK_WAIT_S
        while time.monotonic() < deadline and not (path.exists() and path.stat().st_size):
            time.sleep(0.05)
        return f"; its stacks are in {path}"

    def poll_all(self) -> Optional[RunProcsResult]:
        self._collect_exits()
        self._check_exit_hangs()
        failed = {w.local_rank: w for w in self.workers.values() if w.code not in (None, 0) and w.on_its_own}
        if not failed and any(w.code is None for w in self.workers.values()):
            return None
        self.close()
        if failed:
            failures = {lr: ProcessFailure(local_rank=lr, pid=w.pid, exitcode=int(w.code or 0),
                                           error_file=readable_error_file(self.error_files.get(lr, "")))
                        for lr, w in failed.items()}
            return RunProcsResult(failures=failures, stdouts=self.stdouts, stderrs=self.stderrs)
        return RunProcsResult(return_values={w.local_rank: self._result(w) for w in self.workers.values()},
                              stdouts=self.stdouts, stderrs=self.stderrs)

    def _result(self, w: _Worker) -> Any:
        if self.job.kind != "trainer":
            return {"rank": w.rank, "exit_code": w.code, "hung_at_exit": w.hung_at_exit}
        path = Path(self._result_file(w.rank))
        try:
            result = json.loads(safefs.read_bytes(str(path), root=self.job.run_dir))  # never through a planted link
            path.unlink()
            return result
        except (OSError, ValueError):
            return None

    # ---- stop

    def close_all(self, death_sig: signal.Signals, timeout: int = 30) -> None:
        if self._closed:
            return
        self.stopping = True
        self._collect_exits()
        for w in self.workers.values():
            if w.code is None:
                _signal(w.pid, death_sig)
        self._wait_for(lambda: all(w.code is not None for w in self.workers.values()), timeout)
        for w in self.workers.values():
            if w.code is None:
                log.debug(f"rank {w.rank} (pid {w.pid}) did not stop on {death_sig.name} within {timeout}s: SIGKILL")
                _kill(w.pid)
        self._wait_for(lambda: all(w.code is not None for w in self.workers.values()), timeout)
        self.router.finish()
        self._closed = True

    def _wait_for(self, condition: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._collect_exits()
            if condition() or time.monotonic() >= deadline:
                return
            time.sleep(0.02)


def spawn_worker(spec: Dict[str, Any], env: Dict[str, str], cwd: str, out_w: int, err_w: int,
                 status_w: int) -> subprocess.Popen:
    """One worker as a fresh interpreter (start method spawn) running launcher.worker.bootstrap; it starts with the
    stop signals blocked and takes them once its rank's code starts: a Ctrl-C to the group during its interpreter's
    start would print a traceback, and the agent's stop sent before then arrives then."""
    spec_r, spec_w = os.pipe()
    with blocked_for_child():
        popen = subprocess.Popen(
            [sys.executable, "-u", BOOTSTRAP, "worker", str(spec_r), str(os.getpid())],
            env=env, cwd=cwd, stdout=out_w, stderr=err_w, pass_fds=(spec_r, status_w), close_fds=True,
        )
    os.close(spec_r)
    with os.fdopen(spec_w, "w") as f:
        json.dump({"spec": spec, "fds": [1, 2, status_w]}, f)
    return popen


def running_worker_pids() -> list:
    """The pids of this node's workers that are still running (none before the first attempt)."""
    latest = WorkerProcesses.latest
    if latest is None:
        return []
    latest._collect_exits()
    return [w.pid for w in latest.workers.values() if w.code is None]


def _signal(pid: int, signum: int) -> None:
    """The worker's process group (it leads its own, as torchrun's do: its data loader workers too), or the worker
    alone in the instant before it made its group (launcher.worker.bootstrap.become_worker)."""
    try:
        os.killpg(pid, signum)
        return
    except ProcessLookupError:
        pass
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _kill(pid: int) -> None:
    _signal(pid, signal.SIGKILL)
