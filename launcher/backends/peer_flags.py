"""The watchdogs' flags between the nodes of a job (launcher.agent.watchdog.Peers), on the nodes' handshake store
while the workers run: a stuck start, a hang, and each node's word that its ranks' stacks are dumped.

Every value is signed like the handshake's (launcher.backends.handshake): one not signed with the job's secret is
no flag. Every call is made from the watchdog's thread, on a store client of its own, and never raises: a store that
is gone costs the flags, never the job.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from typing import Any, Callable, Optional

from launcher.backends.handshake import POLL_S, NodeHandshake
from launcher.errors import RendezvousAuthError

log = logging.getLogger("launcher")
STUCK_START = "stuck_start"  # a node whose watchdog saw a rank wait in init_process_group too long
HANG = "hang"  # a node whose watchdog fired on a hang: {"node": k}
STACKS_DUMPED = "stacks_dumped/{}"  # node k's watchdog dumped its ranks' stacks (on its own hang or on another's)
SIDE_TIMEOUT_S = 5.0
_STORE_ERRORS = (RuntimeError, TimeoutError, ValueError, RendezvousAuthError)


class PeerFlags:
    """This node's side of the flags. node() is this node's number in the job (its group rank, once its workers
    started); nodes: how many nodes the job has (an elastic job's most)."""

    def __init__(self, handshake: NodeHandshake, node: Callable[[], int], nodes: int) -> None:
        self.handshake = handshake
        self.node = node
        self.nodes = nodes
        self._side_store: Any = None  # the watchdog thread's client; False: could not connect, or lost

    def flag_stuck_start(self) -> None:
        """Tell every node that a rank here has waited in init_process_group past watchdog.start_timeout_s:
        their ranks that never started are part of that stuck start, wherever they are."""
        self._set(STUCK_START, {"node": self.node()})

    def stuck_start_flagged(self) -> bool:
        """Whether some node has flagged a stuck start."""
        return self._get(STUCK_START) is not None

    def flag_hang(self) -> None:
        """Tell every node that this node's watchdog fired on a hang: they dump their ranks' stacks and stop too."""
        self._set(HANG, {"node": self.node()})

    def hang_flagged(self) -> Optional[int]:
        """The node whose watchdog flagged a hang, where one other than this node did (one store call while none has)."""
        found = self._get(HANG)
        node = found.get("node") if found is not None else None
        return node if isinstance(node, int) and node != self.node() else None

    def ack_hang(self) -> None:
        """Say that this node's ranks' stacks are dumped, or that it has no rank left to dump."""
        self._set(STACKS_DUMPED.format(self.node()), {"node": self.node()})

    def wait_for_acks(self, wait_s: float) -> int:
        """Wait up to wait_s for every other node whose workers started to ack; how many did not."""
        deadline = time.monotonic() + wait_s
        others = [STACKS_DUMPED.format(k) for k in range(self.nodes) if k != self.node()]
        try:
            expected = min(self.nodes, int(self._side().add("placed", 0))) - 1  # nodes that published where their ranks run
            while True:
                acked = sum(1 for name in others if self._get(name) is not None)
                if acked >= expected or time.monotonic() >= deadline or self._side_store is False:
                    return max(0, expected - acked)
                time.sleep(POLL_S)
        except _STORE_ERRORS as e:
            self._lost(e)
            return len(others)

    def _set(self, name: str, record: Any) -> None:
        try:
            self._side().set(name, self.handshake.signed(name, json.dumps(record)))
        except _STORE_ERRORS as e:
            self._lost(e)

    def _get(self, name: str) -> Optional[Any]:
        """The record under name, where one signed by this job is there; None otherwise."""
        try:
            side = self._side()
            return self.handshake.verified_json(name, side.get(name)) if side.check([name]) else None
        except RendezvousAuthError:
            return None  # not ours: no flag
        except _STORE_ERRORS as e:
            self._lost(e)
            return None

    def _lost(self, e: BaseException) -> None:
        """A store that failed once is not asked again: each poll would wait on it (the host node gone)."""
        if self._side_store is not False:
            log.debug(f"watchdog: the nodes' store is out of reach, no more flags between nodes: {e!r}")
        self._side_store = False

    def _side(self) -> Any:
        """A second client of the store, the watchdog thread's own: the main thread's stays free for its calls."""
        if self._side_store is None:
            from torch.distributed import PrefixStore, TCPStore

            self._side_store = False
            raw = TCPStore(self.handshake.host, self.handshake.port, is_master=False,
                           timeout=datetime.timedelta(seconds=SIDE_TIMEOUT_S))
            self._side_store = PrefixStore(f"launcher/{self.handshake.plan.rdzv_id}/", raw)
        if self._side_store is False:
            raise RuntimeError("no connection to the nodes' store")
        return self._side_store
