"""The rendezvous handler of this node's agent: torch's static one from its registry, or torch's c10d one built here
(its create_handler, step by step) as our subclass: a fresh workers' store each round, on this node's address alone
(launcher.runtime.torch_private.rendezvous_handler_class), and, where the job has a secret, its state signed
(launcher.agent.signed_rdzv)."""

from __future__ import annotations

import inspect
import logging
from datetime import timedelta
from typing import Any, Dict, Optional

from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout

from launcher.agent.signed_rdzv import SignedBackend
from launcher.agent.stores import listening_store
from launcher.runtime import torch_private

log = logging.getLogger("launcher")
_HANDLER_CLASS: Any = None  # torch_private.rendezvous_handler_class(), made once
REFORM_LAST_CALL_S = 2.0  # a round after the first waits this long for more nodes, not last_call_timeout (30 s)


class ReformingTimeout(RendezvousTimeout):
    """torch's rendezvous timeouts, with the wait for more nodes once MIN are in (last_call) cut to REFORM_LAST_CALL_S
    at every round after this node's first (formed(), after each round). The first round waits the whole last call,
    so that nodes started together start together; a later round is one the job's nodes come back to on their own
    (a failure, a lost node, a node waiting to join), each within a second or so of its workers stopping, and a
    node later than that joins the round after (one restart), where the whole last call was 30 s of a job stopped."""

    def __init__(self, *timeouts: Optional[timedelta]) -> None:
        super().__init__(*timeouts)
        self.rounds = 0

    @property
    def last_call(self) -> timedelta:
        whole = super().last_call
        return min(whole, timedelta(seconds=REFORM_LAST_CALL_S)) if self.rounds else whole

    def formed(self) -> None:
        self.rounds += 1


def rendezvous_handler(backend: str, endpoint: str, run_id: str, min_nodes: int, max_nodes: int,
                       local_addr: Optional[str], configs: Dict[str, Any], key: Optional[bytes] = None,
                       own_secret: bool = False) -> Any:
    """The handler torch's launch_agent would get from its registry for these parameters, c10d's as said above.
    key: the job's rendezvous secret (own_secret: made by this process, for a job on this machine alone)."""
    params = RendezvousParameters(backend=backend, endpoint=endpoint, run_id=run_id, min_nodes=min_nodes,
                                  max_nodes=max_nodes, local_addr=local_addr, **configs)
    if backend != "c10d":
        return get_rendezvous_handler(params)
    state: Any
    state, store = create_backend(params)
    if key:
        state = SignedBackend(state, key, params.endpoint, params.run_id, store=store, own_secret=own_secret)
    return c10d_handler(store, state, params)


def c10d_handler(store: Any, state: Any, params: RendezvousParameters) -> Any:
    """torch's dynamic_rendezvous.create_handler(store, state, params), as our handler class: the same options,
    read the same way (torch 2.10 to 2.15; cas_backoff_max_seconds from 2.15)."""
    global _HANDLER_CLASS
    if _HANDLER_CLASS is None:
        _HANDLER_CLASS = torch_private.rendezvous_handler_class(listening_store, _dropped)
    timeout = ReformingTimeout(*(_seconds(params, f"{name}_timeout") for name in ("join", "last_call", "close",
                                                                                   "heartbeat")))
    options: Dict[str, Any] = {"keep_alive_interval": params.get_as_int("keep_alive_interval", 5),
                               "keep_alive_max_attempt": params.get_as_int("keep_alive_max_attempt", 3)}
    if "cas_backoff_max_seconds" in inspect.signature(_HANDLER_CLASS.from_backend).parameters:
        options["cas_backoff_max_seconds"] = float(params.get("cas_backoff_max_seconds", 0.0))
    return _HANDLER_CLASS.from_backend(params.run_id, store, state, params.min_nodes, params.max_nodes,
                                       params.local_addr, timeout, **options)


def _dropped(addr: str) -> None:
    log.warning(f"this node ({addr}) missed its rendezvous keep-alives (its agent stalled, or its clock is behind the "
                "store host's by more than keep_alive_interval x keep_alive_max_attempt): the job's round went on "
                "without it, so its workers stop and it joins the next round")


def _seconds(params: RendezvousParameters, key: str) -> Optional[timedelta]:
    value = params.get_as_int(key)
    return None if value is None else timedelta(seconds=value)
