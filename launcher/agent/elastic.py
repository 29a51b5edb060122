"""torch's elastic agent, with our worker processes and our account of failures and restarts.

torch's ``elastic_launch`` builds a ``LocalElasticAgent`` by name; for the launch's duration that
name is our subclass, which (a) starts each attempt's workers as launcher.agent.processes does instead
of torch's multiprocessing context, (b) reports each failed attempt's root cause before a restart
(launcher.agent.failures) and (c) counts the restarts it made, scripts included, and numbers the attempts.

torch counts only restarts after a failure (TORCHELASTIC_RESTART_COUNT, which a script sees unchanged, as
under torchrun); taking in a node that joined restarts the workers too, with the same count. The launcher
numbers every start of the workers: on c10d by the rendezvous round, which every node agrees on (torch opens
a new round for each re-rendezvous, failure or membership change); on the static rendezvous, which re-forms
only after a failure, by the restart count. That number (LAUNCHER_ATTEMPT) names the attempt's rank logs,
its goodput and failure records and the trainer's records, so no attempt overwrites the one before.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Dict, Iterator, List, Optional

from launcher.agent import elastic_fixes
from launcher.agent.failures import FailureWatch
from launcher.agent.membership import record_round, round_nodes
from launcher.agent.processes import WorkerJob, WorkerProcesses
from launcher.runtime import env

log = logging.getLogger("launcher")


def launcher_worker() -> None:
    """The entry point torch's agent is given: a name for its records; launcher.worker.bootstrap runs the workers."""


class AgentRecord:
    """What the agent of this launch did: its restarts (launcher.agent.processes keeps the current workers)."""

    def __init__(self) -> None:
        self.restarts = 0
        self.attempt = 0  # the launcher's number of the current attempt (see the module docstring)
        self.nodes: Optional[List[str]] = None  # the last c10d round's nodes (launcher.agent.membership)

    def observe(self, round_record: Optional[Dict[str, Any]]) -> None:
        """Say when the job re-formed with other nodes (an elastic job's membership change)."""
        if round_record is None:
            return
        nodes = list(round_record["nodes"])
        if self.nodes is not None and nodes != self.nodes:
            left, joined = sorted(set(self.nodes) - set(nodes)), sorted(set(nodes) - set(self.nodes))
            said = "; ".join(part for part in (f"left: {', '.join(left)}" if left else "",
                                               f"joined: {', '.join(joined)}" if joined else "") if part)
            log.info(f"membership changed ({said}): {len(nodes)} node{'s' if len(nodes) > 1 else ''}, "
                     f"world size {round_record['world_size']}")
        self.nodes = nodes


@contextlib.contextmanager
def agent_installed(job: WorkerJob, watch: FailureWatch) -> Iterator[AgentRecord]:
    import torch.distributed.launcher.api as launcher_api
    from torch.distributed.elastic.agent.server import local_elastic_agent

    base = launcher_api.LocalElasticAgent
    record = AgentRecord()

    def start_processes(name: str, entrypoint: Any, args: Any, envs: Any, logs_specs: Any,
                        log_line_prefixes: Any = None, **_: Any) -> WorkerProcesses:
        for worker_env in envs.values():  # read by the logs' names (RunDirLogsSpecs) and the workers
            worker_env[env.ATTEMPT] = str(record.attempt)
        processes = WorkerProcesses(name, entrypoint, args, envs, logs_specs, log_line_prefixes, job)
        processes.start()
        return processes

    class LauncherAgent(base):  # type: ignore[misc, valid-type]
        def _start_workers(self, worker_group: Any) -> Any:
            record.restarts = worker_group.spec.max_restarts - self._remaining_restarts
            saved = local_elastic_agent.start_processes
            local_elastic_agent.start_processes = start_processes
            try:
                return super()._start_workers(worker_group)
            finally:
                local_elastic_agent.start_processes = saved

        def _rendezvous(self, worker_group: Any) -> None:
            super()._rendezvous(worker_group)
            if job.run_dir:
                record.observe(record_round(job.run_dir, worker_group))
            restart = worker_group.spec.max_restarts - self._remaining_restarts
            seen = round_nodes(worker_group.spec.rdzv_handler)
            record.attempt = restart if seen is None else seen["round"]
            if restart and worker_group.spec.rdzv_handler.get_backend() == "static":
                timeout_s = worker_group.spec.rdzv_handler.timeout.total_seconds()
                self._launcher_restart_store = elastic_fixes.restart_workers_store(worker_group, restart, timeout_s)

        def _monitor_workers(self, worker_group: Any) -> Any:
            result = super()._monitor_workers(worker_group)
            if result.is_failed():
                watch.on_failure(result.failures, worker_group, record.attempt, self._remaining_restarts,
                                 resumes=job.kind == "trainer")
            return result

    launcher_api.LocalElasticAgent = LauncherAgent
    try:
        yield record
    finally:
        launcher_api.LocalElasticAgent = base
