"""Which nodes formed each round of an elastic job's c10d rendezvous, as the node agents saw them.

Each agent writes one small record per round it took part in, ``goodput/<launch>-round-<round>.json``
(the first node to write a round wins: every participant saw the same round), with the round's nodes
(``host:pid`` of each node agent, as torch names them) and the job's world size. Consecutive rounds
with other nodes are the job's membership changes: goodput reads them (launcher.trainers.metrics.goodput
membership_changes), counts the time they cost as their own cause, and lists them in summary.json.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional

from launcher.runtime import env, safefs
from launcher.trainers.metrics.goodput import DIR, launch_key

log = logging.getLogger("launcher")


def round_nodes(rdzv_handler: Any) -> Optional[Dict[str, Any]]:
    """{round, nodes} of the round the handler just completed; None where it keeps no such state (static)."""
    holder = getattr(rdzv_handler, "_state_holder", None)
    state = getattr(holder, "state", None)
    participants = getattr(state, "participants", None)
    if state is None or not isinstance(participants, dict):
        return None
    nodes = sorted(f"{desc.addr}:{desc.pid}" for desc in participants)
    return {"round": int(getattr(state, "round", 0)), "nodes": nodes}


def record_round(run_dir: str, worker_group: Any) -> Optional[Dict[str, Any]]:
    """Write this round's record (once per round across the nodes); returns it. Never raises: a record lost
    costs the summary's list of changes, not the job."""
    seen = round_nodes(worker_group.spec.rdzv_handler)
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
