"""What runs inside a SLURM job: one task per node, each running this node's agent as its child.

`SlurmNodeAgent` is the callable submitit pickles and calls in every task. It loads no torch: it starts
this node's agent (launcher.backends.slurm.node) as a child through launcher/worker/bootstrap.py, which
imports torch once for the agent and for the zygote its workers fork from (launcher.prestart), and waits
for it. It implements submitit's Checkpointable, so SLURM's warning signal (USR2, before the time limit or
on `scancel --signal=USR2`) makes the workers save a checkpoint at the next step boundary and the job
requeue. The requeued job runs the same callable in the same run directory, and the trainer resumes from
the newest checkpoint there. While it waits, summary.json says "preempted" (the node agent writes it as it
ends) and whether SLURM requeued it (this process adds that): slurm.max_requeues caps the requeues, a
preemption's as a time limit's (submitit's own count is of time limits only).

Processes of a task: submitit's (this module) -> the node agent -> its zygote -> the workers (each its own
session). The agent stays in the task's process group, so SLURM signals it whatever the proctrack plugin:
with proctrack/linuxproc or cgroup every process of the step gets SLURM's USR2 and SIGTERM, with pgid the
task's process group. It dies with this process (PR_SET_PDEATHSIG), and its zygote kills the workers then.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from launcher.backends.children import workers_kind, zygote_module_command
from launcher.backends.slurm.environment import SlurmEnvironment
from launcher.errors import LaunchError
from launcher.logs import setup_launcher_logging
from launcher.rundir import build_summary, read_json, write_json
from launcher.runtime import formatting
from launcher.runtime.formatting import first_line
from launcher.runtime.schema import Status

if TYPE_CHECKING:
    from launcher.config.sections import Config

log = logging.getLogger("launcher")
STOP_SIGNAL = signal.SIGUSR2  # submitit's checkpoint signal; the node agent passes it on (launcher.backends.slurm.node)
LEAVE_WAIT_S = 10.0  # this process is leaving (a requeue): how long the agent gets to end on SIGTERM before SIGKILL


@dataclass(frozen=True)
class TaskSpec:
    """What a task needs of the job's config, resolved at submission (submitit's process loads no config code)."""

    config: Dict[str, Any]  # the whole config (launcher.config.schema.to_dict), for the node agent
    output_dir: str
    run_id: Optional[str]  # None: SLURM's job id names the run (SlurmEnvironment.run_id)
    grace_s: float  # checkpoint.grace_s: how long the workers get to save on the warning signal
    workers: Optional[str]  # launcher.backends.children.workers_kind
    max_requeues: int  # slurm.max_requeues: preemptions (and time limits) survived by a requeue

    @classmethod
    def of(cls, cfg: "Config") -> "TaskSpec":
        from launcher.config.schema import to_dict

        from launcher.backends.slurm.options import slurm_section

        return cls(to_dict(cfg), str(cfg.output_dir), cfg.run_id, float(cfg.checkpoint.grace_s), workers_kind(cfg),
                   int(slurm_section(cfg).max_requeues))


class SlurmNodeAgent:
    """submitit's callable: this node's part of the job. Picklable: a TaskSpec and nothing live."""

    _child: "Optional[subprocess.Popen[bytes]]" = None  # the node agent while it runs (for checkpoint())
    _started = 0.0  # when this attempt's task began: a summary.json older than that is an earlier attempt's
    _requeue: Optional[bool] = None  # after checkpoint(): whether it asked submitit to requeue the job

    def __init__(self, task: TaskSpec) -> None:
        self.task = task

    def __getstate__(self) -> Dict[str, Any]:
        return {"task": self.task}

    @property
    def run_dir(self) -> Path:
        return Path(self.task.output_dir) / str(self.task.run_id or SlurmEnvironment.from_environ().run_id)

    def __call__(self) -> int:
        env = SlurmEnvironment.from_environ()
        self._started = time.time()
        setup_launcher_logging(None)
        self._child = start_node_agent(self.task)
        try:
            code = self._child.wait()
        except SystemExit:
            raise  # submitit requeued the job (checkpoint() said so in summary.json)
        except BaseException as e:  # after checkpoint(): submitit's requeue failed (scontrol), or was not asked for
            if self._requeue:
                record_preemption(self.run_dir, self._started, False, f"the requeue failed: {first_line(e)}")
            raise
        finally:  # a requeue (submitit's SystemExit from checkpoint()) or an error here: the agent ends too
            stop_node_agent(self._child)
        if code == 128 + STOP_SIGNAL:  # another node's agent, preempted: node 0's task requeues the job, or not
            raise LaunchError(f"node {env.node_rank} was preempted ({STOP_SIGNAL.name}); see {self.run_dir}/summary.json")
        if code != 0:
            raise LaunchError(f"node {env.node_rank} ended with exit code {code}; see {self.run_dir}/logs")
        return code

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """On USR2 (rank 0's task only): let the workers save at the next step and the agent record the end, then
        requeue while slurm.max_requeues allows (summary.json says which)."""
        import submitit

        if self._child is not None:
            stop_workers_and_wait(self._child.pid, self.task.grace_s + 5.0)
            wait_for_exit(self._child.pid, LEAVE_WAIT_S)  # it writes summary.json ("preempted"), then ends
        done, limit = SlurmEnvironment.from_environ().restart_count, self.task.max_requeues
        why = "" if done < limit else f"slurm.max_requeues={limit} reached ({done} requeue(s) so far): raise it to requeue more"
        self._requeue = not why
        record_preemption(self.run_dir, self._started, self._requeue, why)
        return None if why else submitit.helpers.DelayedSubmission(SlurmNodeAgent(self.task))


def record_preemption(run_dir: Path, since: float, requeued: bool, why: str = "") -> None:
    """summary.json of a preempted attempt: whether SLURM runs it again, and if not why and what to do. The node agent
    wrote it as it ended ("preempted"); where it wrote none (killed first), one from here."""
    path = run_dir / "summary.json"
    try:
        summary = read_json(path) if path.stat().st_mtime >= since else None
    except (OSError, ValueError):
        summary = None
    if not isinstance(summary, dict):
        summary = build_summary({"run_id": run_dir.name, "status": Status.PREEMPTED, "preempted_at": time.time(),
                                 "stopped_by": STOP_SIGNAL.name}, None)
    if summary.get("status") == Status.COMPLETED:
        return  # its last step came first: nothing was stopped
    summary["requeued"] = requeued
    if not requeued:
        when = formatting.clock(summary.get("preempted_at"), dated=True)
        summary["error"] = (f"preempted at {when} ({STOP_SIGNAL.name}) and not requeued: {why}; continue from its "
                            f"newest checkpoint: python -m launcher resume {run_dir}")
    write_json(path, summary)
    log.info(f"{'requeued' if requeued else 'not requeued'} after a preemption{': ' + why if why else ''}")


def wait_for_exit(pid: int, timeout_s: float) -> None:
    """Until this process's child pid has exited (a zombie: the main thread, in its wait(), reaps it later)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.Error:
            return
        time.sleep(0.1)


def start_node_agent(task: TaskSpec) -> "subprocess.Popen[bytes]":
    """This node's agent as a child: the config on its stdin, this process's environment (SLURM's variables, and the
    rendezvous secret where the job carries one) inherited, its output into this task's log.

    USR2 stays blocked from the fork until the agent has its handler: one that came while it imports torch would
    end it (the default action) instead of checkpointing."""
    command = zygote_module_command("launcher.backends.slurm.node", task.workers, str(os.getpid()))
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, (STOP_SIGNAL,))
    try:
        child = subprocess.Popen(command, stdin=subprocess.PIPE)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    assert child.stdin is not None
    with child.stdin:
        child.stdin.write(json.dumps(task.config).encode())
    return child


