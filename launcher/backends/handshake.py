"""The nodes' handshake: before torch's elastic agent starts, every node checks in on a TCPStore at the
rendezvous address, so a wrong address, a mismatched --nodes/--gpus or a duplicate --node-rank is named
within --rdzv-timeout instead of hanging. When its workers start, each node publishes where its ranks
run; after the job, the node that writes summary.json collects the list.

The store is created multi-tenant on the rendezvous port: torch's static and c10d rendezvous create
theirs the same way, so in the hosting process they share this one server (one port, no second one).
With launcher.backends.addresses, this module owns every socket the launcher opens itself, but for the
watchdog's own client of this store (launcher.backends.peer_flags).

With a rendezvous secret (docs/security.md), every value written here is signed and every value
read is verified (launcher.agent.signing): a node given another secret is named, on every node. The
nodes of a simulated job get a fresh secret from the launcher that starts them.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import secrets
import socket
import sys
import tempfile
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from launcher.agent import signing
from launcher.agent.stores import listening_store
from launcher.backends.addresses import is_local, port_is_free, require_free_port
from launcher.errors import ConfigError, RendezvousAuthError, RendezvousError
from launcher.config.rendezvous import split_endpoint
from launcher.runtime import env
from launcher.runtime.schema import Status

log = logging.getLogger("launcher")
POLL_S = 0.1
PLACEMENT_WAIT_S = 30.0  # after a finished job, how long nodes wait for each other's rank lists
FAILED_PLACEMENT_WAIT_S = 3.0  # after a failed one, for a node between taking its slot and writing it


@contextlib.contextmanager
def native_stderr_to_log() -> Iterator[None]:
    """c10d's C++ layer prints every connect retry with a stack trace; keep that in the log file only."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace").strip()
            if text:
                log.debug("c10d while connecting:\n%s", text)


