"""Multi-node on one machine: start every node agent as its own process and supervise them.

`python -m launcher --nodes 2 --gpus 2` with no address runs node 0 and node 1 here, each a
`python -m launcher.backends.node` process in its own process group, meeting on a free loopback port.
This module is the one place that starts node processes: if one fails the others are stopped;
Ctrl-C and SIGTERM stop them all; a node outlives neither the launcher nor its stop.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher import interrupts
from launcher.agent.watchdog import nodes_verdict
from launcher.backends.addresses import free_port
from launcher.agent.stores import listening_store
from launcher.backends.children import zygote_module_command
from launcher.config.rendezvous import split_endpoint
from launcher.config.schema import Config, to_dict
from launcher.errors import ConfigError, HangError, WorkerFailedError
from launcher.plan import LaunchPlan
from launcher.rundir import (finish, first_failed_node, one_line_summary, prepare_run_dir, read_json, read_node_record,
                             summary_base)
from launcher.runtime.schema import Status

log = logging.getLogger("launcher")
STOP_GRACE_S = 45.0  # a node's agent may wait 30 s for workers stuck in init (they ignore SIGTERM) before it kills them
POLL_S = 0.2
# After one node caught a hang, the others get this long to catch theirs (their own ranks' stacks, and the
# rank that caused it may be theirs) before they are stopped: each node's watchdog judges only its ranks.
HANG_PEERS_S = 30.0


def pick_port() -> int:
    return free_port()


def run(cfg: Config, plan: LaunchPlan, started: float) -> int:
    """The backend interface (launcher.backends.dispatch): every node here, each its own process."""
    prepare_run_dir(cfg, plan, started)
    interrupts.release()  # the run directory is whole (launcher.backends.dispatch records a stop from here)
    elastic = f" (elastic: the job goes on while {plan.min_nodes} remain)" if plan.elastic else ""
    spares = f" and {plan.spares} hot spare{'s' if plan.spares > 1 else ''}" if plan.spares else ""
    log.info(f"simulating {plan.nodes} nodes{spares} on this machine: {plan.agents} node agents as separate processes{elastic}, "
             f"{plan.rdzv_backend} rendezvous on {plan.rdzv_endpoint}")
    # the nodes sign their handshake with a fresh secret (loopback is open to every local user); it goes
    # to them on stdin, with the plan: never into a file, an argument or an environment
    payload = json.dumps({"config": to_dict(cfg), "plan": plan.to_dict(), "started": started,
                          "rdzv_secret": secrets.token_hex(32)})
    kind = "trainer" if cfg.script.path is None else "script"  # the nodes' zygotes import for it as they start
    supervisor = NodeSupervisor(plan, payload, kind if plan.start_method == "fork" else None)
    # an elastic job's rendezvous store lives here, not in a node: whichever node is lost, the others re-form
    store = listening_store("127.0.0.1", split_endpoint(plan.rdzv_endpoint)[1], plan.rdzv_timeout_s) if plan.elastic else None
    try:
        code = supervisor.run()
    finally:
        del store
    return report(cfg, plan, started, code, supervisor.failed_node)


class NodeSupervisor:
    """Starts the node processes, watches them, stops them all when one fails or a signal arrives."""

    def __init__(self, plan: LaunchPlan, payload: str, zygote_kind: Optional[str] = None) -> None:
        self.plan, self.payload, self.zygote_kind = plan, payload, zygote_kind
        self.procs: List[subprocess.Popen] = []
        self.signal: Optional[int] = None
        self.failed_node: Optional[int] = None
        self.lost: List[int] = []  # an elastic job's nodes that ended while at least MIN others went on

    def run(self) -> int:
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for k in range(self.plan.agents):
                self.procs.append(self._start(k))
            return self._watch()
        finally:
            self._stop_all()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _start(self, k: int) -> subprocess.Popen:
        proc = subprocess.Popen(
            zygote_module_command("launcher.backends.node", self.zygote_kind, self.plan.run_dir, str(k), str(os.getpid())),
            stdin=subprocess.PIPE, env=dict(os.environ), text=True, start_new_session=True,  # own group: we decide its stop
        )
        assert proc.stdin is not None
        proc.stdin.write(self.payload)
        proc.stdin.close()
        return proc

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.signal is None:
            self.signal = signum
            for proc in self.procs:
                _stop(proc, signum)

    def _watch(self) -> int:
        while True:
            codes = [p.poll() for p in self.procs]
            if self.signal is not None:
                self._wait_all(STOP_GRACE_S)
                return 128 + self.signal
            for k, code in enumerate(codes):
                if code not in (None, 0) and k not in self.lost:
                    if self._goes_on_without(k, code, codes):
                        continue
                    self.failed_node = k
                    if read_node_record(Path(self.plan.run_dir), k).get("status") == Status.HUNG:
                        log.info(f"node {k} caught a hang; waiting up to {HANG_PEERS_S:g}s for the other nodes' watchdogs")
                        self._wait_all(HANG_PEERS_S)
                    log.info(f"node {k} {_how_it_ended(code)}; stopping the other nodes")
                    for proc in self.procs:
                        _stop(proc, signal.SIGTERM)
                    self._wait_all(STOP_GRACE_S)
                    return code
            if all(code == 0 for k, code in enumerate(codes) if k not in self.lost):
                return 0
            time.sleep(POLL_S)

    def _goes_on_without(self, k: int, code: int, codes: List[Optional[int]]) -> bool:
        """An elastic job loses node k and goes on while at least MIN nodes remain (torch's agents re-form it)."""
        left = sum(1 for j, c in enumerate(codes) if c is None and j != k)
        least = self.plan.min_nodes or self.plan.nodes
        if not self.plan.elastic or left < least or code == ConfigError.exit_code:
            return False  # exit 2: the node refused (bad input, a store value not the job's), so would the others
        self.lost.append(k)
        if self.plan.spares:
            running = min(left, self.plan.nodes)
            log.info(f"node {k} (pid {self.procs[k].pid}) {_how_it_ended(code)}; {left} node agents remain (the job "
                     f"runs on {self.plan.nodes}, the rest are spares): the job goes on on {running} without it")
        else:
            log.info(f"node {k} (pid {self.procs[k].pid}) {_how_it_ended(code)}; {left} of at least {least} "
                     f"(--nodes {least}:{self.plan.nodes}) remain: the job goes on without it")
        return True

    def _wait_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def _stop_all(self) -> None:
        """Nothing outlives the launcher: whatever is left in a node's process group is killed."""
        for proc in self.procs:
            _signal_group(proc, signal.SIGKILL)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _stop(proc: subprocess.Popen, signum: int) -> None:
    """Ctrl-C reaches a terminal's whole foreground group, so each node's group gets SIGINT; SIGTERM goes
    to the node's agent alone, which stops its workers itself (as a service manager would)."""
    if signum == signal.SIGINT:
        _signal_group(proc, signum)
    elif proc.poll() is None:
        proc.send_signal(signum)


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """Signal the process group we created for this node (start_new_session), and only that."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def report(cfg: Config, plan: LaunchPlan, started: float, code: int, failed_node: Optional[int]) -> int:
    """Node 0 wrote summary.json for a finished job; for a failed or stopped one, say what happened."""
    run_dir = Path(plan.run_dir)
    summary_path = run_dir / "summary.json"
    finished = summary_path.exists() if code == 0 else code >= 128 and _completed_since(summary_path, started)
    if finished:  # node 0 wrote it: a stop that came after the last step ends "completed" too
        interrupts.settled()
        log.info(one_line_summary(read_json(summary_path), run_dir))
        return 0
    base = {**summary_base(cfg, plan), **_what_the_nodes_knew(summary_path, started),
            "launch_mode": plan.mode, "rendezvous": plan.rdzv_backend, "rdzv_endpoint": plan.rdzv_endpoint}
    restarts = base.pop("restarts", 0)
    if code >= 128:
        finish(run_dir, base, None, Status.INTERRUPTED, started, restarts=restarts)
        log.info(f"stopped by signal {code - 128}; run directory {run_dir}")
        return code
    hangs = _hangs(run_dir, plan.nodes)
    # the node whose rank failed first names the job's root cause (read back, its shape checked): not node 0's rank
    # that failed on the peer gone, nor nothing where node 0 was stopped before it saw one fail
    first = first_failed_node(run_dir, plan.nodes)
    failed_node = failed_node if first is None else first
    cause = read_node_record(run_dir, failed_node).get("root_cause")
    if cause is not None:
        base["root_cause"] = cause
    error = hangs or _node_error(run_dir, failed_node) or f"node {failed_node} {_how_it_ended(code)}"
    finish(run_dir, base, None, Status.HUNG if hangs else Status.FAILED, started, error=error, restarts=restarts)
    if code == 2:
        return 2  # the node printed its one-line usage error already
    raise (HangError if hangs else WorkerFailedError)(error)


def _completed_since(summary_path: Path, started: float) -> bool:
    """Node 0 wrote a "completed" summary.json in this launch (a resumed run's directory holds an older one)."""
    try:
        return summary_path.stat().st_mtime >= started and read_json(summary_path).get("status") == Status.COMPLETED
    except (OSError, ValueError):
        return False


def _what_the_nodes_knew(summary_path: Path, started: float) -> Dict[str, Any]:
    """From the summary the head node wrote as it stopped in this launch (if it could): who ran which ranks, restarts.

    A resumed run's directory holds the earlier launch's summary: older than this launch, it says nothing of it.
    """
    try:
        if summary_path.stat().st_mtime < started:
            return {}
        written = read_json(summary_path)
    except (OSError, ValueError):
        return {}
    return {k: written[k] for k in ("node_list", "world_size", "gpus_per_node", "restarts", "root_cause") if k in written}


def _how_it_ended(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _node_error(run_dir: Path, node: Optional[int]) -> Optional[str]:
    error = read_node_record(run_dir, node).get("error")
    return f"node {node}: {error}" if error else None


def _hangs(run_dir: Path, nodes: int) -> Optional[str]:
    """Every node's hang verdict, node by node: 'node 0: hang: ... | node 1: hang: ...' (None if no node hung)."""
    records = {k: read_node_record(run_dir, k) for k in range(nodes)}
    found = {k: str(r.get("error")) for k, r in records.items() if r.get("status") == Status.HUNG}
    return nodes_verdict(found) or None
