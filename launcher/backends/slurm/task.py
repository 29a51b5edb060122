"""What runs inside a SLURM job: one task per node, each running this node's agent as its child.

`SlurmNodeAgent` is the callable submitit pickles and calls in every task. It loads no torch: it starts
this node's agent (launcher.backends.slurm.node) as a child through launcher/worker/bootstrap.py, which
imports torch once for the agent and for the zygote its workers fork from (launcher.prestart), and waits
for it. It implements submitit's Checkpointable, so SLURM's warning signal (USR2, before the time limit or
on `scancel --signal=USR2`) makes the workers save a checkpoint at the next step boundary and the job
requeue. The requeued job runs the same callable in the same run directory, and the trainer resumes from
the newest checkpoint there.

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
from typing import Any, Dict, List, Optional

from launcher.backends.children import workers_kind, zygote_module_command
from launcher.backends.slurm.environment import SlurmEnvironment
from launcher.errors import LaunchError
from launcher.logs import setup_launcher_logging

log = logging.getLogger("launcher")
STOP_SIGNAL = signal.SIGUSR2  # submitit's checkpoint signal; the node agent passes it on (launcher.backends.slurm.node)
LEAVE_WAIT_S = 10.0  # this process is leaving (a requeue): how long the agent gets to end on SIGTERM before SIGKILL


class SlurmNodeAgent:
    """submitit's callable: this node's part of the job. Picklable: a config dict and nothing live."""

    _child: "Optional[subprocess.Popen[bytes]]" = None  # the node agent while it runs (for checkpoint())

    def __init__(self, config: Dict[str, Any]) -> None:
        self.config = config

    def __getstate__(self) -> Dict[str, Any]:
        return {"config": self.config}

    def __call__(self) -> int:
        env = SlurmEnvironment.from_environ()
        run_dir = Path(self.config["output_dir"]) / str(self.config.get("run_id") or env.run_id)
        setup_launcher_logging(None)
        self._child = start_node_agent(self.config)
        try:
            code = self._child.wait()
        finally:  # a requeue (submitit's SystemExit from checkpoint()) or an error here: the agent ends too
            stop_node_agent(self._child)
        if code != 0:
            raise LaunchError(f"node {env.node_rank} ended with exit code {code}; see {run_dir}/logs")
        return code

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """On USR2 (rank 0's task only): let the workers save at the next step, then requeue."""
        import submitit

        grace = float(self.config.get("checkpoint", {}).get("grace_s", 8.0))
        if self._child is not None:
            stop_workers_and_wait(self._child.pid, grace + 5.0)
        return submitit.helpers.DelayedSubmission(SlurmNodeAgent(self.config))


def start_node_agent(config: Dict[str, Any]) -> "subprocess.Popen[bytes]":
    """This node's agent as a child: the config on its stdin, this process's environment (SLURM's variables, and the
    rendezvous secret where the job carries one) inherited, its output into this task's log.

    USR2 stays blocked from the fork until the agent has its handler: one that came while it imports torch would
    end it (the default action) instead of checkpointing."""
    command = zygote_module_command("launcher.backends.slurm.node", workers_kind(config), str(os.getpid()))
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, (STOP_SIGNAL,))
    try:
        child = subprocess.Popen(command, stdin=subprocess.PIPE)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
    assert child.stdin is not None
    with child.stdin:
        child.stdin.write(json.dumps(config).encode())
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