class NodeHandshake:
    """One node's side of the handshake; keep it alive for the whole job (it may host the store)."""

    def __init__(self, plan: Any, node_rank: Optional[int], key: Optional[bytes] = None,
                 own_secret: bool = False) -> None:
        self.plan = plan
        self.key = key  # the job's rendezvous secret: None signs nothing
        self.own_secret = own_secret  # made by the launcher for nodes on this machine alone: a stranger wrote it
        self.node_rank = node_rank
        self.host, self.port = split_endpoint(plan.rdzv_endpoint)
        self.timeout_s = plan.rdzv_timeout_s
        self.token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.is_host = False
        self.store: Any = None
        self._raw: Any = None
        self._slot: Optional[int] = None  # this node's index among the published placements
        self._record: Dict[str, Any] = {}

    # -- connecting -------------------------------------------------------------------------
    def connect(self) -> None:
        """Host the store (static node 0; c10d: whoever gets the port first on its machine) or join it."""
        from torch.distributed import PrefixStore

        if self.plan.rdzv_backend == "static":
            self.is_host = (self.node_rank or 0) == 0
            if self.is_host:
                require_free_port(self.port)
            self._raw = self._host() if self.is_host else self._join()
        else:
            self._raw = None
            if is_local(self.host) and port_is_free(self.port):
                try:
                    self._raw, self.is_host = self._host(), True
                except RuntimeError:  # another node on this machine got the port first
                    self._raw = None
            if self._raw is None:
                self._raw = self._join()
        self.store = PrefixStore(f"launcher/{self.plan.rdzv_id}/", self._raw)

    def _host(self) -> Any:
        """The store on the rendezvous address alone (launcher.agent.stores), not on every interface."""
        try:
            return listening_store(self.host, self.port, self.timeout_s)
        except OSError as e:
            if e.errno != errno.EADDRNOTAVAIL:
                raise RuntimeError(f"cannot listen on {self.host}:{self.port}: {e}") from e
            flag = "--master-addr" if self.plan.rdzv_backend == "static" else "--rdzv-endpoint"
            raise ConfigError(f"{flag} {self.host} is not an address of this machine, which hosts the rendezvous: "
                              "give the address of one of its interfaces (`ip -br addr`)") from e

    def _join(self) -> Any:
        from torch.distributed import TCPStore

        try:
            with native_stderr_to_log():
                return TCPStore(self.host, self.port, is_master=False,
                                timeout=datetime.timedelta(seconds=self.timeout_s))
        except (RuntimeError, TimeoutError, ValueError) as e:
            raise RendezvousError(self._no_answer()) from e

    def _no_answer(self) -> str:
        head = "node 0 (--node-rank 0)" if self.plan.rdzv_backend == "static" else "the node hosting the rendezvous"
        return (f"no answer from {self.host} port {self.port} within {self.timeout_s}s: check that {head} is "
                f"running with the same --nodes, --gpus and port, that {self.host} is its address on an interface "
                f"this machine can reach, and that no firewall blocks TCP port {self.port}")

    # -- before the job ---------------------------------------------------------------------
    def meet(self, nodes: int, gpus: int, min_nodes: Optional[int] = None, spares: int = 0) -> None:
        """Check in and wait until all nodes have, or raise naming the problem (never hang).

        min_nodes: an elastic job's (fewer than nodes): nodes come and go, so this node checks its settings
        against the first node's and goes on; torch's c10d rendezvous waits for MIN of them. spares: hot spares
        beyond nodes, which check in the same way (torch keeps them waiting until a node is lost)."""
        same_workers = self.plan.rdzv_backend == "static"
        elastic = (min_nodes is not None and min_nodes < nodes) or spares > 0
        me = {"token": self.token, "host": socket.gethostname(), "nodes": f"{min_nodes}:{nodes}" if elastic else nodes,
              "gpus": gpus, "node_rank": self.node_rank}
        try:
            self.store.add("connected", 1)
            problem = self._check_in(me, same_workers)
            if problem is None and self.store.add("arrivals", 1) > nodes and not elastic:
                problem = (f"more than --nodes {nodes} nodes joined {self.host}:{self.port}: "
                           "a node was started twice, or with a wrong --nodes")
            if problem is not None:
                self.store.compare_set("verdict", "", self.signed("verdict", problem))
                raise ConfigError(problem)
            if not elastic:
                self._wait_for_all(nodes)
        except RendezvousAuthError as e:
            self._tell(str(e))
            self._stay_until_told()
            raise
        except ConfigError:
            self._stay_until_told()
            raise
        except (RuntimeError, TimeoutError) as e:
            raise RendezvousError(f"lost contact with {self.host}:{self.port} during the node handshake "
                                  f"({e.__class__.__name__}): see the other nodes' output") from e

    def _tell(self, problem: str) -> None:
        """The other nodes learn there is a stranger at the rendezvous (signed: it is this node that says so)."""
        try:
            self.store.compare_set("verdict", "", self.signed("verdict", problem))
        except (RuntimeError, TimeoutError):
            pass

    def _stay_until_told(self) -> None:
        """The host keeps the store up (a few seconds at most) until every node has read the verdict."""
        try:
            self.store.add("told", 1)
            deadline = time.monotonic() + 5.0
            while self.is_host and time.monotonic() < deadline:
                if self.store.add("told", 0) >= self.store.add("connected", 0):
                    return
                time.sleep(POLL_S)
        except (RuntimeError, TimeoutError):
            pass

    def _check_in(self, me: Dict[str, Any], same_workers: bool) -> Optional[str]:
        first = self.verified_json("reference", self.store.compare_set("reference", "", self.signed("reference", json.dumps(me))))
        if first["token"] != me["token"]:
            if first["nodes"] != me["nodes"] or (same_workers and first["gpus"] != me["gpus"]):
                return (f"node settings differ: {_who(first)} was started with --nodes {first['nodes']} --gpus "
                        f"{first['gpus']}, {_who(me)} with --nodes {me['nodes']} --gpus {me['gpus']}: "
                        "start every node with the same --nodes and --gpus")
        if self.node_rank is not None:
            name = f"rank/{self.node_rank}"
            holder = self.verified_json(name, self.store.compare_set(name, "", self.signed(name, json.dumps(me))))
            if holder["token"] != me["token"]:
                return (f"two nodes use --node-rank {self.node_rank} ({_who(holder)} and {_who(me)}): "
                        "give each machine its own --node-rank in 0..N-1")
        return None

    def _wait_for_all(self, nodes: int) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            if self.store.check(["verdict"]):
                raise ConfigError(self._load("verdict", self.store.get("verdict")).decode())
            arrived = self.store.add("arrivals", 0)
            if arrived >= nodes:
                return
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"only {arrived} of {nodes} nodes reached {self.host}:{self.port} within {self.timeout_s}s: "
                    "start the other nodes (same --nodes, --gpus and address), or check their network and firewall")
            time.sleep(POLL_S)

    # -- after the job ----------------------------------------------------------------------
    def publish_placement(self, placement: Dict[str, Any]) -> None:
        """Say where this node's ranks run (launcher.agent.logs_specs calls it as the workers start, again
        on a restart). Never raises: a lost store costs the node list, not the job."""
        self._record = {**placement, "host": socket.gethostname(), "workers": len(placement.get("ranks", [])),
                        "at": time.time()}
        try:
            if self._slot is None:
                self._slot = self.store.add("placed", 1)
            name = f"placement/{self._slot}"
            self.store.set(name, self.signed(name, json.dumps(self._record)))
        except (RuntimeError, TimeoutError, AttributeError) as e:
            log.debug(f"publishing this node's placement failed: {e!r}")

    def exchange_placement(self, nodes: int, holds_rank0: bool) -> List[Dict[str, Any]]:
        """After a finished job: the node with rank 0 gets the whole list.

        The host keeps the store up until that node has read it (bounded: a vanished node costs
        PLACEMENT_WAIT_S, never a hang).
        """
        try:
            found: List[Dict[str, Any]] = [self._record]
            if holds_rank0:
                if self.plan.elastic:  # the nodes of the last round, each placed when its workers started
                    placed = self.store.add("placed", 0)  # with a node that took a lost one's place: more
                    found = current_round(self._collect(placed, FAILED_PLACEMENT_WAIT_S), self._record)
                else:
                    found = self._collect(nodes, PLACEMENT_WAIT_S)
                self.store.set("collected", "1")
            elif self.is_host:
                self._wait_key("collected")
        except (RuntimeError, TimeoutError, RendezvousAuthError) as e:
            log.debug(f"node list exchange failed: {e!r}")
            return [self._record]  # the other side is gone; report what this node knows
        return sorted(found, key=lambda r: r.get("group_rank", 0))

    def placements_so_far(self, nodes: int) -> List[Dict[str, Any]]:
        """After a failed or stopped job: what the nodes published when their workers started. A node
        whose workers never started is missing, and nobody waits for it."""
        try:
            placed = min(nodes, self.store.add("placed", 0))
            found = self._collect(placed, FAILED_PLACEMENT_WAIT_S) if placed else []
        except (RuntimeError, TimeoutError, AttributeError, RendezvousAuthError) as e:
            log.debug(f"reading the nodes' placements failed: {e!r}")
            found = [self._record] if self._record else []
        return sorted(found, key=lambda r: r.get("group_rank", 0))

    def publish_end(self, node: int, status: Status, error: Optional[str], root_cause: Optional[Dict[str, Any]] = None) -> None:
        """How this node's part ended, for the head node's verdict (a hang on node 1 named on node 0; the rank that
        failed first, on whichever node). Never raises."""
        try:
            end = json.dumps({"status": status, "error": error, "root_cause": root_cause})
            self.store.set(f"end/{node}", self.signed(f"end/{node}", end))
        except (RuntimeError, TimeoutError, AttributeError) as e:
            log.debug(f"publishing how this node ended failed: {e!r}")

    def ends(self, nodes: int, me: int, wait_s: float) -> Dict[int, Dict[str, Any]]:
        """How the other nodes ended, waiting up to wait_s for all of them (a node that vanished never says)."""
        keys = {k: f"end/{k}" for k in range(nodes) if k != me}
        deadline = time.monotonic() + wait_s
        try:
            if self.store.add("placed", 0) < 2:  # no other node started workers: none has anything to say
                return {}
            while not self.store.check(list(keys.values())) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            return {k: self.verified_json(key, self.store.get(key)) for k, key in keys.items() if self.store.check([key])}
        except (RuntimeError, TimeoutError, AttributeError, ValueError, RendezvousAuthError) as e:
            log.debug(f"reading how the other nodes ended failed: {e!r}")
            return {}

    def _collect(self, nodes: int, wait_s: float) -> List[Dict[str, Any]]:
        keys = [f"placement/{i}" for i in range(1, nodes + 1)]
        deadline = time.monotonic() + wait_s
        # a node takes its index, then writes its record: wait for the records, not the count
        while not self.store.check(keys) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        return [self.verified_json(k, self.store.get(k)) for k in keys if self.store.check([k])]

    def _wait_key(self, key: str) -> None:
        deadline = time.monotonic() + PLACEMENT_WAIT_S
        while not self.store.check([key]) and time.monotonic() < deadline:
            time.sleep(POLL_S)

    def close(self) -> None:
        self.store = self._raw = None

    # -- signed values ----------------------------------------------------------------------
    def signed(self, name: str, text: str) -> bytes:
        """text as a value under name: signed with the job's secret where it has one (launcher.backends.peer_flags too)."""
        payload = text.encode()
        return signing.sign(self.key, self._context(name), payload) if self.key else payload

    def _load(self, name: str, blob: bytes) -> bytes:
        """A value's payload, verified where this job has a secret; RendezvousAuthError where it is not ours."""
        if self.key:
            try:
                return signing.verify(self.key, self._context(name), blob)
            except signing.SignatureError as e:
                raise RendezvousAuthError(self._not_ours(f"is not signed with this job's secret: {e}")) from None
        if signing.is_signed(blob):
            raise RendezvousAuthError(self._not_ours("is signed with a secret, and this node was given none"))
        return bytes(blob)

    def verified_json(self, name: str, blob: bytes) -> Dict[str, Any]:
        """The record a value under name holds; RendezvousAuthError where it is not signed by this job or not a record."""
        payload = self._load(name, blob)
        try:
            found = json.loads(payload)
        except ValueError:
            found = None
        if not isinstance(found, dict):
            raise RendezvousAuthError(self._not_ours("is not a launcher node's record"))
        return found

    def _context(self, name: str) -> str:
        return f"launcher/{self.plan.rdzv_id}/{name}"

    def _not_ours(self, what: str) -> str:
        if self.own_secret:
            return signing.foreign_value_message(f"{self.host}:{self.port}", f"a node handshake value {what}")
        return (f"a node handshake value at {self.host}:{self.port} {what} (a node given another secret, another "
                f"job on the same port, or tampering): give every node the same secret (--rdzv-secret-file or "
                f"{env.RDZV_SECRET}), or pick another port")


def _who(node: Dict[str, Any]) -> str:
    rank = node.get("node_rank")
    where = f"node {rank}" if rank is not None else "a node"
    return f"{where} on {node.get('host')}"


def current_round(placements: List[Dict[str, Any]], mine: Dict[str, Any]) -> List[Dict[str, Any]]:
    """An elastic job's placements of its last round (mine is one): a lost node's, or a round's before, are older
    and of another world size, or hold ranks a newer placement holds."""
    kept: List[Dict[str, Any]] = []
    for record in sorted(placements, key=lambda r: -float(r.get("at") or 0)):
        ranks = set(record.get("ranks", []))
        if record.get("world_size") == mine.get("world_size") and not any(ranks & set(k.get("ranks", [])) for k in kept):
            kept.append(record)
    return kept


def describe_nodes(placements: List[Dict[str, Any]]) -> Tuple[int, List[Dict[str, Any]]]:
    """(world size, node list) for summary.json."""
    world = sum(len(p.get("ranks", [])) for p in placements)
    return world, [{"node_rank": p.get("group_rank"), "host": p.get("host"), "ranks": p.get("ranks", [])}
                   for p in placements]
