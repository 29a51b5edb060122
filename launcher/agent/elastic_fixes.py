"""Workarounds for torch's elastic agent that need no private name of torch, each with the torch versions it is
known for (all open as of torch 2.15; tests/test_torch_private.py shows each bug on the installed torch, so a
torch that fixes one fails that test, and the workaround is then gated to the versions before it).

- The static rendezvous (--nodes N on one machine, SLURM, Ray, --master-addr) keeps one store, at
  --master-port, for the agents and the workers of every attempt: restarted workers read the dead
  attempt's gloo addresses there and fail ("Gloo connectFullMesh failed ... Connection refused": 2 of
  3 `--nodes 2 --max-restarts 1` restarts on torch 2.13). Each restart's workers get a store of their own
  instead, started by node 0's agent, its port passed to the other agents through the agents' store.

The workarounds that override torch's classes live with the other private names in launcher.runtime.torch_private
(a store per c10d round, pytorch#135712; a rendezvous shutdown after a signal cut the keep-alive timer's start).
"""

from __future__ import annotations

import datetime
from typing import Any

from launcher.agent.stores import listening_store

RESTART_STORE_KEY = "launcher/workers-store/restart-{}"


def restart_workers_store(worker_group: Any, restart: int, timeout_s: float) -> Any:
    """A restart of a static rendezvous: point its workers at a store of their own (see above).

    Node 0's agent starts it on the workers' master address and returns it (keep it while they run);
    the other agents read its port from the agents' store, waiting up to timeout_s, and return None.
    """
    key = RESTART_STORE_KEY.format(restart)
    store = None
    if worker_group.group_rank == 0:
        store = listening_store(worker_group.master_addr, 0, timeout_s)
        worker_group.store.set(key, str(store.port))
        port = store.port
    else:
        worker_group.store.wait([key], datetime.timedelta(seconds=timeout_s))
        text = worker_group.store.get(key).decode("ascii", "replace")
        if not text.isdigit() or not 0 < int(text) < 65536:
            raise RuntimeError(f"the workers' store port for restart {restart} read back as {text[:40]!r}")
        port = int(text)
    worker_group.master_port = port
    return store
