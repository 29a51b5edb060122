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
from typing import Any, Dict, Optional

from launcher.runtime import env, safefs
from launcher.runtime.goodput import DIR, launch_key

log = logging.getLogger("launcher")


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
