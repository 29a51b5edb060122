"""Executes a launch plan on this machine: torch's elastic agent starts and watches the workers.

This is the one module that starts worker processes for local runs.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

# At the top, not in run_node: imported while the launcher holds Ctrl-C (launcher.interrupts), since one
# landing inside an import escapes as a traceback.
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousError as TorchRendezvousError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from launcher.agent import elastic_fixes, signed_rdzv
from launcher.agent.elastic import agent_installed, launcher_worker
from launcher.errors import RendezvousAuthError, RendezvousError, WorkerFailedError
from launcher.agent.failures import FailureWatch, failure_reason, rank_log, root_cause, root_cause_record
from launcher.agent.logs_specs import RunDirLogsSpecs
from launcher.config.rendezvous import rdzv_configs
from launcher.plan import LaunchPlan
from launcher.agent.processes import WorkerJob
from launcher.agent.stores import listening_store
from launcher.agent.watchdog import Peers, run_watched
from launcher.runtime import env
from launcher.trainers.faults.diskspace import free_space, nearly_full
from launcher.trainers.metrics.goodput import launch_key

log = logging.getLogger("launcher")
AGENT_ONLY_ENV = (env.START_TIME,)  # the launcher's own bookkeeping; a script never sees it
NEVER_TO_WORKERS = (env.RDZV_SECRET,)  # the agents' alone: a worker's environment gets copied into logs and trackers


def run_node(plan: LaunchPlan, config: Dict[str, Any], logs_specs: Optional[RunDirLogsSpecs] = None,
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
    agent_env = {**plan.agent_env, **elastic_fixes.apply(plan.nodes)}
    os.environ.update(agent_env)
    job = worker_job(plan, config, tuple(agent_env))
    rdzv_endpoint, rdzv_store, own_secret = plan.rdzv_endpoint, None, False
    if plan.mode == "single":
        # torch's c10d rendezvous would start its store on every interface; hosted here first, on
        # loopback, it finds this one (multi-tenant, same port) and starts none; held until we return
        rdzv_store = listening_store("127.0.0.1", 0, plan.rdzv_timeout_s)
        rdzv_endpoint, local_addr = f"127.0.0.1:{rdzv_store.port}", "127.0.0.1"
        own_secret = rdzv_key is None
        rdzv_key = rdzv_key or secrets.token_bytes(32)  # loopback is reachable by every local user
    rdzv_backend, rdzv_extra = plan.rdzv_backend, {}
    if rdzv_key and plan.rdzv_backend == "c10d":  # the static rendezvous keeps no state to unpickle
        rdzv_backend, rdzv_extra = signed_rdzv.signed_c10d(rdzv_key, own_secret)
    logs_specs = logs_specs or RunDirLogsSpecs(Path(plan.run_dir) / "logs")
    launch_config = elastic_fixes.launch_config(
        LaunchConfig,
        min_nodes=plan.min_nodes or plan.nodes,  # elastic: torch's agent re-forms the job without a lost node
        max_nodes=plan.nodes,
        nproc_per_node=plan.workers_per_node,
        run_id=plan.rdzv_id,
        role=config["launcher"].get("role", "default"),  # torchrun's --role: workers see ROLE_NAME
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_configs={**rdzv_configs(plan), **rdzv_extra},
        local_addr=local_addr,
        max_restarts=plan.max_restarts,
        monitor_interval=float(config["launcher"].get("monitor_interval_s", 0.1)),
        start_method="spawn",  # unused: launcher.agent.processes starts the workers
        logs_specs=logs_specs,
        shutdown_timeout=plan.shutdown_timeout_s,
    )
    watch = FailureWatch(plan)
    try:
        with agent_installed(job, watch) as agent:
            results = run_watched(plan.run_dir, config, lambda: elastic_launch(launch_config, launcher_worker)(),
                                  announce=(plan.node_rank or 0) == 0, peers=peers)
    except ChildFailedError as e:
        raise WorkerFailedError(describe_failure(e, plan, watch.last, agent.attempt), restarts=agent.restarts,
                                root_cause=root_cause_record(plan, watch.last or e.failures, agent.attempt)) from e
    except signed_rdzv.UnsignedStateError as e:
        raise RendezvousAuthError(str(e)) from None
    except TorchRendezvousError as e:
        raise RendezvousError(
            f"nodes did not meet at {rdzv_endpoint} within {plan.rdzv_timeout_s}s ({e.__class__.__name__}): "
            "check the address, the port, the firewall and the other nodes' commands"
        ) from e
    return results, agent.restarts


def worker_job(plan: LaunchPlan, config: Dict[str, Any], agent_env: Tuple[str, ...] = ()) -> WorkerJob:
    """What this node's workers run, and in what environment (agent_env: the agent's own variables, left out)."""
    script = config["script"]
    kind = "trainer" if script["path"] is None else ("module" if script["module"] else "script")
    dropped = agent_env + NEVER_TO_WORKERS + (AGENT_ONLY_ENV if kind != "trainer" else ())  # the trainer times its first step
    watchdog_s = float(config.get("watchdog", {}).get("timeout_s", 0))
    return WorkerJob(kind=kind, target=script["path"], args=tuple(script["args"]), run_dir=plan.run_dir,
                     added_env=dict(plan.worker_env), dropped_env=dropped, start_method=plan.start_method,
                     exit_timeout_s=float(config["launcher"]["exit_timeout_s"]), heartbeat=watchdog_s > 0,
                     config=config if kind == "trainer" else {}, slurm="SLURM_JOB_ID" in os.environ,
                     steps=script_steps(config) if kind != "trainer" else None,
                     redirects=str(config["launcher"].get("redirects", "0")),
                     ranks_filter=tuple(config["launcher"].get("local_ranks_filter", ())))


def script_steps(config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What a script's workers record of their steps (metrics.scripts): this launch's key for the goodput records
    (launcher.trainers.metrics.goodput), and whether rank 0 adds the launcher's figures to a W&B run the script starts."""
    if not config.get("metrics", {}).get("scripts", True):
        return None
    started = os.environ.get(env.START_TIME)
    return {"launch": launch_key(float(started)) if started else None,
            "wandb": config.get("wandb", {}).get("mode", "offline") != "disabled"}


def describe_failure(error: Any, plan: LaunchPlan, failures: Optional[Dict[int, Any]], attempt: int) -> str:
    """'rank 1 failed: exit code 1: ValueError: boom; see <run_dir>/logs/rank-1.log' for the first failure.

    Only ranks that failed on their own are named: launcher.agent.processes leaves out the ranks it
    stopped and those that had finished.
    """
    failures = failures or error.failures
    rank, failure = root_cause(failures)
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
