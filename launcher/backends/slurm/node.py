"""This node of a SLURM job: `launcher.backends.slurm.node TASK_PID`, the job's config (JSON) on stdin.

The task's own process (submitit's, launcher.backends.slurm.task) starts this one as its child through
launcher/worker/bootstrap.py (launcher.backends.children.zygote_module_command), which imports torch once
for this agent and the zygote its workers fork from. It dies with the task's process (PR_SET_PDEATHSIG).
It runs in the task's process group, so every proctrack plugin signals it as it signals the task: SLURM's
USR2 (the time limit's warning, `scancel --signal=USR2`), which it passes on to its workers, and a cancel's
SIGTERM, on which the agent stops them as a local run's does. The rendezvous secret, where SLURM's
environment carries one (launcher.backends.slurm.submit.job_secret), reaches it the same way: inherited.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import List, Optional

from launcher.agent.processes import running_worker_pids
from launcher.agent.zygote import die_with_parent
from launcher.backends.dispatch import launch
from launcher.backends import registry
from launcher.backends.local import note_preemption
from launcher.backends.slurm.environment import SlurmEnvironment
from launcher.clock import process_start_time
from launcher.config.schema import from_dict
from launcher.errors import LauncherError
from launcher.logs import setup_launcher_logging
from launcher.rundir import archive_rank_logs, read_json, write_json

log = logging.getLogger("launcher")
STOP_SIGNAL = signal.SIGUSR2  # submitit's checkpoint signal; the trainer stops on it (trainers.faults.stop)


def stop_workers(signum: int, _frame: Optional[FrameType]) -> None:
    """USR2: ask this node's workers to checkpoint at the next step boundary and stop.

    SLURM may have signalled them already (proctrack signals every process of the step), and the task's
    process passes its USR2 on here too: a repeat within the trainer's window is ignored (trainers.faults.stop).
    The workers of the other nodes stop at the same step: the ranks agree on a stop at every step boundary.
    The job then ends "preempted", not failed (launcher.backends.local.Preemption).
    """
    note_preemption(signum)
    pids = running_worker_pids()  # the workers this process started (launcher.agent.processes keeps them)
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    if pids:
        log.info(f"got {signal.Signals(signum).name}: the workers checkpoint at the next step boundary and stop")


def note_requeue(env: SlurmEnvironment, run_dir: Path) -> None:
    """A requeued attempt keeps the previous attempt's rank logs under logs/slurm-attempt-N/.

    Node 0 moves them once it holds its slot: no node's workers start before node 0 is up (rendezvous).
    """
    if not env.restart_count:
        return
    log.info(f"SLURM job {env.job_id} requeued {env.restart_count} time(s): resuming from the latest checkpoint")
    if env.node_rank == 0:
        archive_rank_logs(run_dir, f"slurm-attempt-{env.restart_count - 1}")


def record_requeues(run_dir: Path, env: SlurmEnvironment, started: float) -> None:
    """summary.json counts SLURM requeues among the restarts, and names the job.

    Only a summary this attempt wrote (since `started`): an earlier attempt's has its count already.
    """
    path = run_dir / "summary.json"
    if not path.is_file() or path.stat().st_mtime < started:
        return
    summary = read_json(path)
    summary["slurm_job_id"] = env.job_id
    summary["slurm_requeues"] = env.restart_count
    summary["restarts"] = int(summary.get("restarts") or 0) + env.restart_count
    write_json(path, summary)


def main(argv: List[str]) -> int:
    if not die_with_parent(int(argv[0])):  # the task's process is gone already
        return 1
    signal.signal(STOP_SIGNAL, stop_workers)
    # the task's process started this one with USR2 blocked (launcher.backends.slurm.task): one that came while
    # torch was importing is held, not fatal, and arrives now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, (STOP_SIGNAL,))
    config = json.loads(sys.stdin.read())
    env = SlurmEnvironment.from_environ()
    run_dir = Path(config["output_dir"]) / str(config.get("run_id") or env.run_id)
    setup_launcher_logging(None)
    started = process_start_time()
    try:  # the run directory is this job's (submit made it), on its first attempt as on a requeue
        cfg = registry.adopt_allocation(from_dict(config))
        return launch(cfg, started, continuing=lambda _: note_requeue(env, run_dir))
    except LauncherError as e:
        print(f"error: node {env.node_rank}: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    finally:  # a failed or stopped job's summary names its SLURM job too
        if env.node_rank == 0:
            record_requeues(run_dir, env, started)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