def stop_node_agent(child: "subprocess.Popen[bytes]") -> None:
    """End the agent if it still runs: SIGTERM (it stops its workers as on a cancel), SIGKILL after LEAVE_WAIT_S."""
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(LEAVE_WAIT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def worker_pids(agent: int) -> List[int]:
    """The node's workers still running: the agent's descendants that lead their own session (a worker makes one,
    as torchrun's do; the agent and its zygote stay in the task's, a worker's own children in the worker's)."""
    import psutil

    try:
        found = psutil.Process(agent).children(recursive=True)
    except psutil.Error:
        return []
    pids = []
    for proc in found:
        try:
            if os.getsid(proc.pid) == proc.pid:
                pids.append(proc.pid)
        except OSError:  # it ended meanwhile
            pass
    return pids


def stop_workers_and_wait(agent: int, timeout_s: float) -> None:
    """Ask this node's workers to checkpoint and stop, through their agent (it keeps their pids); wait until they
    have exited, or the agent has.

    SLURM may already have signalled the agent and the workers (proctrack/linuxproc and cgroup signal every process
    of the step): a repeat within the trainer's window is ignored (trainers.faults.stop).
    """
    try:
        os.kill(agent, STOP_SIGNAL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and worker_pids(agent):
        time.sleep(0.2)
    log.info("workers stopped after a checkpoint; requeueing")
