"""What runs inside a SLURM job: one task per node, each running this node's agent.

`SlurmNodeAgent` is the callable submitit pickles and calls in every task; it implements
submitit's Checkpointable, so SLURM's warning signal (USR2, before the time limit or on
`scancel --signal=USR2`) makes the workers save a checkpoint at the next step boundary and
the job requeue. The requeued job runs the same callable in the same run directory, and the
trainer resumes from the newest checkpoint there.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any, Dict

from launcher.agent.processes import running_worker_pids
from launcher.backends.dispatch import launch
from launcher.backends.slurm.environment import SlurmEnvironment, adopt_allocation
from launcher.clock import process_start_time
from launcher.config.schema import from_dict
from launcher.errors import LaunchError
from launcher.logs import setup_launcher_logging
from launcher.rundir import archive_rank_logs, read_json, write_json

log = logging.getLogger("launcher")
STOP_SIGNAL = signal.SIGUSR2  # submitit's checkpoint signal; the trainer stops on it (trainers.faults.stop)


class SlurmNodeAgent:
    """submitit's callable: this node's part of the job. Picklable: a config dict and nothing live."""

    def __init__(self, config: Dict[str, Any]) -> None:
        self.config = config

    def __call__(self) -> int:
        cfg = adopt_allocation(from_dict(self.config))
        env = SlurmEnvironment.from_environ()
        run_dir = Path(cfg.output_dir) / str(cfg.run_id)
        setup_launcher_logging(None)
        started = process_start_time()
        try:  # the run directory is this job's (submit made it), on its first attempt as on a requeue
            code = launch(cfg, dry_run=False, started=started, continuing=lambda _: self._note_requeue(env, run_dir))
        finally:  # a failed or stopped job's summary names its SLURM job too
            if env.node_rank == 0:
                record_requeues(run_dir, env, started)
        if code != 0:
            raise LaunchError(f"node {env.node_rank} ended with exit code {code}; see {run_dir}/logs")
        return code

    @staticmethod
    def _note_requeue(env: SlurmEnvironment, run_dir: Path) -> None:
        """A requeued attempt keeps the previous attempt's rank logs under logs/slurm-attempt-N/.

        Node 0 moves them once it holds its slot: no node's workers start before node 0 is up (rendezvous).
        """
        if not env.restart_count:
            return
        log.info(f"SLURM job {env.job_id} requeued {env.restart_count} time(s): resuming from the latest checkpoint")
        if env.node_rank == 0:
            archive_rank_logs(run_dir, f"slurm-attempt-{env.restart_count - 1}")

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """On USR2 (rank 0's task only): let the workers save at the next step, then requeue."""
        import submitit

        grace = float(self.config.get("checkpoint", {}).get("grace_s", 8.0))
        stop_workers_and_wait(grace + 5.0)
        return submitit.helpers.DelayedSubmission(SlurmNodeAgent(self.config))


def stop_workers_and_wait(timeout_s: float) -> None:
    """Ask this node's workers to checkpoint and stop; wait until they have exited.

    SLURM may already have signalled them (proctrack signals every process of the step); a second
    signal within the trainer's repeat window is ignored (trainers.faults.stop). The workers of the other
    nodes stop at the same step: the ranks agree on a stop at every step boundary.
    """
    for pid in running_worker_pids():
        try:
            os.kill(pid, STOP_SIGNAL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and running_worker_pids():
        time.sleep(0.2)
    log.info("workers stopped after a checkpoint; requeueing")


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
