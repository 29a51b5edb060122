"""The driver of a Ray job: place the bundles, start a node agent in each, watch them, re-place on a lost node.

Runs in the launcher's own process with --wait, else in a detached `python -m launcher.backends.ray.job RUN_DIR`
(the submission's supervisor, which `cancel` signals). Either way it owns the job's Ray objects and removes
them before it ends: a job leaves no actor and no placement group behind.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from launcher.backends.children import workers_kind
from launcher.backends.ray import cluster, code
from launcher.backends.ray.actor import remote_class
from launcher.backends.ray.options import ray_section
from launcher.backends.ray.records import JOB_FILE, update_job
from launcher.config.rdzv_secret import read_rdzv_secret
from launcher.config.schema import Config, from_dict, to_dict
from launcher.errors import ConfigError
from launcher.rundir import first_failed_node, read_json, read_node_record, write_json
from launcher.runtime import env
from launcher.runtime.schema import Status

log = logging.getLogger("launcher")
STOP_GRACE_S = 25.0  # a stopped node agent stops its workers (checkpoint grace included) and records the end


@dataclass
class Attempt:
    codes: Dict[int, Optional[int]]  # node rank -> the node agent's exit code; None: its actor died
    dead: List[int]  # node ranks whose Ray node died
    interrupted: bool = False
    first_failed: Optional[int] = None  # the node rank whose agent failed first (the driver then stopped the others)


class RayJob:
    """One job on one Ray cluster; attempts: 1 + the re-placements after lost nodes (launcher.max_restarts)."""

    def __init__(self, cfg: Config, run_dir: Path, secret: str) -> None:
        self.cfg, self.run_dir, self.secret = cfg, run_dir, secret
        self.ray: Any = None
        self.group: Any = None
        self.actors: List[Any] = []
        self.stop_signal: Optional[int] = None

    def run(self) -> int:
        # the driver runs in the submitting folder (--wait: this process; else the detached driver, started there)
        self.ray = cluster.connect(cluster.cluster_address(self.cfg), runtime_env(self.cfg, os.environ))
        # after ray.init, which sets its own SIGTERM handler (sys.exit): Ctrl-C, and SIGTERM from `cancel`,
        # are passed on to the node agents, which stop their workers and record the end
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda got, _frame: setattr(self, "stop_signal", got))
        try:
            gpus = cluster.gpus_to_request(self.cfg, self.ray)
            bundles = [cluster.bundle(self.cfg, gpus)] * self.cfg.nodes
            attempt, lost = 0, []
            while True:
                name = f"launcher-{self.cfg.run_id}-{attempt}"
                self.group = cluster.place(self.ray, self.cfg, name, bundles)
                placement = cluster.where(self.ray, self.group, name)
                update_job(self.run_dir, {"state": "RUNNING", "attempt": attempt, **placement.to_dict(),
                                          "driver_ray_node_id": self.ray.get_runtime_context().get_node_id()})
                log.info(f"Ray placement group {name}: " + ", ".join(
                    f"node {k} on {ip}" for k, ip in enumerate(placement.ips)))
                outcome = self.attempt(placement, attempt)
                self.release()
                if outcome.dead:
                    lost.append(describe_loss(self.cfg, placement, outcome.dead))
                    log.error(lost[-1])
                if outcome.dead and not outcome.interrupted and attempt < self.cfg.launcher.max_restarts:
                    attempt += 1
                    log.info(f"re-placing the job (attempt {attempt} of {self.cfg.launcher.max_restarts}): "
                             "it resumes from its newest checkpoint")
                    continue
                return self.conclude(outcome, attempt, lost, placement)
        finally:
            self.release()
            self.ray.shutdown()

    def attempt(self, placement: cluster.Placement, attempt: int) -> Attempt:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        runner = remote_class(self.ray)
        self.actors = [runner.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=k),
            name=f"{placement.group_name}-node-{k}",  # named: `ray list actors` and tests see whose it is
            ).remote() for k in range(self.cfg.nodes)]
        master_addr, master_port = self.ray.get(self.actors[0].address.remote(), timeout=ray_section(self.cfg).placement_timeout_s + 60)
        config, workers = to_dict(self.cfg), workers_kind(self.cfg)
        refs = [a.run.remote({"config": config, "node_rank": k, "master_addr": master_addr, "master_port": master_port,
                              "attempt": attempt, "workers": workers}, self.secret,
                             str(self.run_dir / "logs" / f"ray-node-{k}.log"),
                             "" if ray_section(self.cfg).ship_code else os.getcwd())  # "": the shipped folder Ray started it in
                for k, a in enumerate(self.actors)]
        return self.watch(refs, placement)

    def watch(self, refs: List[Any], placement: cluster.Placement) -> Attempt:
        """Wait for every node agent; a node whose actor died, or whose Ray node is gone, is a lost node."""
        from ray.exceptions import RayActorError

        codes: Dict[int, Optional[int]] = {}
        pending, first_end, interrupted, first_failed = list(refs), None, False, None
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=len(pending), timeout=1.0)
            for ref in ready:
                k = refs.index(ref)
                try:
                    codes[k] = int(self.ray.get(ref))
                except RayActorError:
                    codes[k] = None
            if self.stop_signal is not None and not interrupted:
                interrupted = True
                self.stop_agents(self.stop_signal)
            if first_end is None and any(c != 0 for c in codes.values()):
                first_end = time.monotonic()
                first_failed = min(k for k, c in codes.items() if c != 0)
                if pending:  # the others may be losing a dead peer: stop them so they end now
                    self.stop_agents(signal.SIGTERM)
            if first_end is not None and pending and time.monotonic() - first_end > ray_section(self.cfg).node_death_s:
                break
        gone = cluster.dead_nodes(self.ray, placement.node_ids)
        dead = sorted({k for k, c in codes.items() if c is None} | {k for k, i in enumerate(placement.node_ids) if i in gone})
        return Attempt(codes, dead, interrupted, first_failed)

    def stop_agents(self, signum: int) -> None:
        for actor in self.actors:
            try:
                actor.stop.remote(int(signum))
            except Exception:  # its node is gone: its agent went with it
                pass

    def release(self) -> None:
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # dead already
                pass
        self.actors = []
        cluster.remove(self.ray, self.group)
        self.group = None

    def conclude(self, outcome: Attempt, attempt: int, lost: List[str], placement: cluster.Placement) -> int:
        """summary.json names the Ray job; a lost node's verdict replaces the survivors' (a peer gone is a symptom)."""
        path = self.run_dir / "summary.json"
        summary = read_json(path) if path.is_file() else fallback_summary(self.run_dir)
        summary["cluster"] = "ray"
        summary["ray_placement"] = placement.to_dict()["placement"]
        summary["ray_replacements"] = attempt
        summary["restarts"] = int(summary.get("restarts") or 0) + attempt
        if lost:
            summary["lost_nodes"] = lost
        if outcome.dead:
            summary["status"], summary["error"] = Status.FAILED, lost[-1]
        elif outcome.interrupted and summary.get("status") != Status.COMPLETED:  # the workers' own Ctrl-C is no failure
            summary["status"] = Status.INTERRUPTED
            summary.pop("error", None)
        elif summary.get("status") == Status.INTERRUPTED and outcome.first_failed is not None:
            first = first_failed_node(self.run_dir, self.cfg.nodes)  # whose rank failed first, not whose agent exited
            node = outcome.first_failed if first is None else first
            failed_first(summary, self.run_dir, node, outcome.codes.get(node))
        write_json(path, summary)
        states: Dict[Optional[str], str] = {Status.COMPLETED: "COMPLETED", Status.INTERRUPTED: "CANCELLED"}
        state = states.get(summary.get("status"), "FAILED")
        update_job(self.run_dir, {"state": state})
        return {"COMPLETED": 0, "CANCELLED": 130}[state] if state != "FAILED" else 1


def failed_first(summary: Dict[str, Any], run_dir: Path, node: int, code: Optional[int]) -> None:
    """The verdict of a job one of whose nodes failed: node 0, stopped by the driver (watch) before it saw its own ranks
    fail, wrote "interrupted"; the job failed, as the node that failed first says (its rank and error, as a simulated
    job's supervisor names them)."""
    record = read_node_record(run_dir, node)
    summary["status"] = Status.FAILED
    summary["error"] = record.get("error") or f"node {node} failed (its node agent's exit code {code})"
    if "root_cause" in record and "root_cause" not in summary:
        summary["root_cause"] = record["root_cause"]


def runtime_env(cfg: Config, environ: Mapping[str, str]) -> Optional[Dict[str, Any]]:
    """The job's Ray runtime_env, which every actor of the job starts in: the shipped code (launcher.backends.ray.code)
    and, as env_vars, the launcher's test hooks set here (forwarded_env)."""
    found: Dict[str, Any] = dict(code.runtime_env(cfg, code.working_folder()) or {})
    hooks = forwarded_env(environ)
    if hooks:
        found["env_vars"] = hooks
    return found or None


def forwarded_env(environ: Mapping[str, str]) -> Dict[str, str]:
    """What of the submitting environment the node agents get: the built-in trainer's test hooks only.

    Ray starts an actor with its raylet's environment, not the driver's, so a hook would not reach the nodes as it
    reaches a local run's workers or a SLURM job's tasks (sbatch --export=ALL). Nothing else travels: a runtime_env
    is readable by whoever can list the cluster's jobs, so the rendezvous secret goes as an actor argument and a
    user's own variables (tokens among them) stay with the cluster's own setup (docs/ray.md)."""
    return {name: environ[name] for name in env.TEST_HOOKS if environ.get(name)}


def describe_loss(cfg: Config, placement: cluster.Placement, dead: List[int]) -> str:
    parts = []
    for k in dead:
        ranks = list(range(k * cfg.gpus, (k + 1) * cfg.gpus))
        parts.append(f"Ray node {placement.ips[k]} (node {k}, Ray node id {placement.node_ids[k][:12]}, "
                     f"ranks {', '.join(map(str, ranks))}) died")
    return "; ".join(parts) + ": its node agent and workers went with it"


def fallback_summary(run_dir: Path) -> Dict[str, Any]:
    """What the driver knows of a job none of whose node agents wrote a summary."""
    plan = read_json(run_dir / "plan.json") if (run_dir / "plan.json").is_file() else {}
    started = os.path.getmtime(run_dir / JOB_FILE) if (run_dir / JOB_FILE).is_file() else time.time()
    return {"run_id": run_dir.name, "world_size": plan.get("world_size"), "nodes": plan.get("nodes"),
            "gpus_per_node": plan.get("workers_per_node"), "status": Status.FAILED, "wall_s": time.time() - started,
            "restarts": 0}


def job_secret(cfg: Config) -> str:
    """The user's secret (--rdzv-secret-file, LAUNCHER_RDZV_SECRET), else a fresh one for this job only."""
    key = read_rdzv_secret(cfg.rdzv.secret_file, os.environ, warn=True)
    return key.decode() if key is not None else secrets.token_hex(32)


def main(argv: List[str]) -> int:
    """The detached supervisor: `python -m launcher.backends.ray.job RUN_DIR`, the config as JSON on stdin."""
    from launcher.logs import setup_launcher_logging

    run_dir = Path(argv[0])
    cfg = from_dict(json.loads(sys.stdin.read()))
    setup_launcher_logging(run_dir / "logs" / "ray-driver.log")
    job = RayJob(cfg, run_dir, job_secret(cfg))
    try:
        return job.run()
    except ConfigError as e:
        log.error(f"error: {e}")
        update_job(run_dir, {"state": "FAILED", "error": str(e)})
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
