"""torch's elastic agent, built here the way torch's ``launch_agent`` builds it, with our worker processes and our
account of failures and restarts.

The agent is a LocalElasticAgent subclass (launcher.runtime.torch_private) whose hooks call AgentHooks, which
(a) starts each attempt's workers as launcher.agent.processes does instead of torch's multiprocessing context,
with torchrun's environment contract (worker_envs), (b) reports each failed attempt's root cause before a
restart (launcher.agent.failures) and (c) counts the restarts it made, scripts included, and numbers the attempts.

torch counts only restarts after a failure (TORCHELASTIC_RESTART_COUNT, which a script sees as under torchrun);
taking in a node that joined restarts the workers too, with the same count. A round that lost a node counts once,
whether the workers' failure or the nodes waiting to join (a hot spare) came first, and every node of a round takes
the highest count among them (a spare made none of its own: launcher.agent.membership.job_restarts). The launcher numbers every start of
the workers: on c10d by the rendezvous round, which every node agrees on (torch opens a new round for each
re-rendezvous, failure or membership change); on the static rendezvous, which re-forms only after a failure, by
the restart count. That number (LAUNCHER_ATTEMPT) names the attempt's rank logs, its goodput and failure records
and the trainer's records, so no attempt overwrites the one before.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig

from launcher.agent import elastic_fixes
from launcher.agent.eviction import Evicted, Eviction
from launcher.agent.failures import FailureWatch
from launcher.agent.membership import job_restarts, record_round
from launcher.agent.processes import WorkerJob, WorkerProcesses
from launcher.agent.rendezvous import ReformingTimeout
from launcher.config.elastic import round_line
from launcher.runtime import env, torch_private

log = logging.getLogger("launcher")
ENTRYPOINT = "launcher_worker"  # the name torch's records give the workers' entry point


class Restarts:
    """Whether a failed attempt may still be restarted: not once the job's scheduler said it takes the job back (its
    ranks stopped on that warning, and a restart would only run them into the kill)."""

    stopped = False


def stop_restarts() -> None:
    """No more restarts in this process (safe in a signal handler)."""
    Restarts.stopped = True


def launcher_worker() -> None:
    """The entry point torch's agent is given: a name for its records; launcher.worker.bootstrap runs the workers."""


@dataclasses.dataclass(frozen=True)
class AgentSettings:
    """What torch's LaunchConfig would say of this node's agent (launcher.agent.launch makes it from the plan)."""

    role: str  # torchrun's --role: workers see ROLE_NAME
    workers_per_node: int
    max_restarts: int
    monitor_interval_s: float
    local_addr: Optional[str]
    shutdown_timeout_s: float  # from a stop signal to SIGKILL (torch 2.13+; older agents wait their own 30 s)
    master_addr: Optional[str] = None  # the static rendezvous's store (torch takes it from the endpoint)
    master_port: Optional[int] = None
    elastic: Optional[Tuple[int, int]] = None  # (MIN, MAX) nodes of an elastic job: each round's line says what runs
    spares: int = 0  # hot spare nodes beyond MAX (--spares), said in each round's line
    evict_slow_after_s: float = 0.0  # a node whose ranks stay the straggler this long leaves for a spare (0: never)


class AgentRecord:
    """What the agent of this launch did: its restarts (launcher.agent.processes keeps the current workers)."""

    def __init__(self) -> None:
        self.restarts = 0  # restarts after a failure: TORCHELASTIC_RESTART_COUNT
        self.attempt = 0  # the launcher's number of the current attempt (see the module docstring)
        self.nodes: Optional[List[str]] = None  # the last c10d round's nodes (launcher.agent.membership)
        self.restart_store: Any = None  # a static rendezvous restart's workers' store, kept while they run

    def observe(self, round_record: Optional[Dict[str, Any]]) -> None:
        """Say when the job re-formed with other nodes (an elastic job's membership change)."""
        if round_record is None:
            return
        nodes = list(round_record["nodes"])
        if self.nodes is not None and nodes != self.nodes:
            left, joined = sorted(set(self.nodes) - set(nodes)), sorted(set(nodes) - set(self.nodes))
            said = "; ".join(part for part in (f"left: {', '.join(left)}" if left else "",
                                               f"joined: {', '.join(joined)}" if joined else "") if part)
            if left and len(left) == len(joined):  # a hot spare (or a new node) took a lost one's place
                said = "; ".join(f"{gone} replaced by {new}" for gone, new in zip(left, joined))
            log.info(f"membership changed ({said}): {len(nodes)} node{'s' if len(nodes) > 1 else ''}, "
                     f"world size {round_record['world_size']}")
        self.nodes = nodes


