"""Which nodes formed each round of an elastic job's c10d rendezvous, as the node agents saw them.

Each agent writes one small record per round it took part in, ``goodput/<launch>-round-<round>.json``
(the first node to write a round wins: every participant saw the same round), with the round's nodes
(``host:pid`` of each node agent, as torch names them) and the job's world size. Consecutive rounds
with other nodes are the job's membership changes: goodput reads them (launcher.runtime.goodput
membership_changes), counts the time they cost as their own cause, and lists them in summary.json.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from datetime import timedelta
from typing import Any, Dict, Optional

from launcher.runtime import env, safefs
from launcher.runtime.goodput import DIR, launch_key

log = logging.getLogger("launcher")
RESTARTS_WAIT_S = 10.0  # how long a round's agents wait for each other's restart counts (they all just met)


def record_round(run_dir: str, worker_group: Any, seen: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """Write the record of the round seen ({round, nodes}: launcher.runtime.torch_private.rendezvous_round; None on
    a static rendezvous), once per round across the nodes; returns it. Never raises: a record lost costs the
    summary's list of changes, not the job."""
    started = os.environ.get(env.START_TIME)
    if seen is None or started is None:
        return None
    world = worker_group.workers[0].world_size if worker_group.workers else 0
    record = {**seen, "at": time.time(), "world_size": world}
    path = Path(run_dir) / DIR / f"{launch_key(float(started))}-round-{seen['round']}.json"
    try:
        fd = safefs.open_fd(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, root=run_dir)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
    except OSError as e:  # another node's record of this round (or a full disk)
        log.debug(f"round record {path.name} not written: {e!r}")
    return record


def job_restarts(worker_group: Any, round_: int, mine: int) -> int:
    """The job's restart count in a round after the first: the most any of its nodes made. A node that joined later
    (a hot spare taking a lost node's place) made none, and its ranks would see TORCHELASTIC_RESTART_COUNT=0 beside
    ranks that see 1 (a script that loads its checkpoint when the count is above 0 would then diverge). Each agent
    says its count on the round's store and takes the highest; never raises (mine, if the others do not answer)."""
    if round_ <= 0 or worker_group.store is None:
        return mine
    keys = [f"launcher/restarts/{round_}/{k}" for k in range(worker_group.group_world_size)]
    try:
        worker_group.store.set(keys[worker_group.group_rank], str(mine))
        worker_group.store.wait(keys, timedelta(seconds=RESTARTS_WAIT_S))
        said = [int(worker_group.store.get(k)) for k in keys]  # a store on an open port: counts past MAX are not ours
        return max([mine, *(n for n in said if 0 <= n <= worker_group.spec.max_restarts)])
    except (RuntimeError, ValueError, TimeoutError) as e:  # a node gone again: the next round says
        log.debug(f"reading the other nodes' restart counts failed: {e!r}")
        return mine
