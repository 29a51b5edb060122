"""One node of a multi-node job: handshake, this node's elastic agent, then who writes summary.json.

`python -m launcher.backends.node RUN_DIR K PARENT_PID` is how launcher.backends.simulated starts node K of a simulated
job (its plan and config arrive as JSON on stdin, so nothing unredacted lands in the run directory).
On real machines the same NodeSession runs inside `python -m launcher --node-rank K ...`.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from launcher.agent.failures import first_cause
from launcher.agent.launch import first_result, run_node
from launcher.agent.spec import AgentSpec
from launcher.agent.watchdog import nodes_verdict
from launcher.agent.logs_specs import RunDirLogsSpecs
from launcher.agent.zygote import Zygote, die_with_parent
from launcher.backends import local, mirror
from launcher.backends.addresses import choose_interface
from launcher.backends.handshake import NodeHandshake, describe_nodes
from launcher.backends.peer_flags import PeerFlags
from launcher.config.rdzv_secret import read_rdzv_secret
from launcher.config.schema import Config, from_dict
from launcher.errors import LauncherError
from launcher.logs import setup_launcher_logging
from launcher.plan import LaunchPlan
from launcher.rundir import build_summary, finish, write_json
from launcher.runtime import env
from launcher.runtime.schema import NODES_DIR, ROOT_CAUSE, Status

log = logging.getLogger("launcher")
HANG_PEERS_S = 30.0  # after a hang here, how long the head waits for the other nodes' watchdogs to say theirs
OTHERS_END_S = 5.0  # after another failure, how long it waits for the others to say how they ended


class NodeSession:
    """This machine's part of a multi-node job; plugs into launcher.backends.local.run_and_summarize."""

    def __init__(self, plan: LaunchPlan, own_key: Optional[bytes] = None) -> None:
        """own_key: the secret the launcher made for the nodes of a simulated job (all on this machine)."""
        self.plan = plan
        self.key = own_key or rdzv_key(plan)
        self.handshake = NodeHandshake(plan, plan.node_rank, self.key, own_secret=own_key is not None)
        self.logs = RunDirLogsSpecs(Path(plan.run_dir) / "logs", on_placement=self.handshake.publish_placement)
        self.node_list: List[Dict[str, Any]] = []
        self.met = False
        self.mirror: Any = None  # the other nodes' files copied to the head's run directory (launcher.backends.mirror)
        self.mirrored: Optional[bool] = None  # once the mirror closed: whether the head has all of this node's files

    def meet(self) -> None:
        """Meet the other nodes, or raise naming the problem (settings that differ, a --node-rank used twice)."""
        if not self.met:
            self.handshake.connect()
            self.handshake.meet(self.plan.nodes, self.plan.workers_per_node, self.plan.min_nodes, self.plan.spares)
            self.met = True
            plan, spares = self.plan, self.plan.spares
            hot = f" and {spares} hot spare{'s' if spares > 1 else ''}" if spares else ""
            if plan.min_nodes is not None and plan.min_nodes < plan.nodes:
                log.info(f"checked in at {plan.rdzv_endpoint}: elastic job of {plan.min_nodes} to {plan.nodes} "
                         f"nodes{hot} (c10d rendezvous)")
            elif spares:
                log.info(f"checked in at {plan.rdzv_endpoint}: job of {plan.nodes} nodes{hot} (c10d rendezvous)")
            else:
                log.info(f"all {self.plan.nodes} nodes checked in at {self.plan.rdzv_endpoint} ({self.plan.rdzv_backend} rendezvous)")

    def run(self, plan: LaunchPlan, spec: AgentSpec) -> Tuple[Dict[int, Any], int]:
        self.meet()
        local_addr = spec.local_addr or choose_interface(self.handshake.host, self.handshake.port)
        self.mirror = mirror.start(plan, self.handshake.host, self.handshake.port, self.key, self.is_head)
        peers = PeerFlags(self.handshake, lambda: int(self.logs.placement.get("group_rank", plan.node_rank or 0)), plan.nodes)
        results, restarts = run_node(plan, spec, self.logs, local_addr, rdzv_key=self.key, peers=peers)
        holds_rank0 = first_result(results) is not None
        self.node_list = self.handshake.exchange_placement(plan.nodes, holds_rank0)
        return results, restarts

    @property
    def is_head(self) -> bool:
        """The node that reports a failed or interrupted job (rank 0's node reports a finished one)."""
        if self.plan.rdzv_backend == "static":
            return (self.plan.node_rank or 0) == 0
        return self.handshake.is_host

    @property
    def files_at_head(self) -> bool:
        """Whether this node's run directory holds nothing the head lacks (launcher.backends.dispatch then removes
        an object-store run's staging folder): its files reached the head, or no rank started here to write any."""
        return self.mirror is None if self.mirrored is None else self.mirrored

    def finish(self, run_dir: Path, base: Dict[str, Any], rank0: Optional[Dict[str, Any]], status: Status,
               started: float, error: Optional[str] = None, restarts: int = 0) -> Dict[str, Any]:
        """Record this node under nodes/; write summary.json where this node speaks for the job."""
        placement = self.logs.placement
        group = placement.get("group_rank", self.plan.node_rank)
        node_name = f"node-{group}" if group is not None else f"node-{socket.gethostname()}"
        if not placement.get("ranks") and self.plan.spares:  # a hot spare the job ended without
            node_name = f"spare-{self.plan.node_rank if self.plan.node_rank is not None else socket.gethostname()}"
        record = {"status": status, "error": error, "host": socket.gethostname(), "node_rank": group,
                  "ranks": placement.get("ranks", []), "restarts": restarts}
        if isinstance(base.get("root_cause"), dict):  # this node's failed first rank: the job's, where it failed first
            record["root_cause"] = base["root_cause"]
        write_json(run_dir / NODES_DIR / f"{node_name}.json", record)  # launcher.runtime.schema.NODE
        status, error = self._job_verdict(group, status, error, record.get("root_cause"), base)
        if self.mirror is not None:  # the head waits for the others' last lines and records; they send them
            self.mirrored = self.mirror.close()
            self.mirror = None
        extra: Dict[str, Any] = {"launch_mode": self.plan.mode, "rendezvous": self.plan.rdzv_backend,
                                 "rdzv_endpoint": self.plan.rdzv_endpoint}
        if status != Status.COMPLETED and self.is_head and not self.node_list and self.handshake.store is not None:
            self.node_list = self.handshake.placements_so_far(self.plan.nodes)
        if self.node_list:
            world, nodes = describe_nodes(self.node_list)
            counts = sorted({len(n["ranks"]) for n in nodes})
            extra["node_list"] = nodes
            if len(counts) > 1:  # c10d with different --gpus per node: list them
                extra["gpus_per_node"] = [len(n["ranks"]) for n in nodes]
            if len(nodes) == self.plan.nodes:
                extra["world_size"] = world
            elif self.plan.elastic and status == Status.COMPLETED:  # the last round's nodes, however many
                extra.update(world_size=world, nodes=len(nodes))
        full = {**base, **extra}
        if (status == Status.COMPLETED and rank0 is not None) or (status != Status.COMPLETED and self.is_head):
            return finish(run_dir, full, rank0, status, started, error=error, restarts=restarts)
        summary = build_summary({**full, "status": status, "wall_s": _since(started), "restarts": restarts}, rank0)
        return summary

    def _job_verdict(self, node: Optional[int], status: Status, error: Optional[str], cause: Optional[Dict[str, Any]],
                     base: Dict[str, Any]) -> Tuple[Status, Optional[str]]:
        """On the head of a failed job: the other nodes' hang verdicts join its own (each node watches only its
        ranks, and the rank that hung may be on another machine), and the rank that failed first on any node is
        the job's root cause (base's, with that node's error). The others publish how they ended.
        A simulated job's supervisor reads every node's record itself (launcher.backends.simulated)."""
        if status == Status.COMPLETED or self.plan.mode == "simulated" or self.handshake.store is None or node is None:
            return status, error
        if not self.is_head:
            self.handshake.publish_end(node, status, error, cause)
            return status, error
        wait_s = HANG_PEERS_S if status == Status.HUNG else OTHERS_END_S
        ends = self.handshake.ends(self.plan.nodes, node, wait_s)
        hangs = {k: str(end["error"]) for k, end in ends.items() if end.get("status") == Status.HUNG}
        if hangs:
            return Status.HUNG, nodes_verdict({node: str(error), **hangs})
        causes = {node: cause, **{k: ROOT_CAUSE.read(end.get("root_cause")) or None for k, end in ends.items()}}
        first = first_cause(causes.values())
        found = next((k for k, c in causes.items() if first is not None and c is first), node)
        if found != node and first is not None:  # another node's rank failed first: this node's failed on it gone
            base["root_cause"] = first
            error = str(ends[found].get("error") or error)
        return status, error