def worker_envs(worker_group: Any, restart_count: int) -> Dict[int, Dict[str, str]]:
    """torchrun's environment contract for each worker of this node, by local rank, as torch's own agent gives it
    (LocalElasticAgent._start_workers, the same from torch 2.10 to 2.15; tests/test_torchrun_fidelity.py compares
    what a script sees with torchrun's on each)."""
    spec = worker_group.spec
    shared = {
        "ROLE_NAME": spec.role,
        "LOCAL_WORLD_SIZE": str(spec.local_world_size),
        "GROUP_RANK": str(worker_group.group_rank),
        "GROUP_WORLD_SIZE": str(worker_group.group_world_size),
        "MASTER_ADDR": worker_group.master_addr,
        "MASTER_PORT": str(worker_group.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts),
        "TORCHELASTIC_RUN_ID": spec.rdzv_handler.get_run_id(),
        "TORCHELASTIC_USE_AGENT_STORE": str(spec.rdzv_handler.use_agent_store),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    if "OMP_NUM_THREADS" in os.environ:
        shared["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    return {w.local_rank: {**shared, "RANK": str(w.global_rank), "LOCAL_RANK": str(w.local_rank),
                           "ROLE_RANK": str(w.role_rank), "WORLD_SIZE": str(w.world_size),
                           "ROLE_WORLD_SIZE": str(w.role_world_size)} for w in worker_group.workers}


class AgentHooks:
    """What the agent's hooks do (launcher.runtime.torch_private.elastic_agent_class calls these)."""

    def __init__(self, job: WorkerJob, watch: FailureWatch, record: AgentRecord, logs_specs: Any,
                 elastic: Optional[Tuple[int, int]] = None, spares: int = 0, evict_slow_after_s: float = 0.0) -> None:
        self.job, self.watch, self.record, self.logs_specs, self.elastic = job, watch, record, logs_specs, elastic
        self.spares = spares
        self.eviction = (Eviction(job.run_dir, evict_slow_after_s, torch_private.spares_waiting)
                         if evict_slow_after_s > 0 and spares and job.run_dir else None)
        self.failed = False  # the last look saw a failed attempt: the restart that follows is a failure's
        self.processes: Optional[WorkerProcesses] = None  # the current attempt's
        self.round_restarts = 0  # the restart count the last round started with

    def start_workers(self, agent: Any, worker_group: Any) -> WorkerProcesses:
        envs = worker_envs(worker_group, self.record.restarts)
        torch_private.start_worker_services(agent, envs)
        for worker_env in envs.values():  # read by the logs' names (RunDirLogsSpecs) and the workers
            worker_env[env.ATTEMPT] = str(self.record.attempt)
        spec = worker_group.spec
        processes = WorkerProcesses(spec.role, spec.entrypoint, {lr: () for lr in envs}, envs, self.logs_specs, None,
                                    self.job)
        processes.start()
        self.processes = processes
        return processes

    def after_rendezvous(self, worker_group: Any) -> None:
        handler = worker_group.spec.rdzv_handler
        timeout = getattr(getattr(handler, "settings", None), "timeout", None)  # c10d's (static has none)
        if isinstance(timeout, ReformingTimeout):
            timeout.formed()
        seen = torch_private.rendezvous_round(handler)
        if self.eviction is not None and seen is not None:
            self.eviction.round_started(worker_group, seen["round"])
        before = self.record.nodes
        if self.job.run_dir:
            self.record.observe(record_round(self.job.run_dir, worker_group, seen))
        if seen is not None and self.elastic is not None and worker_group.group_rank == 0:  # one line a round
            world = worker_group.workers[0].world_size if worker_group.workers else 0
            log.info(round_line(seen["round"], seen["nodes"], world, *self.elastic, spares=self.spares))
        if seen is not None and self.elastic is not None:
            if before and set(before) - set(seen["nodes"]) and self.record.restarts == self.round_restarts:
                self.record.restarts += 1  # a lost node's restart, which torch counts only where the workers' failure
                # came before the nodes waiting to join (a hot spare): once, whichever this agent saw first
            self.record.restarts = job_restarts(worker_group, seen["round"], self.record.restarts)
            self.round_restarts = self.record.restarts
        restart = self.record.restarts
        self.record.attempt = restart if seen is None else seen["round"]
        if restart and handler.get_backend() == "static":
            timeout_s = handler.timeout.total_seconds()
            self.record.restart_store = elastic_fixes.restart_workers_store(worker_group, restart, timeout_s)

    def monitored(self, worker_group: Any, result: Any) -> None:
        self.failed = result.is_failed()
        if self.eviction is not None and not self.failed:
            self.eviction.look(worker_group.spec.rdzv_handler)  # raises Evicted: torch's run() stops the workers
        if self.failed:
            left = worker_group.spec.max_restarts - self.record.restarts
            times = self.processes.failure_times() if self.processes is not None else {}
            left = 0 if Restarts.stopped else left
            self.watch.on_failure(result.failures, worker_group, self.record.attempt, left,
                                  resumes=self.job.kind == "trainer", times=times)
            if Restarts.stopped:  # out of torch's loop before it restarts them (launcher.backends.local: preempted)
                raise ChildFailedError(name=ENTRYPOINT, failures=result.failures)

    def restarting(self, worker_group: Any) -> None:
        if self.failed:  # torch restarts after a failure while restarts are left, and for nodes waiting to join
            self.record.restarts += 1
            self.failed = False


