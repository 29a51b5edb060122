"""Executes a launch plan on this machine: torch's elastic agent starts and watches the workers.

This is the one module that starts worker processes for local runs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

# At the top, not in run_node: imported while the launcher holds Ctrl-C (launcher.interrupts), since one
# landing inside an import escapes as a traceback.
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousError as TorchRendezvousError
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from launcher.agent import signed_rdzv
from launcher.agent.elastic import AgentRecord, AgentSettings, run_agent
from launcher.agent.rendezvous import rendezvous_handler
from launcher.agent.spec import AgentSpec
from launcher.errors import RendezvousAuthError, RendezvousError, WorkerFailedError
from launcher.agent.failures import FailureWatch, failure_reason, rank_log, root_cause, root_cause_record
from launcher.agent.logs_specs import RunDirLogsSpecs
from launcher.config.rendezvous import rdzv_configs
from launcher.plan import LaunchPlan
from launcher.agent.processes import WorkerJob
from launcher.agent.stores import listening_store
from launcher.agent.watchdog import Peers, run_watched
from launcher.runtime import env
from launcher.runtime.diskspace import free_space, nearly_full
from launcher.runtime.goodput import launch_key

log = logging.getLogger("launcher")
AGENT_ONLY_ENV = (env.START_TIME,)  # the launcher's own bookkeeping; a script never sees it
NEVER_TO_WORKERS = (env.RDZV_SECRET, env.RELEASE)  # the agents' alone: a worker's environment gets copied into logs and trackers
# Set in this process by the launcher's own W&B run starting its service (wandb's service token): a restarted
# script's wandb.init then joined the launcher's service, where under torchrun it starts its own. Kept where the
# user's environment brought one (a service they run for their ranks).
WANDB_SERVICE = "WANDB_SERVICE"


def run_node(plan: LaunchPlan, spec: AgentSpec, logs_specs: Optional[RunDirLogsSpecs] = None,
             local_addr: Optional[str] = None, rdzv_key: Optional[bytes] = None,
             peers: Optional[Peers] = None) -> Tuple[Dict[int, Any], int]:
    """Run this node's agent to completion; returns ({local_rank: result}, restarts).

    logs_specs: pass one to read back where this node's ranks ran (its ``placement``) afterwards.
    local_addr: this node's address towards the other nodes: the workers' store listens there.
    rdzv_key: the job's rendezvous secret; torch's c10d rendezvous state is then signed with it, and a
    state read that is not is refused before it is unpickled (launcher.agent.signed_rdzv). A run on one
    machine makes its own.
    peers: the other nodes, for the watchdog (a hang or a stuck start whose cause is on another node).
    """
    agent_env = dict(plan.agent_env)
    os.environ.update(agent_env)
    job = worker_job(plan, spec, tuple(agent_env))
    rdzv_endpoint, rdzv_store = plan.rdzv_endpoint, None
    own_secret = plan.mode == "simulated"  # the launcher made the nodes' secret: only a local stranger can forge
    if plan.mode == "single":
        # torch's static rendezvous would start its store on every interface; hosted here first, on
        # loopback, it finds this one (multi-tenant, same port) and starts none; held until we return
        rdzv_store = listening_store("127.0.0.1", 0, plan.rdzv_timeout_s)
        rdzv_endpoint, local_addr = f"127.0.0.1:{rdzv_store.port}", "127.0.0.1"
    logs_specs = logs_specs or RunDirLogsSpecs(Path(plan.run_dir) / "logs")
    master_addr, master_port = (parse_rendezvous_endpoint(rdzv_endpoint, default_port=-1)
                                if plan.rdzv_backend == "static" else (None, None))
    settings = AgentSettings(role=spec.role, workers_per_node=plan.workers_per_node, max_restarts=plan.max_restarts,
                             monitor_interval_s=spec.monitor_interval_s, local_addr=local_addr, shutdown_timeout_s=plan.shutdown_timeout_s,
                             master_addr=master_addr, master_port=master_port,
                             elastic=(plan.min_nodes or plan.nodes, plan.nodes) if plan.elastic else None,
                             spares=plan.spares, evict_slow_after_s=plan.evict_slow_after_s)
    watch, agent = FailureWatch(plan), AgentRecord()

    def agent_runs() -> Dict[int, Any]:  # as torch's launch_agent: the rendezvous's store is reached under the watchdog
        # elastic: min_nodes below max_nodes, and torch's agent re-forms the job without a lost node
        handler = rendezvous_handler(plan.rdzv_backend, rdzv_endpoint, plan.rdzv_id, plan.min_nodes or plan.nodes,
                                     plan.nodes, local_addr, rdzv_configs(plan), key=rdzv_key, own_secret=own_secret)
        return run_agent(settings, handler, job, watch, agent, logs_specs)

    try:
        results = run_watched(plan.run_dir, spec, agent_runs, announce=(plan.node_rank or 0) == 0, peers=peers)
    except ChildFailedError as e:
        raise WorkerFailedError(describe_failure(e, plan, watch.last, agent.attempt, watch.times),
                                restarts=agent.restarts,
                                root_cause=root_cause_record(plan, watch.last or e.failures, agent.attempt,
                                                             watch.times)) from e
    except signed_rdzv.UnsignedStateError as e:
        raise RendezvousAuthError(str(e)) from None
    except TorchRendezvousError as e:
        raise RendezvousError(
            f"nodes did not meet at {rdzv_endpoint} within {plan.rdzv_timeout_s}s ({e.__class__.__name__}): "
            "check the address, the port, the firewall and the other nodes' commands"
        ) from e
    return results, agent.restarts


def worker_job(plan: LaunchPlan, spec: AgentSpec, agent_env: Tuple[str, ...] = ()) -> WorkerJob:
    """What this node's workers run, and in what environment (agent_env: the agent's own variables, left out)."""
    dropped = agent_env + NEVER_TO_WORKERS + (AGENT_ONLY_ENV if spec.kind != "trainer" else ())  # the trainer times its first step
    if WANDB_SERVICE not in os.environ:  # none of the user's: one set from here on is the launcher's own W&B run's
        dropped += (WANDB_SERVICE,)
    return WorkerJob(kind=spec.kind, target=spec.target, args=spec.args, run_dir=plan.run_dir,
                     added_env=dict(plan.worker_env), dropped_env=dropped, start_method=plan.start_method,
                     exit_timeout_s=spec.exit_timeout_s, heartbeat=spec.watchdog_timeout_s > 0,
                     config=spec.trainer_config, ignored_signals=spec.ignored_signals,
                     steps=script_steps(spec) if spec.kind != "trainer" else None,
                     redirects=spec.redirects, ranks_filter=spec.local_ranks_filter)


def script_steps(spec: AgentSpec) -> Optional[Dict[str, Any]]:
    """What a script's workers record of their steps (metrics.scripts): this launch's key for the goodput records
    (launcher.runtime.goodput), and whether rank 0 adds the launcher's figures to a W&B run the script starts."""
    if not spec.script_metrics:
        return None
    started = os.environ.get(env.START_TIME)
    return {"launch": launch_key(float(started)) if started else None, "wandb": spec.wandb}


def describe_failure(error: Any, plan: LaunchPlan, failures: Optional[Dict[int, Any]], attempt: int,
                     times: Optional[Dict[int, float]] = None) -> str:
    """'rank 1 failed: exit code 1: ValueError: boom; see <run_dir>/logs/rank-1.log' for the first failure.

    Only ranks that failed on their own are named: launcher.agent.processes leaves out the ranks it
    stopped and those that had finished.
    """
    failures = failures or error.failures
    rank, failure = root_cause(failures, times)
    others = sorted(r for r in failures if r != rank)
    also = f" (rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} failed too)" if others else ""
    reason = failure_reason(failure)
    if ":" not in reason and nearly_full(Path(plan.run_dir)):  # no error recorded: its error file may not fit either
        reason += f" (the run directory's disk is full: {free_space(Path(plan.run_dir))} free)"
    return f"rank {rank} failed: {reason}{also}; see {rank_log(plan, rank, attempt)}"


def first_result(results: Dict[int, Any]) -> Optional[Dict[str, Any]]:
    """Rank 0's result where this node ran it."""
    for result in results.values():
        if isinstance(result, dict) and result.get("rank") == 0:
            return result
    return None