def rdzv_key(plan: LaunchPlan) -> Optional[bytes]:
    """The job's rendezvous secret (launcher.config.rdzv_secret); without one, a warning that says what is open.

    Simulated nodes all run on this machine, on loopback: their secret is the one the launcher that
    started them made (it comes on stdin, with the plan).
    """
    if plan.mode not in ("static", "c10d"):
        return None
    key = read_rdzv_secret(plan.rdzv_secret_file, os.environ)
    if key is None:
        log.warning(f"no rendezvous secret: anyone who can reach {plan.rdzv_endpoint} can join this job or read and "
                    f"rewrite its rendezvous; give every node the same secret with --rdzv-secret-file PATH or "
                    f"{env.RDZV_SECRET} (docs/security.md)")
    return key


def meet(plan: LaunchPlan) -> NodeSession:
    """The backend interface (launcher.backends.dispatch): meet the other nodes before the run directory is touched.

    A node started with other settings, or a second node with the same --node-rank, is named here on every
    node (exit 2), not by the run directory's lock (launcher.runlock) of whichever node came second.
    """
    setup_launcher_logging(None)  # the console, until the run directory has its log file
    session = NodeSession(plan)
    session.meet()
    return session


def run(cfg: Config, plan: LaunchPlan, started: float, session: Optional[NodeSession] = None) -> int:
    """The backend interface (launcher.backends.dispatch): this machine's node of the job."""
    return local.run(cfg, plan, started, session if session is not None else NodeSession(plan))