def run_agent(settings: AgentSettings, rdzv_handler: Any, job: WorkerJob, watch: FailureWatch,
              record: AgentRecord, logs_specs: Any) -> Dict[int, Any]:
    """This node's agent, run to the end, as torch's launch_agent runs it: {local_rank: result}; ChildFailedError
    where the workers failed with no restart left."""
    signals = next((f.default for f in dataclasses.fields(LaunchConfig) if f.name == "signals_to_handle"), None)
    if isinstance(signals, str):  # as launch_agent: the signals torch's process contexts take as a stop (workers see it)
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = signals
    spec = _accepted(WorkerSpec, role=settings.role, local_world_size=settings.workers_per_node,
                     entrypoint=launcher_worker, args=(), rdzv_handler=rdzv_handler,
                     max_restarts=settings.max_restarts, monitor_interval=settings.monitor_interval_s,
                     master_addr=settings.master_addr, master_port=settings.master_port, local_addr=settings.local_addr)
    agent_class = torch_private.elastic_agent_class(AgentHooks(job, watch, record, logs_specs, settings.elastic,
                                                                      settings.spares, settings.evict_slow_after_s))
    agent = _accepted(agent_class, spec=spec, logs_specs=logs_specs, start_method="spawn",  # unused: our processes
                      shutdown_timeout=int(settings.shutdown_timeout_s))
    shutdown_rdzv = True
    try:
        result = agent.run()
        if result is None:  # torch's RendezvousGracefulExitError: a hot spare the job ended without needing
            return {}
        if result.is_failed():
            raise ChildFailedError(name=ENTRYPOINT, failures=result.failures)
        return result.return_values
    except SignalException:  # as torch's: a rendezvous shut down by a signal would be closed for the other nodes
        shutdown_rdzv = False
        raise
    except Evicted as e:  # its workers are stopped; the round stays open for the others and the spare
        shutdown_rdzv = False
        try:
            torch_private.leave_rendezvous(rdzv_handler)
        except Exception as left:  # noqa: BLE001  (a store gone: its keep-alives lapse, and the others drop it)
            log.debug(f"leaving the round failed: {left!r}")
        log.warning(f"this node leaves the job: {e}; its place goes to the spare")
        return {}
    finally:
        if shutdown_rdzv:
            rdzv_handler.shutdown()


def _accepted(make: Any, **fields: Any) -> Any:
    """make(**fields) without the fields this torch's make (a dataclass or a class) does not take (an older torch:
    no shutdown_timeout before 2.13)."""
    if dataclasses.is_dataclass(make):
        known = {f.name for f in dataclasses.fields(make)}
    else:
        known = set(inspect.signature(make).parameters)
    return make(**{k: v for k, v in fields.items() if k in known})
