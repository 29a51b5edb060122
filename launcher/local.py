"""Executes a launch plan on this machine: torch's elastic agent starts and watches the workers.

This is the one module that starts worker processes for local runs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from launcher import elastic_fixes
from launcher.errors import RendezvousError, WorkerFailedError
from launcher.failures import FailureWatch, failure_reason, rank_log, root_cause
from launcher.logs import CONSOLE_PREFIX, RunDirLogsSpecs
from launcher.multinode import rdzv_configs
from launcher.plan import LaunchPlan
from launcher.watchdog import run_watched
from launcher.warmstart import Preload
from launcher.worker import WorkerSpec, run_worker

log = logging.getLogger("launcher")


def run_node(plan: LaunchPlan, config: Dict[str, Any],
             logs_specs: Optional[RunDirLogsSpecs] = None) -> Tuple[Dict[int, Any], int]:
    """Run this node's agent to completion; returns ({local_rank: result}, restarts).

    logs_specs: pass one to read back where this node's ranks ran (its ``placement``) afterwards.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError as TorchRendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    elastic_fixes.apply()
    os.environ.update(plan.agent_env)
    os.environ.update(plan.worker_env)  # workers inherit the agent's environment
    if plan.start_method == "fork":
        Preload.start()  # usually started already, right after the plan (launcher.run.launch)
    logs_specs = logs_specs or RunDirLogsSpecs(Path(plan.run_dir) / "logs")
    logs_specs.before_workers = Preload.wait  # no fork while the preload thread imports
    launch_config = elastic_fixes.launch_config(
        LaunchConfig,
        min_nodes=plan.nodes,
        max_nodes=plan.nodes,
        nproc_per_node=plan.workers_per_node,
        run_id=plan.rdzv_id,
        rdzv_backend=plan.rdzv_backend,
        rdzv_endpoint=plan.rdzv_endpoint,
        rdzv_configs=rdzv_configs(plan),
        max_restarts=plan.max_restarts,
        monitor_interval=0.1,
        start_method=plan.start_method,
        logs_specs=logs_specs,
        log_line_prefix_template=CONSOLE_PREFIX,
        shutdown_timeout=plan.shutdown_timeout_s,
    )
    spec = WorkerSpec(config=config, run_dir=plan.run_dir)
    watch = FailureWatch(plan)
    try:
        with watch.installed():
            results = run_watched(plan.run_dir, config, lambda: elastic_launch(launch_config, run_worker)(spec))
    except ChildFailedError as e:
        raise WorkerFailedError(describe_failure(e, plan, watch.last)) from e
    except TorchRendezvousError as e:
        raise RendezvousError(
            f"nodes did not meet at {plan.rdzv_endpoint} within {plan.rdzv_timeout_s}s ({e.__class__.__name__}): "
            "check the address, the port, the firewall and the other nodes' commands"
        ) from e
    restarts = max((r or {}).get("restart_count", 0) for r in results.values()) if results else 0
    return results, restarts


def describe_failure(error: Any, plan: LaunchPlan, failures: Optional[Dict[int, Any]] = None) -> str:
    """'rank 1 failed (exit code 1): ValueError: boom; see <run_dir>/logs/rank-1.log' for the first failure."""
    failures = failures or error.failures
    rank, failure = root_cause(failures)
    reason = _failure_reason(failure)
    others = sorted(r for r in failures if r != rank)
    also = f" (ranks {', '.join(map(str, others))} failed too)" if others else ""
    log_file = rank_log(plan, rank, plan.max_restarts)  # the last attempt's log
    return f"rank {rank} failed: {reason}{also}; see {log_file}"


_failure_reason = failure_reason  # the name used before launcher.failures existed


def first_result(results: Dict[int, Any]) -> Optional[Dict[str, Any]]:
    """Rank 0's result where this node ran it."""
    for result in results.values():
        if isinstance(result, dict) and result.get("rank") == 0:
            return result
    return None