def _since(started: float) -> float:
    return time.time() - started


def plan_from_dict(data: Dict[str, Any], node_rank: int) -> LaunchPlan:
    fields = dict(data, node_rank=node_rank)
    for key in ("command", "notices"):
        fields[key] = tuple(fields.get(key) or ())
    return LaunchPlan(**fields)


def main(argv: List[str]) -> int:
    """Entry point of a simulated node process: `python -m launcher.backends.node RUN_DIR K PARENT_PID`."""
    run_dir, node_rank, parent = argv[0], int(argv[1]), int(argv[2])
    if not die_with_parent(parent):  # the launcher that started this node is gone: so is this node, and its workers
        return 1
    payload = json.loads(sys.stdin.read())
    cfg, plan = from_dict(payload["config"]), plan_from_dict(payload["plan"], node_rank)
    if plan.start_method == "fork":
        Zygote.start("trainer" if cfg.script.path is None else "script")  # imports while the nodes meet
    setup_launcher_logging(Path(run_dir) / "logs" / f"node-{node_rank}.log")
    for handler in log.handlers:
        if handler.formatter is not None and (handler.formatter._fmt or "").startswith("[launcher]"):
            handler.setFormatter(logging.Formatter(f"[launcher node {node_rank}] %(message)s"))
    os.environ[env.START_TIME] = repr(payload["started"])
    try:
        own_key = str(payload.get("rdzv_secret") or "").encode() or None
        return local.run_and_summarize(cfg, plan, float(payload["started"]), NodeSession(plan, own_key))
    except LauncherError as e:
        print(f"error: node {node_rank}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
